"""The `moe` suite: the fused MoE kernel vLLM (and SGLang) run for routed experts, timed alone.

Each row (`simulator/data/measured/moe/fused_moe.csv`, provenance in the README there) is one
call of vLLM's Triton `fused_moe` as its `benchmarks/kernels/benchmark_moe.py` times it: top-k
selection, the expert-sorting bookkeeping, both expert GEMMs with the activation between them,
and the sum of each token's top-k outputs, for `tokens` tokens routed uniformly over
`num_experts` experts of `hidden_size` x `intermediate_size` (per tensor-parallel shard), in
bf16 or fp8 (W8A8), with the kernel configuration vLLM ships for the device (`tuned`) or its
fallback heuristic (`default`). The model prices the same ops the serving model prices for a
MoE layer (`costmodel.ffn_ops.moe_ops`, without the router GEMM, which the benchmark does not
run), under the `vllm` engine profile.

The bf16 rows on H100 are what the profile's `fused_moe_fraction` (the kernel's compute
efficiency against the GEMM library's) is fitted to (`fit_fraction`; `python -m
simulator.validate.moe --fit` prints it): suite `moe_fit`. The rest (H100 fp8, H200, A100,
B200) is held out: suite `moe`.
"""

from __future__ import annotations

import sys
from functools import cache

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import deployment
from simulator.costmodel.ffn_ops import moe_ops
from simulator.costmodel.roofline import evaluate, total_time
from simulator.specs import load_engine
from simulator.specs.engine import EngineSpec
from simulator.specs.hf import from_hf_config
from simulator.specs.model import ModelSpec
from simulator.validate import data
from simulator.validate.frame import finish_split

SUITE, FIT_SUITE = "moe", "moe_fit"
FIT_DTYPE = "bf16"
FIT_HARDWARE = "h100_sxm"
COLUMNS = [
    "source",
    "hardware",
    "gpu",
    "kernel",
    "config",
    "dtype",
    "num_experts",
    "top_k",
    "hidden_size",
    "intermediate_size",
    "tokens",
    "latency_us",
]
SHAPE = ["num_experts", "top_k", "hidden_size", "intermediate_size", "dtype"]


def measured() -> pd.DataFrame:
    """The bundled fused-MoE timings."""
    return data.read_measured("moe/fused_moe.csv", COLUMNS)


@cache
def _shape_model(num_experts: int, top_k: int, hidden: int, inter: int) -> ModelSpec:
    """One MoE layer of the shape (the attention and vocabulary are never priced here)."""
    return from_hf_config(
        {
            "model_type": "qwen3_moe",
            "hidden_size": hidden,
            "num_hidden_layers": 1,
            "vocab_size": 32000,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "intermediate_size": inter,
            "num_experts": num_experts,
            "num_experts_per_tok": top_k,
            "moe_intermediate_size": inter,
            "torch_dtype": "bfloat16",
            "max_position_embeddings": 4096,  # a shape, never served
        },
        name=f"moe-e{num_experts}-k{top_k}-h{hidden}-n{inter}",
    )


def predict_s(rows: pd.DataFrame, engine: EngineSpec) -> np.ndarray:
    """Seconds of one fused-MoE call per row under `engine`."""
    out = np.zeros(len(rows))
    for key, group in rows.groupby(["hardware", *SHAPE], sort=False):
        hardware, experts, top_k, hidden, inter, dtype = key
        model = _shape_model(int(experts), int(top_k), int(hidden), int(inter))
        dep = deployment(
            model=model,
            hardware=str(hardware),
            engine=engine,
            quantization="fp8" if dtype == "fp8" else None,
        )
        batch = BatchShape(prefill_tokens=group["tokens"].to_numpy(dtype=float))
        ops = [op for op in moe_ops(model, dep.layout, dep.precision, batch) if op.name != "router"]
        seconds = np.ravel(total_time(evaluate(ops, dep.hardware, dep.engine)))
        out[rows.index.get_indexer(group.index)] = seconds
    return out


def _fits(rows: pd.DataFrame) -> np.ndarray:
    return ((rows["hardware"] == FIT_HARDWARE) & (rows["dtype"] == FIT_DTYPE)).to_numpy()


def moe_cases(rows: pd.DataFrame, engine: EngineSpec) -> pd.DataFrame:
    """One row per timing: suite `moe_fit` for the rows the fraction was fitted to, else
    `moe`."""
    rows = rows.reset_index(drop=True)
    df = pd.DataFrame(
        {
            "device": rows["hardware"],
            "kind": "fused_moe",
            "case": [
                f"E{r.num_experts} top{r.top_k} {r.hidden_size}x{r.intermediate_size} "
                f"{r.dtype} {r.config} m={r.tokens}"
                for r in rows.itertuples()
            ],
            "predicted_s": predict_s(rows, engine),
            "measured_s": rows["latency_us"].to_numpy(dtype=float) * 1e-6,
            **{c: rows[c] for c in ("source", "config", "dtype", "tokens")},
            **{c: rows[c] for c in ("num_experts", "top_k", "hidden_size", "intermediate_size")},
        }
    )
    fit = _fits(rows)
    return finish_split(df, fit, suite=SUITE, fit_suite=FIT_SUITE)


@cache
def _suite() -> pd.DataFrame:
    return moe_cases(measured(), load_engine("vllm"))


def moe_suite() -> pd.DataFrame:
    """The `moe` and `moe_fit` rows (computed once per process; a fresh copy each call)."""
    return _suite().copy()


def fit_fraction() -> float:
    """The `vllm` profile's fused_moe_fraction for bf16: the compute-efficiency factor that
    best predicts the H100 bf16 rows (least squares on the log of predicted / measured)."""
    rows = measured()
    rows = rows[_fits(rows)].reset_index(drop=True)
    seconds = rows["latency_us"].to_numpy(dtype=float) * 1e-6
    base = load_engine("vllm")

    def loss(fraction: float) -> float:
        engine = base.model_copy(update={"fused_moe_fraction": {FIT_DTYPE: fraction}})
        return float(np.sum(np.log(predict_s(rows, engine) / seconds) ** 2))

    return float(minimize_scalar(loss, bounds=(0.05, 1.0), method="bounded").x)


def main(argv: list[str]) -> int:
    """`python -m simulator.validate.moe --fit`: print the fitted fraction."""
    if argv != ["--fit"]:
        print("usage: python -m simulator.validate.moe --fit", file=sys.stderr)
        return 2
    print(f"fused_moe_fraction: {{{FIT_DTYPE}: {fit_fraction():.3f}}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
