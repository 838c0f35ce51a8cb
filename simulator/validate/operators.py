"""The `ops` suite: single kernels against aiconfigurator's per-kernel timings.

Each `*_cases(hw, measured)` function is pure: it takes a hardware spec and one measured table
(as `data.aiconfigurator` returns it) and gives one row per measured shape, predicted by the
cost model's operator constructors and `roofline.evaluate`, vectorised over all rows of a
shape group at once. Calibration can call them with modified specs.

Measured (aiconfigurator, vLLM 0.14.0 kernels): cuBLAS/CUTLASS GEMMs (bf16, per-tensor fp8 and
block-scaled fp8), flash-attention prefill, paged decode attention, NCCL collectives. Repeats of
one shape are reduced to their median. Not covered: fp8 GEMMs on devices without an fp8 matrix
unit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.ops import Collective, Op, attention_ops, collective, gemm
from simulator.costmodel.roofline import evaluate
from simulator.specs import load_hardware
from simulator.specs.deployment import Precision
from simulator.specs.hardware import HardwareSpec
from simulator.validate import data, store
from simulator.validate.frame import empty, finish, median_repeats

SUITE = "ops"
# aiconfigurator's gemm_dtype -> the case's label; fp8_block: fp8 weights scaled per 128 x 128
# block (DeepSeek-V3's checkpoints), vLLM's per-token-group activation quantisation before it
GEMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block"}
KV_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
# GEMMs as `llmsim op gemm` runs them: the named dtype on the matrix unit, bf16 activations.
GEMM_PRECISION = {
    "bf16": Precision(weights="bf16", compute="bf16", kv_cache="bf16", activations="bf16"),
    "fp8": Precision(weights="fp8", compute="fp8", kv_cache="bf16", activations="bf16"),
    "fp8_block": Precision(
        weights="fp8", compute="fp8", kv_cache="bf16", activations="bf16", fp8_blocks=True
    ),
}
# Attention with bf16 activations and a bf16 or fp8 KV cache.
ATTENTION_PRECISION = {
    "bf16": Precision(weights="bf16", compute="bf16", kv_cache="bf16", activations="bf16"),
    "fp8": Precision(weights="bf16", compute="bf16", kv_cache="fp8", activations="bf16"),
}
NCCL_OPS: dict[str, Collective] = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "alltoall": "all_to_all",
}
HALF_BYTES = 2.0


def op_time(op: Op, hw: HardwareSpec, rows: int) -> np.ndarray:
    """Seconds of one instance of `op` on `hw`, broadcast to `rows` values."""
    return np.broadcast_to(evaluate([op], hw)[0].time_s, (rows,)).astype(float)


class Group(NamedTuple):
    """Measured rows of one shape family and the op that predicts them (vectorised)."""

    kind: str
    rows: pd.DataFrame
    op: Op
    case: pd.Series

    @property
    def measured_s(self) -> np.ndarray:
        return self.rows["latency_ms"].to_numpy(dtype=float) / 1e3


def gemm_groups(hw: HardwareSpec, measured: pd.DataFrame) -> list[Group]:
    """bf16 GEMMs, and fp8 GEMMs (per tensor and per block) where `hw` has an fp8 matrix
    unit."""
    rows = measured[measured["gemm_dtype"].isin(list(GEMM_DTYPES))]
    rows = median_repeats(rows, ["gemm_dtype", "m", "n", "k"], ["latency_ms"])
    groups = []
    for raw, dtype in GEMM_DTYPES.items():
        g = rows[rows["gemm_dtype"] == raw]
        prec = GEMM_PRECISION[dtype]
        if g.empty or not hw.supports(prec.compute):
            continue
        m, n, k = (g[c].to_numpy(dtype=float) for c in ("m", "n", "k"))
        op = gemm("gemm", m=m, n=n, k=k, count=1, prec=prec)
        case = (
            f"gemm {dtype} m="
            + g["m"].astype(str)
            + ",n="
            + g["n"].astype(str)
            + ",k="
            + g["k"].astype(str)
        )
        groups.append(Group("gemm", g, op, case))
    return groups


def attention_groups(measured: pd.DataFrame, *, phase: str) -> list[Group]:
    """Attention layer calls with bf16 activations. `phase` "prefill" reads a
    context_attention table (`isl` causal prompt tokens per sequence), "decode" a
    generation_attention table (`step` KV tokens attended to per sequence)."""
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase must be prefill or decode, got {phase!r}")
    rows = measured[
        (measured["attn_dtype"] == "bfloat16")
        & measured["kv_cache_dtype"].isin(list(KV_DTYPES))
        & (measured["num_heads"] % measured["num_key_value_heads"] == 0)
    ]
    heads = ["num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype"]
    rows = median_repeats(rows, [*heads, "batch_size", "isl", "step"], ["latency_ms"])
    kind = f"attention_{phase}"
    seq = "isl" if phase == "prefill" else "step"
    groups = []
    for (h, kv, d, kv_raw), g in rows.groupby(heads, sort=True):
        b, s = g["batch_size"].to_numpy(dtype=float), g[seq].to_numpy(dtype=float)
        batch = (
            BatchShape.prefill(batch_size=b, prompt_len=s)
            if phase == "prefill"
            else BatchShape.decode(batch_size=b, context_len=s)
        )
        kvd = KV_DTYPES[str(kv_raw)]
        ops = attention_ops(
            heads=int(h),
            kv_heads=int(kv),
            head_dim=int(d),
            prec=ATTENTION_PRECISION[kvd],
            batch=batch,
            count=1,
        )
        case = (
            f"{kind} kv={kvd} h={h},kv={kv},d={d} b="
            + g["batch_size"].astype(str)
            + f",{'s' if phase == 'prefill' else 'ctx'}="
            + g[seq].astype(str)
        )
        groups.append(Group(kind, g, ops[0] if phase == "prefill" else ops[1], case))
    return groups


def collective_groups(
    hw: HardwareSpec, measured: pd.DataFrame, *, ops: tuple[str, ...] = ("all_reduce",)
) -> list[Group]:
    """NCCL collectives of 16-bit (`half`) elements within one node; `ops` names
    aiconfigurator's op_name values (all_reduce, all_gather, alltoall). The message is
    `message_size_elements` x 2 bytes (for all_gather: the gathered output, as nccl-tests
    counts it)."""
    rows = measured[
        measured["op_name"].isin(list(ops))
        & (measured["nccl_dtype"] == "half")
        & (measured["num_gpus"] <= hw.interconnect.gpus_per_node)
    ]
    keys = ["op_name", "num_gpus", "message_size_elements"]
    rows = median_repeats(rows, keys, ["latency_ms"])
    groups = []
    for (name, size), g in rows.groupby(["op_name", "num_gpus"], sort=True):
        kind = NCCL_OPS[str(name)]
        msg = g["message_size_elements"].to_numpy(dtype=float) * HALF_BYTES
        op = collective(kind, kind, msg_bytes=msg, group=int(size), count=1)
        case = f"{kind} n={size} bytes=" + (g["message_size_elements"] * 2).astype(str)
        groups.append(Group(kind, g.assign(msg_bytes=msg), op, case))
    return groups


def cases(hw: HardwareSpec, groups: list[Group]) -> pd.DataFrame:
    """One row per measured shape: the groups' rows with predictions on `hw`."""
    frames = [
        g.rows.assign(
            kind=g.kind,
            case=g.case,
            predicted_s=op_time(g.op, hw, len(g.rows)),
            measured_s=g.measured_s,
        )
        for g in groups
    ]
    return pd.concat(frames, ignore_index=True) if frames else empty(SUITE)


