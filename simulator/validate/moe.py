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

Source A1: aiconfigurator's tables of the same kernel in vLLM 0.14.0 (H100, H200) and 0.19.0
(B200) (`aiconfigurator/<device>/moe.csv`, `data.aiconfigurator_moe`):
`fused_experts` alone (routing given: no top-k, no router), under balanced routing (each token
on experts of its own, so `min(E, tokens x top_k)` experts are hit, not uniform routing's
expectation), in bf16, fp8 and block-fp8 (priced as llmsim's fp8), for eleven MoE shapes at
tensor x expert parallel layouts of one node (`tensor_parallel`, `expert_parallel`; the
`intermediate_size` column is then each expert's full size). Its H100 bf16 rows of shapes
vLLM 0.14.0 ships no configuration file for (`untuned`) are what the profile's
`fused_moe_default_fraction` is fitted to (`fit_default_fraction`), in `moe_fit` too; the rest
of A1 is held out.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

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
from simulator.specs.loader import NO_MOE_CONFIGS, tuned_moe_shapes
from simulator.specs.model import ModelSpec
from simulator.validate import data
from simulator.validate.data import AIC_DEVICES, AIC_MOE_DEVICES, AIC_VLLM
from simulator.validate.frame import finish_split

SUITE, FIT_SUITE = "moe", "moe_fit"
# the `vllm` profile's fused_moe_configs, which A1 ran on H100 and H200
LISTED_RELEASE = "vllm-0.14.0"
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


# The configuration each source's kernel ran with, as the rows are priced (`kernel_config`):
# `listed`, the one the `vllm` profile's release ships for the shape, else its default;
# `tuned`; `default`, vLLM's default configuration before vllm-project/vllm PR #34846
# (merged 2026-02-18: batch-aware tiles and warps, "up to 2x" at large batches), which is what
# `fused_moe_default_fraction` prices. The defaults after it run within 5-11% of a tuned
# configuration (K2's and K4's default and tuned columns; A1 on B200, vLLM 0.19.0): priced as
# tuned.
AFTER_NEW_DEFAULTS = {"K2", "K4"}  # benchmark_moe.py runs dated after PR #34846


def _kernel_config(source: str, config: str) -> str:
    """A K-source row's `kernel_config` (see above)."""
    return "tuned" if config == "tuned" or source in AFTER_NEW_DEFAULTS else "default"


def measured() -> pd.DataFrame:
    """The bundled fused-MoE timings (benchmark_moe.py's: one GPU, uniform routing)."""
    rows = data.read_measured("moe/fused_moe.csv", COLUMNS)
    configs = [_kernel_config(s, c) for s, c in zip(rows["source"], rows["config"], strict=True)]
    return rows.assign(
        tensor_parallel=1, expert_parallel=1, routing="uniform", kernel_config=configs
    )


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


LAYOUT = ["tensor_parallel", "expert_parallel", "routing", "kernel_config"]
# `kernel_config` -> the engine's fused_moe_configs that prices it (`listed`: the profile's own)
CONFIGS: dict[str, str | None] = {"tuned": None, "default": NO_MOE_CONFIGS}
# what a call of each source runs besides the expert GEMMs: benchmark_moe.py times fused_topk
# too; aiconfigurator's fused_experts is given the routing
NOT_RUN = {"uniform": ("router",), "balanced": ("router", "topk_softmax")}


def predict_s(rows: pd.DataFrame, engine: EngineSpec) -> np.ndarray:
    """Seconds of one fused-MoE call per row under `engine` (rows with the LAYOUT columns)."""
    out = np.zeros(len(rows))
    for key, group in rows.groupby(["hardware", *SHAPE, *LAYOUT], sort=False):
        hardware, experts, top_k, hidden, inter, dtype, tp, ep, routing, config = key
        model = _shape_model(int(experts), int(top_k), int(hidden), int(inter))
        if config != "listed":
            engine_ = engine.model_copy(update={"fused_moe_configs": CONFIGS[str(config)]})
        else:
            engine_ = engine
        dep = deployment(
            model=model,
            hardware=str(hardware),
            engine=engine_,
            tensor_parallel_size=int(tp),
            expert_parallel_size=int(ep),
            quantization="fp8" if str(dtype).startswith("fp8") else None,
        )
        precision = dep.precision
        if dtype == "fp8_block":  # a block-wise fp8 checkpoint (its files and default)
            precision = precision.model_copy(update={"fp8_blocks": True})
        tokens = group["tokens"].to_numpy(dtype=float)
        batch = BatchShape(prefill_tokens=tokens)
        hit = np.minimum(float(experts), tokens * int(top_k)) if routing == "balanced" else None
        ops = [
            op
            for op in moe_ops(model, dep.layout, precision, batch, experts_hit_by=hit)
            if op.name not in NOT_RUN[str(routing)]
        ]
        seconds = np.ravel(total_time(evaluate(ops, dep.hardware, dep.engine)))
        out[rows.index.get_indexer(group.index)] = seconds
    return out


def aiconfigurator_rows() -> pd.DataFrame:
    """The A1 rows in the suite's columns (see the module doc)."""
    frames = []
    for folder in AIC_MOE_DEVICES:
        t = data.aiconfigurator_moe(folder)
        frames.append(
            pd.DataFrame(
                {
                    "source": "A1",
                    "hardware": AIC_DEVICES[folder],
                    "gpu": folder,
                    "kernel": "vllm_triton_fused_moe",
                    "config": f"vllm {AIC_VLLM[folder]}",
                    "dtype": t["moe_dtype"].replace({"bfloat16": "bf16"}),
                    "num_experts": t["num_experts"],
                    "top_k": t["topk"],
                    "hidden_size": t["hidden_size"],
                    "intermediate_size": t["inter_size"],
                    "tokens": t["num_tokens"],
                    "latency_us": t["latency_ms"] * 1e3,
                    "tensor_parallel": t["moe_tp_size"] * t["moe_ep_size"],
                    "expert_parallel": t["moe_ep_size"],
                    "routing": "balanced",
                    # vLLM 0.14.0 as the `vllm` profile; 0.19.0's defaults as tuned (above)
                    "kernel_config": "listed"
                    if f"vllm-{AIC_VLLM[folder]}" == LISTED_RELEASE
                    else "tuned",
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def untuned(rows: pd.DataFrame) -> np.ndarray:
    """Which `listed` rows run vLLM's default configuration: their shape (local experts,
    intermediate size per shard) has no file in the profile's release for their device."""
    out = np.zeros(len(rows), dtype=bool)
    for i, r in enumerate(rows.itertuples()):
        if r.kernel_config != "listed":
            continue
        shard = int(r.tensor_parallel) // int(r.expert_parallel)
        key = (
            int(r.num_experts) // int(r.expert_parallel),
            int(r.intermediate_size) // shard,
            str(r.dtype),  # bf16, fp8 (per tensor) or fp8_block, as the files are listed
        )
        out[i] = key not in tuned_moe_shapes(LISTED_RELEASE, str(r.hardware))
    return out


DEFAULT_DTYPES = ("bf16", "fp8")  # the default configuration's fractions fitted (not fp8_block)
BLOCK_DTYPE = "fp8_block"  # block-wise fp8: a fused_moe_fraction of its own


def _fits(rows: pd.DataFrame) -> np.ndarray:
    """The rows the fractions were fitted to: benchmark_moe.py's bf16 rows on H100 (tuned),
    A1's bf16 and per-tensor fp8 rows on H100 that ran vLLM 0.14.0's default configuration,
    and A1's block-wise fp8 rows on H100."""
    h100 = (rows["hardware"] == FIT_HARDWARE).to_numpy()
    k_rows = ((rows["source"] != "A1") & (rows["dtype"] == FIT_DTYPE)).to_numpy()
    default = untuned(rows) & rows["dtype"].isin(DEFAULT_DTYPES).to_numpy()
    blocks = ((rows["source"] == "A1") & (rows["dtype"] == BLOCK_DTYPE)).to_numpy()
    return h100 & (k_rows | default | blocks)


def _layout(row: Any) -> str:
    tp, ep = row.tensor_parallel, row.expert_parallel
    return "" if (tp, ep) == (1, 1) else f" tp{tp} ep{ep}"


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
                f"{r.dtype} {r.config}{_layout(r)} m={r.tokens}"
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
    rows = pd.concat([measured(), aiconfigurator_rows()], ignore_index=True)
    return moe_cases(rows, load_engine("vllm"))


def moe_suite() -> pd.DataFrame:
    """The `moe` and `moe_fit` rows (computed once per process; a fresh copy each call)."""
    return _suite().copy()


def _least_squares(rows: pd.DataFrame, field: str, base: EngineSpec, dtype: str) -> float:
    """The value of the engine's `field` for `dtype` that best predicts `rows` (least squares
    on the log of predicted / measured)."""
    seconds = rows["latency_us"].to_numpy(dtype=float) * 1e-6

    def loss(fraction: float) -> float:
        engine = base.model_copy(update={field: {**getattr(base, field), dtype: fraction}})
        return float(np.sum(np.log(predict_s(rows, engine) / seconds) ** 2))

    return float(minimize_scalar(loss, bounds=(0.05, 1.0), method="bounded").x)


def fit_fraction() -> float:
    """The `vllm` profile's fused_moe_fraction for bf16: the compute-efficiency factor that
    best predicts benchmark_moe.py's H100 bf16 rows (a tuned configuration)."""
    rows = measured()
    rows = rows[_fits(rows)].reset_index(drop=True)
    return _least_squares(rows, "fused_moe_fraction", load_engine("vllm"), FIT_DTYPE)


def fit_block_fraction() -> float:
    """The `vllm` profile's fused_moe_fraction for block-wise fp8: what best predicts A1's H100
    block-wise fp8 rows, with a file or not (its default configuration is close to tuned
    ones; the kernel's per-block scaling is the cost)."""
    return _fit_a1("fused_moe_fraction", BLOCK_DTYPE)


def fit_default_fraction(dtype: str = FIT_DTYPE) -> float:
    """The `vllm` profile's fused_moe_default_fraction for `dtype` (bf16, or fp8 per tensor):
    what best predicts A1's H100 rows of it that ran vLLM 0.14.0's default configuration, the
    tuned fraction as fitted."""
    return _fit_a1("fused_moe_default_fraction", dtype)


def _fit_a1(field: str, dtype: str) -> float:
    """The `vllm` profile's `field` for `dtype` that best predicts A1's H100 rows of it kept
    for fitting (`_fits`)."""
    rows = aiconfigurator_rows()
    rows = rows[_fits(rows) & (rows["dtype"] == dtype).to_numpy()].reset_index(drop=True)
    return _least_squares(rows, field, load_engine("vllm"), dtype)


def main(argv: list[str]) -> int:
    """`python -m simulator.validate.moe --fit`: print the fitted fractions."""
    if argv != ["--fit"]:
        print("usage: python -m simulator.validate.moe --fit", file=sys.stderr)
        return 2
    tuned = f"{FIT_DTYPE}: {fit_fraction():.3f}, {BLOCK_DTYPE}: {fit_block_fraction():.3f}"
    print(f"fused_moe_fraction: {{{tuned}}}")
    fractions = ", ".join(f"{d}: {fit_default_fraction(d):.3f}" for d in DEFAULT_DTYPES)
    print(f"fused_moe_default_fraction: {{{fractions}}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
