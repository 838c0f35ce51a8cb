"""The `ops_nvfp4` suites: B200's NVFP4 (W4A4) GEMMs, timed alone, against the device's factors.

`simulator/data/measured/nvfp4/b200_gemm.csv` (provenance in the README there) holds published
timings of vLLM's CUTLASS NVFP4 GEMM (`cutlass_scaled_fp4_mm`: 4-bit operands with 16-element
block scales, bf16 out) on one B200, the activations already quantised (the GEMM alone):

- V1, vllm-project/vllm PR #20578 (`benchmarks/kernels/bench_nvfp4_gemm.py`, 2025-07-07, the
  "nvfp4-noquant" column): Llama 3.1 8B's fused QKV shape, n 6144 x k 4096, at m 1-16384.
  These are what B200's fp4 peak fraction, size curve and fixed cost are fitted to
  (`simulator.calibrate.nvfp4`): suite `ops_nvfp4_fit`.
- H1, H2, pytorch/helion PRs #3046 (2026-07-14) and #3278 (2026-08-05), the "cutlass" column of
  the "fp4in" rows of their B200 decode benchmark: m 1 over nine projection shapes of Llama 3
  8B / 70B and Qwen3 (n 4096-28672, k 4096-28672), a year of vLLM releases later. Held out:
  suite `ops_nvfp4`.

The rows are predicted as fp4 GEMMs on the B200 spec under its own GEMM factors, without the
activation-quantisation kernel (`pre_bytes` 0).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from simulator.costmodel.op import gemm
from simulator.specs import load_hardware
from simulator.specs.deployment import Precision
from simulator.specs.hardware import HardwareSpec
from simulator.validate import data
from simulator.validate.frame import empty, finish_split
from simulator.validate.operators import Group, cases

SUITE = "ops_nvfp4"
FIT_SUITE = "ops_nvfp4_fit"
DEVICE = "b200"
FIT_SOURCE = "V1"
COLUMNS = ["source", "hardware", "kernel", "m", "n", "k", "tflops", "latency_us"]
FP4 = Precision(weights="fp4", compute="fp4", kv_cache="bf16", activations="bf16")


def measured() -> pd.DataFrame:
    """The bundled B200 NVFP4 GEMM timings, with `latency_ms` (for `Group.measured_s`)."""
    rows = data.read_measured("nvfp4/b200_gemm.csv", COLUMNS)
    return rows.assign(latency_ms=rows["latency_us"].astype(float) / 1e3)


def fitted_mask(rows: pd.DataFrame) -> np.ndarray:
    """True for the rows the factors were fitted to (source V1)."""
    return (rows["source"] == FIT_SOURCE).to_numpy()


def nvfp4_groups(measured_rows: pd.DataFrame, *, fitted: bool) -> list[Group]:
    """One group of the fitted (or held-out) rows: fp4 GEMMs, the GEMM alone."""
    rows = measured_rows[fitted_mask(measured_rows) == fitted].reset_index(drop=True)
    if rows.empty:
        return []
    m, n, k = (rows[c].to_numpy(dtype=float) for c in ("m", "n", "k"))
    op = dataclasses.replace(gemm("gemm", m=m, n=n, k=k, count=1, prec=FP4), pre_bytes=0.0)
    case = (
        rows["source"]
        + " gemm nvfp4 m="
        + rows["m"].astype(str)
        + ",n="
        + rows["n"].astype(str)
        + ",k="
        + rows["k"].astype(str)
    )
    return [Group("gemm", rows, op, case)]


def device_groups(*, fitted: bool) -> list[Group]:
    """`nvfp4_groups` of the bundled table."""
    return nvfp4_groups(measured(), fitted=fitted)


def nvfp4_suite(hw: HardwareSpec | None = None) -> pd.DataFrame:
    """Both suites' rows on `hw` (default: the B200 spec): `ops_nvfp4` (held out) first, then
    `ops_nvfp4_fit`."""
    hw = load_hardware(DEVICE) if hw is None else hw
    frames = []
    for fitted in (False, True):
        part = cases(hw, device_groups(fitted=fitted))
        if not part.empty:
            frames.append(part.assign(fit_row=fitted))
    if not frames:
        return empty(SUITE)
    df = pd.concat(frames, ignore_index=True).assign(device=hw.id)
    mask = df.pop("fit_row").to_numpy(dtype=bool)
    return finish_split(df, mask, suite=SUITE, fit_suite=FIT_SUITE)