def gemm_cases(hw: HardwareSpec, measured: pd.DataFrame) -> pd.DataFrame:
    """Every bf16 GEMM, and every fp8 GEMM where `hw` has an fp8 matrix unit."""
    return cases(hw, gemm_groups(hw, measured))


def attention_cases(hw: HardwareSpec, measured: pd.DataFrame, *, phase: str) -> pd.DataFrame:
    """Attention layer calls; see `attention_groups`."""
    return cases(hw, attention_groups(measured, phase=phase))


def collective_cases(
    hw: HardwareSpec, measured: pd.DataFrame, *, ops: tuple[str, ...] = ("all_reduce",)
) -> pd.DataFrame:
    """NCCL collectives; see `collective_groups`."""
    return cases(hw, collective_groups(hw, measured, ops=ops))


# The sweeps of each kind of row: the columns that fix a sweep, the column it walks, and the
# power of that column the work grows with (GEMM m, prefill prompt length squared, decode
# context, all-reduce bytes).
SWEEPS: dict[str, tuple[tuple[str, ...], str, float]] = {
    "gemm": (("gemm_dtype", "n", "k"), "m", 1.0),
    "attention_prefill": (
        ("num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype", "batch_size"),
        "isl",
        2.0,
    ),
    "attention_decode": (
        ("num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype", "batch_size"),
        "step",
        1.0,
    ),
    "all_reduce": (("num_gpus",), "msg_bytes", 1.0),
}
OUTLIER_FACTOR = 1.5


