"""Running what-ifs: a scenario (`runner`), `bench latency` analytically (`latency`), energy and
cost of a run (`energy`), sweeps on a process pool or Ray (`sweeps`)."""
