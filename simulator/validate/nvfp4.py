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

`b200_moe.csv` holds one more held-out family (suite `ops_nvfp4`, kind `fused_moe`): F1,
flashinfer-ai/flashinfer PR #3976 (2026-07-21), TensorRT-LLM's trtllm-gen NVFP4 fused MoE
(FlashInfer's `trtllm` backend) on one B200, `benchmarks/bench_moe_deepseek.py`: DeepSeek-V3's
MoE layer (256 experts, top 8, hidden 7168, intermediate 2048, EP 1, TP 1), 1-64 tokens, CUDA
graph, CUPTI; routing, both expert GEMMs and the finalize timed, the initial activation
quantisation not. They are priced as the serving model prices a MoE layer
(`costmodel.ffn_ops.moe_ops` without the router GEMM, whose logits the benchmark is given)
under the `trtllm` profile, in NVFP4.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import deployment
from simulator.costmodel.ffn_ops import moe_ops
from simulator.costmodel.op import gemm
from simulator.costmodel.roofline import evaluate, total_time
from simulator.specs import load_engine, load_hardware
from simulator.specs.deployment import Precision
from simulator.specs.hardware import HardwareSpec
from simulator.validate import data
from simulator.validate.frame import empty, finish_split
from simulator.validate.moe import _shape_model
from simulator.validate.operators import Group, cases

SUITE = "ops_nvfp4"
FIT_SUITE = "ops_nvfp4_fit"
DEVICE = "b200"
FIT_SOURCE = "V1"
COLUMNS = ["source", "hardware", "kernel", "m", "n", "k", "tflops", "latency_us"]
MOE_COLUMNS = [
    "source",
    "hardware",
    "kernel",
    "num_experts",
    "top_k",
    "hidden_size",
    "intermediate_size",
    "tokens",
    "latency_us",
]
MOE_ENGINE = "trtllm"
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


def measured_moe() -> pd.DataFrame:
    """The bundled B200 NVFP4 fused-MoE timings."""
    return data.read_measured("nvfp4/b200_moe.csv", MOE_COLUMNS)


def moe_predict_s(rows: pd.DataFrame, hw: HardwareSpec) -> np.ndarray:
    """Seconds of one NVFP4 MoE layer per row on `hw` under the `trtllm` profile."""
    out = np.zeros(len(rows))
    shape = ["num_experts", "top_k", "hidden_size", "intermediate_size"]
    for key, group in rows.groupby(shape, sort=False):
        experts, top_k, hidden, inter = (int(v) for v in key)
        model = _shape_model(experts, top_k, hidden, inter)
        dep = deployment(
            model=model, hardware=hw, engine=load_engine(MOE_ENGINE), quantization="fp4"
        )
        batch = BatchShape(prefill_tokens=group["tokens"].to_numpy(dtype=float))
        ops = [op for op in moe_ops(model, dep.layout, dep.precision, batch) if op.name != "router"]
        seconds = np.ravel(total_time(evaluate(ops, dep.hardware, dep.engine)))
        out[rows.index.get_indexer(group.index)] = seconds
    return out


def moe_cases(hw: HardwareSpec) -> pd.DataFrame:
    """The fused-MoE rows (all held out) with their predictions on `hw`."""
    rows = measured_moe().reset_index(drop=True)
    case = [
        f"{r.source} moe nvfp4 E{r.num_experts} top{r.top_k} {r.hidden_size}x"
        f"{r.intermediate_size} m={r.tokens}"
        for r in rows.itertuples()
    ]
    return rows.assign(
        kind="fused_moe",
        case=case,
        predicted_s=moe_predict_s(rows, hw),
        measured_s=rows["latency_us"].to_numpy(dtype=float) * 1e-6,
    )


def nvfp4_suite(hw: HardwareSpec | None = None) -> pd.DataFrame:
    """Both suites' rows on `hw` (default: the B200 spec): `ops_nvfp4` (held out: GEMMs, then
    fused MoE layers) first, then `ops_nvfp4_fit`."""
    hw = load_hardware(DEVICE) if hw is None else hw
    frames = []
    for fitted in (False, True):
        part = cases(hw, device_groups(fitted=fitted))
        if not part.empty:
            frames.append(part.assign(fit_row=fitted))
        if not fitted:
            frames.append(moe_cases(hw).assign(fit_row=False))
    if not frames:
        return empty(SUITE)
    df = pd.concat(frames, ignore_index=True).assign(device=hw.id)
    mask = df.pop("fit_row").to_numpy(dtype=bool)
    return finish_split(df, mask, suite=SUITE, fit_suite=FIT_SUITE)
