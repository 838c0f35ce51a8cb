#!/usr/bin/env python3
"""Time GEMMs and memory copies on the local GPU, in the bundled measurements' format.

    python tools/measure_gpu.py OUT_DIR [--budget-s 300] [--quick]

Needs PyTorch with a CUDA device (it is not a dependency of llmsim: run it where the GPU is).
Writes, row by row so that a run cut short keeps what it measured:
  OUT_DIR/gemm.csv    gemm_dtype,m,n,k,latency_ms   (aiconfigurator's columns; see below)
  OUT_DIR/memory.csv  bytes,latency_ms,bandwidth_bytes_per_s   (one device-to-device copy)
  OUT_DIR/env.json    device, driver, clocks, power limit, PyTorch/CUDA/cuBLAS versions

Method, chosen to match how NVIDIA's aiconfigurator collector timed the bundled A100/H100 GEMMs
(a vLLM linear layer in a CUDA graph over 6 layers' distinct weights):
  * bf16: `torch.nn.functional.linear(x, w)` (x: m x k, w: n x k, as vLLM's unquantised linear
    layers call it; cuBLAS picks the kernel), random normal data.
  * fp8: `torch._scaled_mm` on e4m3 operands already quantised, per-tensor scales, bf16 output
    (cuBLASLt). Unlike aiconfigurator's fp8 rows it does NOT include the activation
    quantisation kernel: predict these rows with that kernel fused away.
  * Each row: 6 weight matrices, a CUDA graph of REPEAT passes over all 6, replayed until at
    least TARGET_S of GPU time has passed, timed with CUDA events; latency_ms is the mean time
    of one GEMM.
  * memory: `dst.copy_(src)` of `bytes` bytes in a CUDA graph; bandwidth counts bytes read
    plus bytes written (2 x bytes), as STREAM's copy does.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

LAYERS = 6  # distinct weights per row, as aiconfigurator's collector
REPEAT = 2  # passes over the LAYERS weights captured in one graph
TARGET_S = 2e-3  # GPU time timed per row, at least
MAX_REPLAYS = 50
M_VALUES = [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 160, 192, 256, 384, 512, 768, 1024, 2048,
            4096, 8192]  # fmt: skip
NK_VALUES = [128, 256, 512, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 8192, 10240, 12288,
             16384]  # fmt: skip
QUICK_M = [1, 16, 128, 1024, 8192]
QUICK_NK = [256, 4096, 16384]
COPY_BYTES = [2**p for p in range(16, 33)]  # 64 KiB .. 4 GiB
COPY_CALLS = 8  # copies captured in one graph
FP8 = torch.float8_e4m3fn
LOAD_QUERY = "clocks.sm,clocks.mem,power.draw,temperature.gpu"


def gpu_seconds(run: Callable[[], None], calls_per_run: int) -> float:
    """Mean GPU seconds of one call: `run` issues `calls_per_run` calls. On CUDA they are
    captured in a graph and replayed; elsewhere (a dry run of this script) timed by the clock."""
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) / calls_per_run
    run()  # warm-up outside the graph: cuBLAS heuristics, workspace, allocator
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    once = start.elapsed_time(end) / 1e3
    replays = max(1, min(MAX_REPLAYS, math.ceil(TARGET_S / max(once, 1e-9))))
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / (replays * calls_per_run)
    del graph
    return seconds


class Rows:
    """A CSV written row by row (flushed), so a run stopped early keeps its rows."""

    def __init__(self, path: Path, header: list[str]) -> None:
        self.file = path.open("w", newline="")
        self.writer = csv.writer(self.file)
        self.writer.writerow(header)
        self.count = 0

    def add(self, *values: object) -> None:
        self.writer.writerow(values)
        self.file.flush()
        self.count += 1

    def close(self) -> None:
        self.file.close()


def weights(n: int, k: int, dtype: torch.dtype, device: str) -> list[torch.Tensor]:
    ws = [torch.randn(n, k, device=device, dtype=torch.bfloat16) for _ in range(LAYERS)]
    return ws if dtype == torch.bfloat16 else [w.to(dtype) for w in ws]


def gemm_runner(dtype: str, x: torch.Tensor, ws: list[torch.Tensor]) -> Callable[[], None]:
    if dtype == "bfloat16":

        def run() -> None:
            for _ in range(REPEAT):
                for w in ws:
                    F.linear(x, w)

        return run
    one = torch.ones((), device=x.device, dtype=torch.float32)

    def run_fp8() -> None:
        for _ in range(REPEAT):
            for w in ws:
                torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    return run_fp8


def shapes(quick: bool) -> Iterator[tuple[int, int]]:
    nk = QUICK_NK if quick else NK_VALUES
    for n in nk:
        for k in nk:
            yield n, k


def measure_gemms(
    out: Rows, dtype: str, device: str, deadline: float, quick: bool, log: Callable[[str], None]
) -> None:
    tdtype = torch.bfloat16 if dtype == "bfloat16" else FP8
    if tdtype == FP8 and (why := fp8_unsupported(device)):
        log(f"gemm fp8: skipped ({why})")
        return
    m_values = QUICK_M if quick else M_VALUES
    flat = torch.randn(max(m_values) * max(NK_VALUES), device=device, dtype=torch.bfloat16)
    if tdtype != torch.bfloat16:
        flat = flat.to(tdtype)
    for n, k in shapes(quick):
        if time.monotonic() > deadline:
            log(f"gemm {dtype}: budget spent at n={n} k={k}")
            return
        ws = weights(n, k, tdtype, device)
        for m in m_values:
            x = flat[: m * k].view(m, k)
            try:
                s = gpu_seconds(gemm_runner(dtype, x, ws), REPEAT * LAYERS)
            except RuntimeError as exc:  # a shape the library refuses: say so, go on
                log(f"gemm {dtype} m={m} n={n} k={k}: {str(exc).splitlines()[0]}")
                continue
            out.add(dtype, m, n, k, f"{s * 1e3:.6g}")
        del ws
    log(f"gemm {dtype}: done")


def fp8_unsupported(device: str) -> str | None:
    """Why this device cannot run the e4m3 scaled GEMM (no fp8 matrix unit before compute
    capability 8.9; ROCm's MI300 takes another fp8 format), or None where one small one runs."""
    try:
        a = torch.zeros(16, 32, device=device).to(FP8)
        b = torch.zeros(32, 32, device=device).to(FP8).t()
        one = torch.ones((), device=device, dtype=torch.float32)
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except (RuntimeError, TypeError) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def measure_copies(out: Rows, device: str, deadline: float, log: Callable[[str], None]) -> None:
    for size in COPY_BYTES:
        if time.monotonic() > deadline:
            log(f"copy: budget spent at {size} bytes")
            return
        src = torch.empty(size, device=device, dtype=torch.uint8).random_(0, 255)
        dst = torch.empty_like(src)

        def run(src: torch.Tensor = src, dst: torch.Tensor = dst) -> None:
            for _ in range(COPY_CALLS):
                dst.copy_(src)

        s = gpu_seconds(run, COPY_CALLS)
        out.add(size, f"{s * 1e3:.6g}", f"{2 * size / s:.6g}")
        del src, dst
    log("copy: done")


def smi(query: str) -> str:
    try:
        args = ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"]
        return subprocess.run(args, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable: {exc}"


def environment() -> dict[str, object]:
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    env: dict[str, object] = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cublas": version("nvidia-cublas") or version("nvidia-cublas-cu12"),
        "python": sys.version.split()[0],
        "gpu": smi("name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit"),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(
            device_name=p.name,
            multiprocessors=p.multi_processor_count,
            total_memory_bytes=p.total_memory,
            l2_cache_bytes=getattr(p, "L2_cache_size", None),
        )
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget-s", type=float, default=300.0, help="stop measuring after")
    parser.add_argument("--quick", action="store_true", help="a few shapes (a smoke test)")
    parser.add_argument("--skip", action="append", default=[], help="copy, bfloat16 or fp8")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.monotonic()
    deadline = t0 + args.budget_s

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f} s] {msg}", flush=True)

    env = environment()
    (args.out / "env.json").write_text(json.dumps(env, indent=2) + "\n")
    log(json.dumps(env))
    torch.manual_seed(0)
    if "copy" not in args.skip:
        rows = Rows(args.out / "memory.csv", ["bytes", "latency_ms", "bandwidth_bytes_per_s"])
        measure_copies(rows, device, deadline, log)
        rows.close()
    gemm = Rows(args.out / "gemm.csv", ["gemm_dtype", "m", "n", "k", "latency_ms"])
    dtypes = ["bfloat16"] + (["fp8"] if device == "cuda" else [])
    for dtype in dtypes:
        if dtype not in args.skip:
            measure_gemms(gemm, dtype, device, deadline, args.quick, log)
            env[f"after_{dtype}"] = smi(LOAD_QUERY)
            log(f"after {dtype}: {env[f'after_{dtype}']}")
    gemm.close()
    env["after"] = smi(LOAD_QUERY)
    env["throttle_reasons"] = smi("clocks_event_reasons.active")
    env["elapsed_s"] = round(time.monotonic() - t0, 1)
    (args.out / "env.json").write_text(json.dumps(env, indent=2) + "\n")
    log(f"{gemm.count} GEMM rows; {env['after']}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
