"""Speed of the serving simulator. Run by hand: `python benchmarks/bench_serving.py [--million]`.

- replay of the Azure 2023 conversation trace (19,366 requests, one hour) on Llama-3.1-8B / H100;
- N synthetic requests (default 100,000; --million for the issue's 1,000,000 target).
Reports wall time and the process's peak resident memory. Compare ratios measured in one run.
"""

from __future__ import annotations

import argparse
import resource
import time

from simulator.runs import runner
from simulator.specs.engine_args import EngineArgs
from simulator.specs.workload import WorkloadSpec
from simulator.workload.requests import RandomDataset


def timed(label: str, scenario: object) -> None:
    start = time.perf_counter()
    result = runner.run(scenario)  # type: ignore[arg-type]
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    s = result.summary
    print(
        f"{label}: {s['completed']:,} requests, {len(result.sim.steps):,} steps simulated "
        f"in {wall:.2f} s wall, process peak RSS {peak / 2**20:.0f} MiB "
        f"(simulated {s['duration']:.0f} s; mean TTFT {s['mean_ttft_ms']:.1f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--million", action="store_true")
    parser.add_argument("--synthetic", type=int, default=100_000)
    args = parser.parse_args()
    replay = WorkloadSpec.model_validate({"dataset": {"name": "azure-conv"}, "arrival": "trace"})
    timed(
        "azure-conv replay",
        runner.bench_scenario(model="llama-3.1-8b", hardware="h100_sxm", workload=replay),
    )
    n = 1_000_000 if args.million else args.synthetic
    synthetic = WorkloadSpec(
        dataset=RandomDataset(input_len=512, output_len=128, range_ratio=0.5),
        num_prompts=n,
        request_rate=40.0,
    )
    timed(
        f"{n:,} synthetic",
        runner.bench_scenario(
            model="llama-3.1-8b",
            hardware="h100_sxm",
            workload=synthetic,
            engine_args=EngineArgs(data_parallel_size=4),
            router="least_outstanding",
        ),
    )


if __name__ == "__main__":
    main()
