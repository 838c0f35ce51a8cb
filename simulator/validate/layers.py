"""The `layers` suites: the four projection GEMMs of one transformer layer against Vidur.

Vidur's profiles (fp16, Sarathi-Serve kernels) time each projection of one layer for
`num_tokens` tokens on one GPU of a TP group. The shape columns (`n_head`, `n_kv_head`,
`n_embd`, `n_expanded_embd`) are the full model's; each GPU holds a 1/TP column or row shard,
as Megatron/vLLM split them (the times fall by ~TP x). KV heads are replicated when fewer than
the TP degree, as vLLM does (no bundled profile needs it).

predicted = sum of the cost model's GEMM times of attn_pre_proj (fused QKV), attn_post_proj
(o_proj), mlp_up_proj (gate+up fused when `use_gated_mlp`) and mlp_down_proj at m = num_tokens;
measured = the sum of those four medians. Not compared: norms, rotary, activation, residual
adds, attention itself (other suites cover attention).

The GEMMs run under LIBRARY, the cuBLAS that Vidur's software stack shipped (not the newer
one the device's default GEMM factors were fitted to): `python -m simulator.calibrate` fits
that library's 16-bit peak fraction, size curve and smallest row tile to the per-projection
times of every model but HELD_OUT (suite `layers_fit`); the HELD_OUT model's rows are the
check (`layers`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import pandas as pd

from simulator.costmodel.ops import Op, gemm
from simulator.specs.deployment import Precision
from simulator.specs.hardware import HardwareSpec
from simulator.validate import data
from simulator.validate.frame import finish, median_repeats
from simulator.validate.operators import Group, default_hardware, op_time, sweep_outliers

SUITE = "layers"
FIT = "layers_fit"
# Sarathi-Serve (which Vidur profiles) pins torch 2.3 built for CUDA 12.1 (its requirements.txt
# and README "tested with CUDA 12.1"); PyTorch's cu121 wheels of 2.1-2.4 all pin
# nvidia-cublas-cu12 12.1.3.1.
LIBRARY = "cublas-12.1"
HELD_OUT = ("llama-2-70b",)
FP16 = Precision(weights="fp16", compute="fp16", kv_cache="fp16", activations="fp16")
SHAPE = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp"]
MEDIANS = [f"time_stats.{op}.median" for op in data.VIDUR_OPS]


class LocalShape(NamedTuple):
    """Per-GPU sizes of a Vidur row's layer (TP-sharded), one value per row."""

    hidden: np.ndarray
    head_dim: np.ndarray
    q_heads: np.ndarray
    kv_heads: np.ndarray  # replicated when fewer than the TP degree
    intermediate: np.ndarray


def local_shape(df: pd.DataFrame) -> LocalShape:
    """The per-GPU sizes of every row of a Vidur profile."""
    tp = df["num_tensor_parallel_workers"].to_numpy(dtype=float)
    heads = df["n_head"].to_numpy(dtype=float)
    h = df["n_embd"].to_numpy(dtype=float)
    return LocalShape(
        hidden=h,
        head_dim=h / heads,
        q_heads=heads / tp,
        kv_heads=np.maximum(1.0, np.floor(df["n_kv_head"].to_numpy(dtype=float) / tp)),
        intermediate=df["n_expanded_embd"].to_numpy(dtype=float) / tp,
    )


