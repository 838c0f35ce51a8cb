"""Drawing the requests of a workload (`simulator.specs.workload`): lengths from the datasets,
arrivals, traces, ShareGPT files and shared content. Pure and deterministic given the numpy
Generator; nothing is simulated here."""
