#!/usr/bin/env python3
"""Board power of the local GPU while GEMMs run back to back: a decode step's projections at
batch sizes from 1 to 4096, a large square GEMM, a memory copy and idle.

    python tools/measure_gemm_power.py OUT_DIR [--run-s 6]

Needs PyTorch with a CUDA device and nvidia-smi (not dependencies of llmsim). Each case runs
for `--run-s` seconds while nvidia-smi reports power and clocks every 100 ms (the first
SETTLE_S seconds dropped; tools/measure_sampler_power.py's poller). `proj_m<M>`: one pass is
Llama 3.1 8B's 32 layers of bf16 projections (qkv 4096 x 6144, o 4096 x 4096, gate+up 4096 x
28672, down 14336 x 4096: distinct random weights per layer, 13.9 GB) applied to M tokens,
`torch.nn.functional.linear`, timed by the loop's wall clock (synchronised every pass); its
FLOPs and the bytes of weights and activations are written beside it. `square`: 8192^3 bf16
GEMMs. `copy`: 1 GiB device-to-device copies. Writes OUT_DIR/gemm_power.csv: case, m, calls,
call_ms, flops_per_call, bytes_per_call, power_w, power_p90_w, sm_clock_mhz, mem_clock_mhz,
samples.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_sampler_power import Poller, run_for, summary, working_field

LAYERS = 32
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # (n, k) of Llama 3.1 8B
M_VALUES = [1, 16, 64, 256, 1024, 4096]
COPY_BYTES = 2**30


def projections(
    m: int, weights: list[list[torch.Tensor]]
) -> tuple[Callable[[], None], float, float]:
    """One pass over every layer's projections for `m` tokens; (call, FLOPs, bytes)."""
    inputs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, k in SHAPES}
    flops = sum(2.0 * m * n * k for n, k in SHAPES) * LAYERS
    nbytes = sum(2.0 * (n * k + m * k + m * n) for n, k in SHAPES) * LAYERS

    def call() -> None:
        for layer in weights:
            for w in layer:
                F.linear(inputs[w.shape[1]], w)

    return call, flops, nbytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--run-s", type=float, default=6.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("measure_gemm_power.py: no CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    poller = Poller(working_field())
    weights = [
        [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for n, k in SHAPES]
        for _ in range(LAYERS)
    ]
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    cases: list[tuple[str, int, Callable[[], object] | None, float, float]] = [
        ("idle", 0, None, 0.0, 0.0),
        ("copy", 0, lambda: dst.copy_(src), 0.0, 2.0 * COPY_BYTES),
        ("square", 8192, lambda: a @ a, 2.0 * 8192**3, 3 * 2.0 * 8192**2),
    ]
    for m in M_VALUES:
        call, flops, nbytes = projections(m, weights)
        cases.append((f"proj_m{m}", m, call, flops, nbytes))
    cases.append(("idle", 0, None, 0.0, 0.0))
    for _, _, call, _, _ in cases:  # warm-up: cuBLAS heuristics, clocks
        if call is not None:
            run_for(call, 0.3, sync_every=1)
    with (args.out / "gemm_power.csv").open("w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["case", "m", "calls", "call_ms", "flops_per_call", "bytes_per_call",
                       "power_w", "power_p90_w", "sm_clock_mhz", "mem_clock_mhz",
                       "samples"])  # fmt: skip
        for name, m, call, flops, nbytes in cases:
            start = time.monotonic()
            n, call_ms = run_for(call, args.run_s, sync_every=1)
            read = summary(poller, start)
            if read is None:
                print(f"{name}: no readings", flush=True)
                continue
            watts, p90, sm, mem, samples = read
            rows.writerow([name, m, n, f"{call_ms:.4f}", f"{flops:.6g}", f"{nbytes:.6g}",
                           f"{watts:.1f}", f"{p90:.1f}", f"{sm:.0f}", f"{mem:.0f}",
                           samples])  # fmt: skip
            f.flush()
            tflops = flops / (call_ms * 1e-3) / 1e12 if call_ms else 0.0
            tbs = nbytes / (call_ms * 1e-3) / 1e12 if call_ms else 0.0
            print(f"{name:10s} {n:6d} calls {call_ms:9.3f} ms  {tflops:6.1f} TFLOP/s "
                  f"{tbs:5.2f} TB/s  {watts:6.1f} W (p90 {p90:.1f}) SM {sm:.0f} MHz",
                  flush=True)  # fmt: skip
    poller.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
