#!/usr/bin/env python3
"""Board power of the local GPU while vLLM's sampler runs back to back, beside a memory copy
and idle: does a sampler pass draw what its bytes would?

    python tools/measure_sampler_power.py OUT_DIR [--run-s 6]

Needs PyTorch with a CUDA device and nvidia-smi (not dependencies of llmsim). Each case runs
for `--run-s` seconds while nvidia-smi reports power and clocks every 100 ms; the samples of
the first SETTLE_S seconds are dropped. Cases: `idle` (nothing runs), `copy` (device-to-device
copies of 1 GiB: memory-bound at the device's streaming rate) and the sampler paths of
tools/measure_sampler.py (same code) at BATCH x VOCAB. Writes OUT_DIR/sampler_power.csv:
case, batch, vocab, calls, call_ms (wall time per call, the loop synchronised every SYNC
calls), bytes_per_call (copy only: read + written), power_w (mean), power_p90_w,
sm_clock_mhz, mem_clock_mhz (means), samples.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_sampler import Batch, sampler

BATCH, VOCAB = 512, 128256
CASES = ["idle", "copy", "greedy", "random", "top_p", "penalties", "logprobs", "idle"]
SETTLE_S = 2.0
SYNC = 8
COPY_BYTES = 2**30
FIELDS = ("power.draw.instant", "power.draw")  # the instant reading where the driver has it


class Poller:
    """nvidia-smi's readings (power W, SM and memory clock MHz) with their arrival times."""

    def __init__(self, field: str) -> None:
        query = f"--query-gpu={field},clocks.sm,clocks.mem"
        self.proc = subprocess.Popen(
            ["nvidia-smi", query, "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.samples: list[tuple[float, float, float, float]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                watts, sm, mem = (float(v) for v in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.monotonic(), watts, sm, mem))

    def window(self, start: float, end: float) -> np.ndarray:
        rows = [s[1:] for s in list(self.samples) if start <= s[0] <= end]
        return np.array(rows, dtype=float).reshape(-1, 3)

    def stop(self) -> None:
        self.proc.terminate()


def working_field() -> str:
    for field in FIELDS:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        try:
            float(out.stdout.strip().splitlines()[0])
            return field
        except (ValueError, IndexError):
            continue
    raise SystemExit("nvidia-smi reports no power reading")


def run_for(
    call: Callable[[], object] | None, seconds: float, sync_every: int = SYNC
) -> tuple[int, float]:
    """Calls of `call` back to back for `seconds`, synchronising every `sync_every` calls
    (None: sleep); (calls, ms per call)."""
    if call is None:
        time.sleep(seconds)
        return 0, 0.0
    calls, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(sync_every):
            call()
        torch.cuda.synchronize()
        calls += sync_every
    return calls, (time.monotonic() - start) * 1e3 / calls


def summary(poller: Poller, start: float) -> tuple[float, float, float, float, int] | None:
    """(mean W, p90 W, mean SM MHz, mean memory MHz, readings) from SETTLE_S after `start`
    to now; None without readings."""
    got = poller.window(start + SETTLE_S, time.monotonic())
    if not len(got):
        return None
    watts, sm, mem = got.mean(axis=0)
    return float(watts), float(np.percentile(got[:, 0], 90)), float(sm), float(mem), len(got)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--run-s", type=float, default=6.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("measure_sampler_power.py: no CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    poller = Poller(working_field())
    b = Batch(BATCH, VOCAB, "cuda")
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    calls: dict[str, Callable[[], object] | None] = {
        "idle": None,
        "copy": lambda: dst.copy_(src),
        **{p: sampler(p, b) for p in CASES if p not in ("idle", "copy")},
    }
    for call in calls.values():  # warm-up: compiles, allocator, clocks
        if call is not None:
            run_for(call, 0.5)
    torch.cuda.synchronize()
    with (args.out / "sampler_power.csv").open("w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["case", "batch", "vocab", "calls", "call_ms", "bytes_per_call", "power_w",
                       "power_p90_w", "sm_clock_mhz", "mem_clock_mhz", "samples"])  # fmt: skip
        for case in CASES:
            start = time.monotonic()
            n, call_ms = run_for(calls[case], args.run_s)
            read = summary(poller, start)
            if read is None:
                print(f"{case}: no readings", flush=True)
                continue
            watts, p90, sm, mem, samples = read
            size = 2 * COPY_BYTES if case == "copy" else 0
            rows.writerow([case, BATCH, VOCAB, n, f"{call_ms:.4f}", size, f"{watts:.1f}",
                           f"{p90:.1f}", f"{sm:.0f}", f"{mem:.0f}", samples])  # fmt: skip
            f.flush()
            print(f"{case:10s} {n:6d} calls {call_ms:8.3f} ms/call  {watts:6.1f} W "
                  f"(p90 {p90:.1f}) SM {sm:.0f} MHz mem {mem:.0f} MHz, {samples} readings",
                  flush=True)  # fmt: skip
    poller.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
