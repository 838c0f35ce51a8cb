"""How a model is laid out on devices: parallelism and precision. Pure validated data."""

from __future__ import annotations

import math
from typing import Literal, get_args

from pydantic import Field

from simulator.errors import SpecError
from simulator.specs._base import MAX_TOKENS, Frozen
from simulator.specs.hardware import HardwareSpec
from simulator.specs.model import ModelSpec, WeightDtype

# Weight formats a checkpoint may be quantised to: 8-bit (W8A8 where the device has the matrix
# unit), AWQ/GPTQ int4 (weight-only) and NVFP4 (4-bit e2m1 in blocks of 16 with an fp8 scale;
# W4A4 on devices with an fp4 matrix unit, weight-only elsewhere).
Quantization = Literal["fp8", "int8", "int4", "fp4"]
# Formats a matrix unit computes in directly (W8A8, NVFP4 W4A4), with the activations quantised
# to the same format first; int4 has no such unit and is always weight-only.
QUANTISED_COMPUTE = ("fp8", "int8", "fp4")


class Parallelism(Frozen):
    """Tensor (tp), pipeline (pp), data (dp, replicas) and expert (ep) parallel sizes.

    One replica spans tp * pp devices. Experts are split over `ep` groups inside the TP group
    and each expert's FFN over the remaining tp / ep devices (ep = tp: whole experts per GPU).
    Wide EP (ep = tp * dp > tp): DP attention, as vLLM's `--data-parallel-size N
    --enable-expert-parallel` and SGLang's `--enable-dp-attention` run it: dp attention ranks
    of tp devices each, coupled by MoE layers whose experts spread over all tp * dp devices.
    `expert_load_imbalance`: tokens on the busiest EP rank over the mean (1 = balanced).
    """

    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    dp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    expert_load_imbalance: float = Field(default=1.0, ge=1.0)

    @property
    def devices_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def num_devices(self) -> int:
        return self.tp * self.pp * self.dp

    def check(self, model: ModelSpec, hw: HardwareSpec, *, source: str = "layout") -> None:
        """Raise SpecError if this layout cannot run `model` on `hw`."""
        attn = model.attention
        if attn.num_heads % self.tp:
            raise SpecError(
                f"tensor parallel size {self.tp} does not divide the {attn.num_heads} "
                f"attention heads of {model.id or model.name}",
                source=source,
                field="tensor_parallel_size",
            )
        kv = attn.num_kv_heads
        if attn.kind != "mla" and kv % self.tp and self.tp % kv:
            raise SpecError(
                f"tensor parallel size {self.tp} neither divides nor is a multiple of the "
                f"{kv} KV heads",
                source=source,
                field="tensor_parallel_size",
            )
        if self.pp > model.num_layers:
            raise SpecError(
                f"pipeline parallel size {self.pp} exceeds the {model.num_layers} layers",
                source=source,
                field="pipeline_parallel_size",
            )
        if self.ep > 1:
            if model.moe is None:
                raise SpecError("expert parallelism needs a MoE model", source=source, field="ep")
            wide = self.ep == self.tp * self.dp and self.dp > 1  # DP attention
            if (self.tp % self.ep and not wide) or model.moe.num_experts % self.ep:
                raise SpecError(
                    f"expert parallel size {self.ep} must divide the tensor parallel size "
                    f"{self.tp} (or equal tp x dp = {self.tp * self.dp}, DP attention) and "
                    f"the {model.moe.num_experts} experts",
                    source=source,
                    field="ep",
                )
        if self.expert_load_imbalance > self.ep:
            raise SpecError(
                f"{self.expert_load_imbalance} is more than the busiest of {self.ep} EP ranks "
                f"can hold ({self.ep}x the mean: every token on it)",
                source=source,
                field="expert_load_imbalance",
            )
        if self.tp > hw.interconnect.gpus_per_node:
            raise SpecError(
                f"tensor parallel size {self.tp} exceeds the {hw.interconnect.gpus_per_node} "
                f"GPUs of one {hw.id} node",
                source=source,
                field="tensor_parallel_size",
            )


KvEvictionPolicy = Literal["snapkv", "h2o", "streaming"]