def projection_gemm_shapes(df: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per-GPU (n, k) of each projection GEMM for every row (TP-sharded)."""
    h, d, q_local, kv_local, inter = local_shape(df)
    gated = df["use_gated_mlp"].astype(str).str.lower().eq("true").to_numpy()
    return {
        "attn_pre_proj": ((q_local + 2.0 * kv_local) * d, h),
        "attn_post_proj": (h, q_local * d),
        "mlp_up_proj": (np.where(gated, 2.0, 1.0) * inter, h),
        "mlp_down_proj": (h, inter),
    }


def profile_rows(measured: pd.DataFrame, medians: list[str] = MEDIANS) -> pd.DataFrame:
    """One row per (model, TP, num_tokens) of a Vidur profile (as `data.vidur` returns it):
    the median over the repeats of each of `medians` (default: the projections' times)."""
    keys = ["model", *SHAPE, "num_tensor_parallel_workers", "num_tokens"]
    return median_repeats(measured, keys, medians)


def projection_ops(rows: pd.DataFrame) -> dict[str, Op]:
    """The GEMM of each projection for every row of `profile_rows`, vectorised."""
    m = rows["num_tokens"].to_numpy(dtype=float)
    return {
        name: gemm(name, m=m, n=n, k=k, count=1, prec=FP16)
        for name, (n, k) in projection_gemm_shapes(rows).items()
    }


def projection_groups(measured: pd.DataFrame) -> list[Group]:
    """Each projection's time in the profile rows of the models not HELD_OUT, as operator
    groups (`latency_ms`) for the calibration of LIBRARY."""
    rows = profile_rows(measured[~measured["model"].isin(HELD_OUT)])
    return [
        Group("gemm", rows.assign(latency_ms=rows[f"time_stats.{name}.median"]), op, rows["model"])
        for name, op in projection_ops(rows).items()
    ]


def layer_cases(hw: HardwareSpec, measured: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, TP, num_tokens) of a Vidur profile (as `data.vidur` returns it),
    predicted on `hw` under LIBRARY, vectorised over all rows: suite `layers` for the HELD_OUT
    model, `layers_fit` for the rows LIBRARY was fitted to."""
    rows = profile_rows(measured)
    lib = hw.with_gemm_library(LIBRARY)
    predicted = np.zeros(len(rows))
    for name, op in projection_ops(rows).items():
        t = op_time(op, lib, len(rows))
        rows[f"predicted_{name}_s"] = t
        predicted += t
    df = rows.assign(
        kind="layer",
        case=row_case(rows),
        predicted_s=predicted,
        measured_s=rows[MEDIANS].sum(axis=1).to_numpy(dtype=float) / 1e3,
        device=hw.id,
    )
    df["sweep_outlier"] = projection_outliers(df)
    held_out = df["model"].isin(HELD_OUT)
    checks = finish(df[held_out], suite=SUITE, fitted=False)
    return pd.concat([checks, finish(df[~held_out], suite=FIT, fitted=True)], ignore_index=True)


def row_case(rows: pd.DataFrame) -> pd.Series:
    """The case name of each profile row: `<model> tp<N> tokens=<T>`."""
    return (
        rows["model"]
        + " tp"
        + rows["num_tensor_parallel_workers"].astype(str)
        + " tokens="
        + rows["num_tokens"].astype(str)
    )


def projection_outliers(rows: pd.DataFrame) -> pd.Series:
    """Rows with a projection whose time its own sweep (one model, TP and projection over the
    token counts) contradicts: `operators.sweep_outliers`, e.g. Llama-2-70B's TP1 down
    projection on H100 at 528 tokens (0.75 ms) against 576 (0.46 ms)."""
    sweep = {"projection": (("model", "num_tensor_parallel_workers"), "num_tokens", 1.0)}
    flagged = pd.Series(False, index=rows.index)
    for column in MEDIANS:
        times = rows[["model", "num_tensor_parallel_workers", "num_tokens"]].assign(
            kind="projection", measured_s=rows[column].to_numpy(dtype=float)
        )
        flagged |= sweep_outliers(times, sweep)
    return flagged


def layers_suite(hardware: Mapping[str, HardwareSpec] | None = None) -> pd.DataFrame:
    """The `layers` and `layers_fit` suites on every Vidur device. `hardware` maps a data
    folder (`a100`, `h100`) to the spec to predict with; default: data.VIDUR_DEVICES."""
    specs = default_hardware(data.VIDUR_DEVICES) if hardware is None else hardware
    frames = [layer_cases(hw, data.vidur(folder)) for folder, hw in specs.items()]
    return pd.concat(frames, ignore_index=True)
