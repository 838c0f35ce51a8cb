"""Speed of the analytical core. Run by hand: `make bench`.

Reports:
- vectorised operator evaluations per second: one `step_cost` over N batch shapes at once
  (N x ops-per-step evaluations), the path sweeps and the serving simulator use;
- scalar operator evaluations per second: one step at a time;
- wall time of one `estimate` call (`llmsim bench latency` without CLI start-up).
Timings are medians of repeated runs; compare ratios measured in one run, the machine is noisy.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

import simulator as sim
from simulator.costmodel.batch import BatchShape


def median_time(fn: Callable[[], object], *, repeat: int = 7) -> float:
    fn()  # warm caches (spec loading)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    dep = sim.deployment(model="llama-3.1-70b", hardware="h100_sxm", tensor_parallel_size=4)
    args = (dep.model, dep.hardware, dep.layout, dep.precision)

    n = 10_000
    rng = np.random.default_rng(0)
    batch = BatchShape(
        prefill_tokens=rng.integers(0, 4096, n).astype(float),
        prefill_seqs=np.ones(n),
        prefill_pairs=rng.integers(0, 4096, n).astype(float) ** 2 / 2,
        prefill_kv_tokens=rng.integers(0, 4096, n).astype(float),
        decode_seqs=rng.integers(1, 256, n).astype(float),
        decode_kv_tokens=rng.integers(1, 256 * 4096, n).astype(float),
        sampled=rng.integers(1, 256, n).astype(float),
    )
    num_ops = len(sim.step_cost(*args, BatchShape.decode(batch_size=1, context_len=1)).costs)
    t_vec = median_time(lambda: sim.step_cost(*args, batch))
    print(
        f"vectorised: {n * num_ops / t_vec:,.0f} operator evaluations/s "
        f"({n} steps x {num_ops} ops in {t_vec * 1e3:.1f} ms)"
    )

    one = BatchShape.decode(batch_size=32, context_len=2048)
    t_one = median_time(lambda: sim.step_cost(*args, one), repeat=50)
    print(
        f"scalar:     {num_ops / t_one:,.0f} operator evaluations/s "
        f"(one step of {num_ops} ops in {t_one * 1e6:.0f} us)"
    )

    def latency() -> object:
        return sim.estimate(
            model="llama-3.1-70b",
            hardware="h100_sxm",
            tensor_parallel_size=4,
            batch_size=32,
            input_len=1024,
            output_len=1024,
        )

    t_lat = median_time(latency, repeat=20)
    print(f"estimate (bench latency, 1024 in / 1024 out, batch 32): {t_lat * 1e3:.2f} ms per call")


if __name__ == "__main__":
    main()