class KvEviction(Frozen):
    """A KV token budget: each sequence keeps at most `budget_tokens` tokens of KV once its
    prompt is in, chosen by `policy` (quality effects are not modelled):

    - `snapkv` (Li et al., arXiv 2404.14469): at the end of prefill the last
      `observation_window` prompt tokens' attention to the prompt scores its positions (pooled,
      top-k per head) and the prompt keeps `budget_tokens` of them; generated tokens are all
      kept, as SnapKV compresses the prompt only.
    - `h2o` (Zhang et al., arXiv 2306.14048): heavy hitters plus recent tokens, `budget_tokens`
      in all; each decode step accumulates the step's attention weights per cached token and
      evicts the lowest.
    - `streaming` (StreamingLLM, Xiao et al., arXiv 2309.17453): attention sinks plus a window
      of the most recent tokens, `budget_tokens` in all; eviction is a ring buffer's index, no
      kernel.

    The prompt is held whole while it is prefilled (every policy scores or evicts after)."""

    budget_tokens: int = Field(gt=0, le=MAX_TOKENS)
    policy: KvEvictionPolicy = "snapkv"
    # SnapKV's observation window: the last 32 prompt tokens (arXiv 2404.14469, sec. 5: window
    # size 32, pooling kernel 7).
    observation_window: int = Field(default=32, gt=0, le=MAX_TOKENS)

    def held(self, computed: int, prompt: int) -> int:
        """Tokens of KV a sequence of `prompt` prompt tokens keeps with `computed` computed."""
        if computed <= prompt:
            return computed
        if self.policy == "snapkv":
            return min(prompt, self.budget_tokens) + computed - prompt
        return min(computed, self.budget_tokens)

    @property
    def decode_cap(self) -> float:
        """The most KV tokens a decode attends to (SnapKV: no cap, generated tokens stay)."""
        return math.inf if self.policy == "snapkv" else float(self.budget_tokens)


class Precision(Frozen):
    """Resolved precisions: what the weights are stored in, what the matrix units compute in,
    what the KV cache holds, and what activations are kept in between kernels."""

    weights: WeightDtype
    compute: Literal["fp32", "bf16", "fp16", "fp8", "int8", "fp4"]
    kv_cache: Literal["fp32", "bf16", "fp16", "fp8", "int4", "int2"]
    activations: Literal["fp32", "bf16", "fp16"]
    kv_eviction: KvEviction | None = None  # a KV token budget (None: every token kept)

    @property
    def weight_only(self) -> bool:
        """True when quantized weights are dequantised and multiplied in 16-bit."""
        return self.weights in get_args(Quantization) and self.compute in ("bf16", "fp16")


# vLLM's --kv-cache-dtype values, and the sub-8-bit formats of `specs.model.KV_QUANT_FORMATS`
# (KIVI's int2, COMET's int4), which vLLM does not serve.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bf16", "fp16", "int4", "int2")


def resolve_precision(
    model: ModelSpec,
    hw: HardwareSpec,
    *,
    dtype: str = "auto",
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
) -> Precision:
    """vLLM's rules: `auto` takes the model's dtype (fp32 checkpoints serve in bf16);
    fp8/int8 weights run W8A8 and NVFP4 (fp4) W4A4 where the device has the matrix unit,
    weight-only otherwise (Marlin); int4 is always weight-only."""
    dtypes = {"auto": model.dtype, "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
    if dtype not in dtypes and dtype not in ("bf16", "fp16"):
        raise SpecError(f"unknown dtype {dtype!r} (auto, bfloat16, float16)", field="dtype")
    act = dtypes.get(dtype, dtype)
    if act == "fp32":
        act = "bf16"
    weights = quantization or (model.weight_dtype if model.weight_dtype != "fp32" else act)
    if weights in ("bf16", "fp16"):
        weights = act
    compute = weights if weights in QUANTISED_COMPUTE and hw.supports(weights) else act
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise SpecError(
            f"unknown KV cache dtype {kv_cache_dtype!r} (auto, fp8, int4, int2)",
            field="kv_cache_dtype",
        )
    kv = (
        act
        if kv_cache_dtype == "auto"
        else ("fp8" if kv_cache_dtype.startswith("fp8") else kv_cache_dtype)
    )
    return Precision(weights=weights, compute=compute, kv_cache=kv, activations=act)
