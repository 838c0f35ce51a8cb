"""The `elementwise` suites: the memory-bound kernels of a layer against Vidur's timings.

Vidur's profiles (fp16, Sarathi-Serve on vLLM's kernels of 2024) time, per layer and per GPU
of a TP group, the kernels between the projection GEMMs: `input_layernorm` and
`post_attention_layernorm` (vLLM's RMSNorm), `attn_rope` (its rotary embedding, on the query
and key heads of the GPU), `mlp_act` (its SiLU-and-mul), each with one thread block per token,
and `add` (the residual add, a PyTorch elementwise op).

predicted = the cost model's price of each kernel (`roofline.evaluate` without an engine, which
runs vLLM's one-block-per-token kernels): its bytes at the device's streaming efficiency, and
for the first four no less than their launch costs (`costmodel.elementwise_kernels`: RMSNorm
reads and writes the hidden state, 2 x tokens x hidden x 2 bytes; rotary reads and writes the
GPU's query and key heads; SiLU-and-mul reads the gate and up halves and writes one, 3 x
tokens x intermediate / TP; the add reads two hidden states and writes one). The launch's
factors (`efficiency.memory.row_*`) are fitted (by `python -m simulator.calibrate`) to the
kernels of the models not in `layers.HELD_OUT` (suite `elementwise_fit`); Llama-2-70B's rows
are the held-out check (suite `elementwise`). The adds fit nothing: their price is the
GEMM-fitted streaming efficiency of every plain memory-bound kernel.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from simulator.costmodel.elementwise_kernels import gated_act, rms_norm, rotary
from simulator.costmodel.ops import Op, elementwise
from simulator.specs.hardware import HardwareSpec
from simulator.validate import data
from simulator.validate.frame import finish
from simulator.validate.layers import HELD_OUT, SHAPE, local_shape, profile_rows, row_case
from simulator.validate.operators import Group, default_hardware, op_time

SUITE = "elementwise"
FIT = "elementwise_fit"
HALF = 2.0  # fp16 bytes
MEDIANS = {op: f"time_stats.{op}.median" for op in data.VIDUR_ELEMENTWISE}
NORMS = ("input_layernorm", "post_attention_layernorm")


def kernel_ops(rows: pd.DataFrame) -> dict[str, Op]:
    """The op of each kernel, vectorised over the rows (shapes TP-sharded as in `layers`)."""
    t = rows["num_tokens"].to_numpy(dtype=float)
    h, d, q_local, kv_local, inter = local_shape(rows)
    norm = rms_norm("norm", t, h, act_bytes=HALF, count=1, tensors=2.0)  # vLLM's, no residual
    return {
        **dict.fromkeys(NORMS, norm),
        "attn_rope": rotary(t, q_local, kv_local, d, act_bytes=HALF, count=1),
        "mlp_act": gated_act("act", t, inter, act_bytes=HALF, count=1),
        "add": elementwise("add", bytes_=3.0 * t * h * HALF, count=1),
    }


def _case(rows: pd.DataFrame, name: str) -> pd.Series:
    return name + " " + row_case(rows)


def elementwise_groups(measured: pd.DataFrame) -> list[Group]:
    """The one-block-per-token kernels' times in the profile rows of the models not HELD_OUT,
    as operator groups (`latency_ms`) for the calibration of the launch factors."""
    rows = profile_rows(measured[~measured["model"].isin(HELD_OUT)], list(MEDIANS.values()))
    return [
        Group(name, rows.assign(latency_ms=rows[MEDIANS[name]]), op, _case(rows, name))
        for name, op in kernel_ops(rows).items()
        if op.launch is not None
    ]


def elementwise_cases(hw: HardwareSpec, measured: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, TP, num_tokens, kernel) of a Vidur profile (as `data.vidur`
    returns it), predicted on `hw`: suite `elementwise` for the HELD_OUT model,
    `elementwise_fit` for the others."""
    rows = profile_rows(measured, list(MEDIANS.values()))
    keys = ["model", *SHAPE, "num_tensor_parallel_workers", "num_tokens"]
    frames = []
    for name, op in kernel_ops(rows).items():
        frames.append(
            rows[keys].assign(
                kind=name,
                case=_case(rows, name),
                predicted_s=op_time(op, hw, len(rows)),
                measured_s=rows[MEDIANS[name]].to_numpy(dtype=float) / 1e3,
                device=hw.id,
            )
        )
    df = pd.concat(frames, ignore_index=True)
    held_out = df["model"].isin(HELD_OUT)
    checks = finish(df[held_out], suite=SUITE, fitted=False)
    return pd.concat([checks, finish(df[~held_out], suite=FIT, fitted=True)], ignore_index=True)


def elementwise_suite(hardware: Mapping[str, HardwareSpec] | None = None) -> pd.DataFrame:
    """The `elementwise` and `elementwise_fit` suites on every Vidur device. `hardware` maps a
    data folder (`a100`, `h100`) to the spec to predict with; default: data.VIDUR_DEVICES."""
    specs = default_hardware(data.VIDUR_DEVICES) if hardware is None else hardware
    frames = [elementwise_cases(hw, data.vidur(folder)) for folder, hw in specs.items()]
    return pd.concat(frames, ignore_index=True)
