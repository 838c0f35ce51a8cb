"""Throughput of `llmsim sweep`. Run by hand: `python benchmarks/bench_sweep.py [--runs 1000]`.

Builds a sweep of short scenarios in a temporary folder (Llama-3.1-8B on one H100 under vLLM,
`--prompts` random requests each; a grid of request rates x seeds giving `--runs` runs), runs it
on the local process pool with `--workers`, and reports runs per minute, wall time included
(worker start-up, expansion, CSV writing). For scale it also times the same scenarios run one
after another in this process (no pool, no CSV), so the sweep's own overhead shows. On a shared
machine wall times swing with the load; the CPU time per run (this process and its workers)
swings less.
"""

from __future__ import annotations

import argparse
import math
import resource
import tempfile
import time
from pathlib import Path

import yaml

from simulator.runs import runner
from simulator.runs.sweeps import execute_sweep, expand, load_sweep
from simulator.specs.scenario import Scenario

RATES = [1, 2, 4, 8, 16, 32, 64, 128]


def sweep_file(folder: Path, *, runs: int, prompts: int) -> Path:
    base = {
        "name": "bench",
        "model": "llama-3.1-8b",
        "replicas": [{"hardware": "h100_sxm", "engine": "vllm"}],
        "workload": {
            "dataset": {"name": "random", "input_len": 512, "output_len": 128, "range_ratio": 0.5},
            "num_prompts": prompts,
            "request_rate": 8,
        },
    }
    seeds = math.ceil(runs / len(RATES))
    spec = {"base": base, "grid": {"workload.request_rate": RATES, "seed": list(range(seeds))}}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


def cpu_s() -> float:
    """CPU seconds of this process and its finished children so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def in_process(path: Path, *, n: int) -> tuple[float, float]:
    """Runs per minute and CPU ms per run of the first `n` runs done here, one after another."""
    runs = expand(load_sweep(path))[:n]
    runner.run(Scenario.model_validate(runs[0]["scenario"]))  # warm the spec caches
    start, cpu = time.perf_counter(), cpu_s()
    for run in runs:
        runner.run(Scenario.model_validate(run["scenario"]))
    return n / (time.perf_counter() - start) * 60, (cpu_s() - cpu) / n * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = sweep_file(Path(tmp), runs=args.runs, prompts=args.prompts)
        start, cpu = time.perf_counter(), cpu_s()
        report = execute_sweep(path, Path(tmp) / "out", workers=args.workers, progress=False)
        wall, cpu = time.perf_counter() - start, cpu_s() - cpu
        done = report.ok + report.error
        print(
            f"sweep: {done:,} runs of {args.prompts} requests ({report.ok} ok, {report.error} "
            f"error) with {args.workers} workers in {wall:.1f} s = {done / wall * 60:,.0f} "
            f"runs/min; {cpu / done * 1e3:.1f} ms CPU per run, start-up included"
        )
        start = time.perf_counter()
        again = execute_sweep(path, Path(tmp) / "out", workers=args.workers, progress=False)
        print(
            f"resume with nothing left: {again.skipped:,} skipped in "
            f"{time.perf_counter() - start:.2f} s"
        )
        rate, cpu_ms = in_process(path, n=min(200, done))
        print(
            f"in this process, one after another (no pool, no CSV): {rate:,.0f} runs/min; "
            f"{cpu_ms:.1f} ms CPU per run"
        )


if __name__ == "__main__":
    main()
