"""Time, on this machine's CPU, the host work vLLM's V1 sampler does every step for requests
with a repetition, frequency or presence penalty: each sampling request's output token ids
(Python lists) padded into one int64 array (vllm/v1/sample/ops/penalties.py
`_convert_to_tensors`, through vllm/utils `make_tensor_with_pad`: a filled array of sequences x
longest output, each row's list copied in, then a copy into pinned memory for the
host-to-device transfer).

The two costs it reports are what the `vllm` engine profile's `penalties.host_s_per_token`
(per output token copied from its list) and `penalties.host_s_per_padded` (per element of
the padded array: the fill and the pinned copy) are set from:

    python tools/measure_penalty_host.py

Each case is timed `REPEATS` times after a warm-up; the per-token cost is the slope of the
best time over the tokens copied at a fixed padded size, the per-element cost the best time of
filling and copying an array of that size over its elements. Numbers vary with the CPU: the
Sampling section of docs/serving.md gives the machine they were taken on.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable

import numpy as np

VOCAB = 128256  # the pad value: Llama 3's vocabulary size (any value outside the ids)
REPEATS = 15
SEQS = (64, 256, 512)
LONGEST = 2048


def _best(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    """The fastest of `repeats` timed calls of `fn`, after one untimed."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def pad_rows(rows: list[list[int]], width: int) -> np.ndarray:
    """The padded array the sampler builds: filled with the pad id, each row's list copied in."""
    out = np.full((len(rows), width), VOCAB, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    per_token, per_padded = [], []
    for seqs in SEQS:
        # the same padded size, rows of a quarter and of all of it: the slope is per token
        best = {}
        for fill in (LONGEST // 4, LONGEST):
            rows = [rng.integers(0, VOCAB, fill).tolist() for _ in range(seqs)]
            rows[0] = rows[0] + [0] * (LONGEST - len(rows[0]))
            best[fill] = _best(lambda rows=rows: pad_rows(rows, LONGEST))
        tokens = seqs * (LONGEST - LONGEST // 4)
        per_token.append((best[LONGEST] - best[LONGEST // 4]) / tokens)
        pinned = np.empty((seqs, LONGEST), dtype=np.int64)  # pin_memory's copy, as a copy

        def fill_and_copy(seqs: int = seqs, pinned: np.ndarray = pinned) -> None:
            np.copyto(pinned, np.full((seqs, LONGEST), VOCAB, dtype=np.int64))

        per_padded.append(_best(fill_and_copy) / (seqs * LONGEST))
        print(
            f"{seqs:4d} sequences x {LONGEST} padded: {per_token[-1] * 1e9:5.1f} ns per token "
            f"copied, {per_padded[-1] * 1e9:5.2f} ns per padded element"
        )
    print(f"CPU: {platform.processor() or platform.machine()} ({platform.python_version()})")
    print(f"host_s_per_token: {np.median(per_token) * 1e9:.1f} ns")
    print(f"host_s_per_padded: {np.median(per_padded) * 1e9:.2f} ns")


if __name__ == "__main__":
    main()