def sweep_outliers(
    df: pd.DataFrame, sweeps: Mapping[str, tuple[tuple[str, ...], str, float]] = SWEEPS
) -> pd.Series:
    """Rows of one device that their own sweep contradicts (a bool per row): measured more
    than OUTLIER_FACTOR x the time of a row of the same sweep with more work, or more than
    OUTLIER_FACTOR x the previous row's time scaled by the growth of the work (`sweeps`, by
    kind: the columns that fix a sweep, the one it walks, the power of it the work grows
    with). No kernel takes longer for less work or grows faster than its work, so such a row
    is how that measurement went (a slow library heuristic, a clock dip), not what a model of
    the kernel can follow. `llmsim validate` marks them; they stay in every error figure."""
    out = pd.Series(False, index=df.index)
    for kind, (keys, x, power) in sweeps.items():
        rows = df[df["kind"] == kind]
        if rows.empty:
            continue
        rows = rows.sort_values([*keys, x])
        groups = rows.groupby(list(keys), dropna=False)
        t = rows["measured_s"]
        later = groups["measured_s"].transform(
            lambda s: s[::-1].cummin().shift(1, fill_value=np.inf)[::-1]
        )
        growth = np.maximum((rows[x] / groups[x].shift(1)) ** power, 1.0)
        before = groups["measured_s"].shift(1) * growth
        out[rows.index] = (t > OUTLIER_FACTOR * later) | (t > OUTLIER_FACTOR * before)
    return out


def device_ops(hw: HardwareSpec, device: str) -> pd.DataFrame:
    """The ops suite's rows for one aiconfigurator system folder, predicted on `hw` as the data
    were measured (GEMMs on uninitialised weights: no data ceiling); `sweep_outlier` marks the
    rows `sweep_outliers` finds."""
    hw = hw.without_data_ceiling()
    parts = [
        gemm_cases(hw, data.aiconfigurator(device, "gemm")),
        attention_cases(hw, data.aiconfigurator(device, "context_attention"), phase="prefill"),
        attention_cases(hw, data.aiconfigurator(device, "generation_attention"), phase="decode"),
        collective_cases(hw, data.aiconfigurator(device, "nccl")),
    ]
    parts = [p for p in parts if not p.empty]
    df = pd.concat(parts, ignore_index=True).assign(device=hw.id)
    return df.assign(sweep_outlier=sweep_outliers(df))


def default_hardware(devices: Mapping[str, str]) -> dict[str, HardwareSpec]:
    """Load the hardware spec of each data folder in a folder -> hardware id mapping."""
    return {folder: load_hardware(hw_id) for folder, hw_id in devices.items()}


def ops_suite(hardware: Mapping[str, HardwareSpec] | None = None) -> pd.DataFrame:
    """The `ops` suite on every aiconfigurator device. `hardware` maps a data folder
    (`a100_sxm`, `h100_sxm`) to the spec to predict with; default: data.AIC_DEVICES.
    `fitted` is True: these rows are what calibration fits the efficiency factors to.
    The default is computed once per loaded set of specs (a fresh copy each call)."""
    if hardware is not None:
        return _ops_suite(hardware)
    specs = default_hardware(data.AIC_DEVICES)
    key = tuple((folder, id(hw)) for folder, hw in specs.items())
    if _DEFAULT.get("key") != key:
        if "key" in _DEFAULT:  # specs reloaded (forget_loaded_specs): predict again
            store.forget(SUITE)
        rows = store.stored(SUITE, lambda: _ops_suite(specs))
        _DEFAULT.update(key=key, specs=specs, rows=rows)
    return _DEFAULT["rows"].copy()


# The default suite's rows and the specs they were predicted with (held, so that their ids,
# the key, cannot be reused by other objects).
_DEFAULT: dict[str, Any] = {}


def _ops_suite(specs: Mapping[str, HardwareSpec]) -> pd.DataFrame:
    frames = [device_ops(hw, folder) for folder, hw in specs.items()]
    return finish(pd.concat(frames, ignore_index=True), suite=SUITE, fitted=True)
