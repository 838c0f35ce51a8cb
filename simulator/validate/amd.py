"""The `ops_amd` suites: AMD Instinct MI300X GEMM kernels against the device's own factors.

`simulator/data/measured/aiter/mi300x/gemm_a8w8.csv` holds 427 GEMMs that AMD's aiter tuner timed
on an MI300X (cu_num 304) for Llama 3.1 70B and 405B: CK's a8w8 row-wise kernel (8-bit operands,
per-token and per-channel scales, bf16 out), the kernel ROCm vLLM runs for 8-bit linear layers
(ROCm/aiter@fbb52ddf aiter/configs/a8w8_tuned_gemm.csv, "[MI300X] tune Gemm performance for llama
70b/405b", 2025-09-26). The tuner fed int8 data (`csrc/ck_gemm_a8w8/gemm_a8w8_tune.py`); gfx942
runs int8 and fp8 MFMA at the same rate (2,614.9 TFLOP/s each, hardware_specs/mi300x.yaml) and CK
builds both from one template, so the rows are predicted as fp8 GEMMs, without the
activation-quantisation kernel (they time the GEMM alone).

The rows are predicted under LIBRARY, mi300x.yaml's `ck-a8w8` GEMM library (its peak fraction,
size curve and fixed cost for 8-bit GEMMs), with the device's data ceiling (random data). They
are split by model, so that no shape is in both parts: the 405B shapes (n or k is 16384, its
hidden size) are `ops_amd_fit`, which the library was fitted to (`simulator.calibrate.amd`); the
70B shapes (every TP degree's projections) are `ops_amd`, held out.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from simulator.costmodel.ops import gemm
from simulator.specs import load_hardware
from simulator.specs.hardware import HardwareSpec
from simulator.validate import data
from simulator.validate.frame import empty, finish_split, median_repeats
from simulator.validate.operators import GEMM_PRECISION, Group, cases, sweep_outliers

SUITE = "ops_amd"
FIT_SUITE = "ops_amd_fit"
DEVICE = "mi300x"
LIBRARY = "ck-a8w8"
# Llama 3.1 405B's hidden size: its projections have it as n (qkv-free o_proj, down_proj) or k.
FIT_DIM = 16384


def fitted_mask(rows: pd.DataFrame) -> np.ndarray:
    """True for the rows the factors were fitted to: the 405B shapes (n or k is FIT_DIM)."""
    return ((rows["n"] == FIT_DIM) | (rows["k"] == FIT_DIM)).to_numpy()


def a8w8_groups(hw: HardwareSpec, measured: pd.DataFrame, *, fitted: bool) -> list[Group]:
    """One group of the fitted (or the held-out) rows of a `data.aiter_gemm` table: 8-bit GEMMs
    predicted as fp8 on `hw`, the scaled GEMM alone (no activation-quantisation kernel)."""
    rows = median_repeats(measured, ["gemm_dtype", "m", "n", "k"], ["latency_ms"])
    rows = rows[fitted_mask(rows) == fitted].reset_index(drop=True)
    if rows.empty:
        return []
    m, n, k = (rows[c].to_numpy(dtype=float) for c in ("m", "n", "k"))
    op = gemm("gemm", m=m, n=n, k=k, count=1, prec=GEMM_PRECISION["fp8"])
    op = dataclasses.replace(op, pre_bytes=0.0)
    case = (
        "gemm a8w8 m="
        + rows["m"].astype(str)
        + ",n="
        + rows["n"].astype(str)
        + ",k="
        + rows["k"].astype(str)
    )
    return [Group("gemm", rows, op, case)]


def device_groups(hw: HardwareSpec, *, fitted: bool) -> list[Group]:
    """`a8w8_groups` of the bundled MI300X table on `hw`."""
    return a8w8_groups(hw, data.aiter_gemm(DEVICE), fitted=fitted)


def amd_suite(hw: HardwareSpec | None = None, library: str | None = LIBRARY) -> pd.DataFrame:
    """Both suites' rows on `hw` (default: the MI300X spec) under LIBRARY: `ops_amd` (held
    out) first, then `ops_amd_fit`; `sweep_outlier` as in `ops`. `library` None: the device's
    own GEMM factors."""
    hw = load_hardware(DEVICE) if hw is None else hw
    hw = hw.with_gemm_library(library)
    frames = []
    for fitted in (False, True):
        part = cases(hw, device_groups(hw, fitted=fitted))
        if not part.empty:
            frames.append(part.assign(fit_row=fitted))
    if not frames:
        return empty(SUITE)
    df = pd.concat(frames, ignore_index=True).assign(device=hw.id)
    df = df.assign(sweep_outlier=sweep_outliers(df))
    mask = df.pop("fit_row").to_numpy(dtype=bool)
    return finish_split(df, mask, suite=SUITE, fit_suite=FIT_SUITE)
