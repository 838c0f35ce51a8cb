"""How a model is laid out on devices: parallelism and precision. Pure validated data."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import numpy as np
from pydantic import Field

from simulator.errors import SpecError
from simulator.specs._base import MAX_TOKENS, Frozen
from simulator.specs.hardware import HardwareSpec
from simulator.specs.model import ModelSpec, WeightDtype
from simulator.specs.weights import (
    UNQUANTISED,
    LinearName,
    WeightFormats,
    bytes_per_weight,
    gguf_formats,
    mix,
    parse_gguf,
)

# Weight formats a checkpoint may be quantised to: 8-bit (W8A8 where the device has the matrix
# unit), AWQ/GPTQ int4 (weight-only) and NVFP4 (4-bit e2m1 in blocks of 16 with an fp8 scale;
# W4A4 on devices with an fp4 matrix unit, weight-only elsewhere).
Quantization = Literal["fp8", "int8", "int4", "fp4"]
# What an engine profile lists as its quantized kernels: those formats, and GGUF files
# (`--quantization gguf:Q4_K_M`: llama.cpp's block formats, weight-only).
KernelFormat = Literal["fp8", "int8", "int4", "fp4", "gguf"]
# Formats a matrix unit computes in directly (W8A8, NVFP4 W4A4), with the activations quantised
# to the same format first; int4 has no such unit and is always weight-only.
QUANTISED_COMPUTE = ("fp8", "int8", "fp4")


class Parallelism(Frozen):
    """Tensor (tp), pipeline (pp), context (cp), data (dp, replicas) and expert (ep) sizes.

    One replica spans tp * pp * cp devices. Context parallelism (`cp` > 1) splits every
    sequence's tokens and KV over cp ranks of tp devices each (ring attention for prefill, a
    sharded KV cache for decode: `costmodel.ops`); ranks are placed tp innermost, then cp, then
    pp, so a CP group of tp * cp > gpus_per_node devices spans nodes. A TP group may span
    nodes too when tp is a multiple of gpus_per_node (whole nodes, joined by each GPU's NIC):
    its all-reduces and all-gathers then run hierarchically (`costmodel.roofline`).

    Experts are split over `ep` groups inside the TP group and each expert's FFN over the
    remaining tp / ep devices (ep = tp: whole experts per GPU).
    Wide EP (ep = tp * dp > tp): DP attention, as vLLM's `--data-parallel-size N
    --enable-expert-parallel` and SGLang's `--enable-dp-attention` run it: dp attention ranks
    of tp devices each, coupled by MoE layers whose experts spread over all tp * dp devices.
    `expert_load_imbalance`: tokens on the busiest EP rank over the mean (1 = balanced).
    """

    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    cp: int = Field(default=1, ge=1)
    dp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    expert_load_imbalance: float = Field(default=1.0, ge=1.0)

    @property
    def devices_per_replica(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def num_devices(self) -> int:
        return self.devices_per_replica * self.dp

    def cp_crosses_nodes(self, gpus_per_node: int) -> bool:
        """Whether a context-parallel group (cp ranks of tp devices) spans nodes: its ring and
        gathers then run over the scale-out network, the slowest hop setting their pace."""
        return self.cp > 1 and self.tp * self.cp > gpus_per_node

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
        g = hw.interconnect.gpus_per_node
        if self.tp > g and self.tp % g:
            raise SpecError(
                f"tensor parallel size {self.tp} exceeds the {g} GPUs of one {hw.id} node and "
                f"is not a multiple of them: a TP group spanning nodes must fill whole nodes",
                source=source,
                field="tensor_parallel_size",
            )
        if self.tp > g and hw.interconnect.topology == "pcie":
            raise SpecError(
                f"tensor parallel size {self.tp} spans {self.tp // g} {hw.id} nodes, which have "
                "no scale-out network (interconnect.topology pcie: no RDMA NIC per GPU)",
                source=source,
                field="tensor_parallel_size",
            )
        self._check_context_parallel(model, hw, source)

    def _check_context_parallel(self, model: ModelSpec, hw: HardwareSpec, source: str) -> None:
        if self.cp == 1:
            return
        field = "context_parallel_size"
        if model.attention.kind != "gqa":
            raise SpecError(
                f"context parallelism is modelled for GQA/MHA attention only, not the "
                f"{model.attention.kind.upper()} of {model.id or model.name}",
                source=source,
                field=field,
            )
        if self.ep > self.tp:
            raise SpecError(
                "context parallelism with DP attention (expert parallel size tp x dp) is not "
                "modelled",
                source=source,
                field=field,
            )
        g = hw.interconnect.gpus_per_node
        if self.cp_crosses_nodes(g) and g % self.tp and self.tp % g:
            raise SpecError(
                f"context parallel size {self.cp} x tensor parallel size {self.tp} spans "
                f"{hw.id} nodes of {g} GPUs, which {self.tp}-GPU tensor-parallel groups "
                "cannot tile: a TP group would straddle two nodes",
                source=source,
                field=field,
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

    def held_of(self, computed: np.ndarray | float, prompt: np.ndarray | float) -> np.ndarray:
        """`held`, elementwise over arrays of computed and prompt tokens."""
        c, p = np.asarray(computed, dtype=float), np.asarray(prompt, dtype=float)
        budget = float(self.budget_tokens)
        after = np.minimum(p, budget) + c - p if self.policy == "snapkv" else np.minimum(c, budget)
        return np.where(c <= p, c, after)

    @property
    def decode_cap(self) -> float:
        """The most KV tokens a decode attends to (SnapKV: no cap, generated tokens stay)."""
        return math.inf if self.policy == "snapkv" else float(self.budget_tokens)


class ShadowKV(Frozen):
    """ShadowKV (Sun et al., arXiv 2410.21465): each sequence's pre-RoPE keys kept on the GPU
    as a rank-`rank` factorisation, its values in host memory; post-RoPE chunk means of `chunk`
    tokens (landmarks) stay on the GPU, with an `outlier_share` of the chunks kept whole (K and
    V) as a static cache. Each decode step scores the landmarks, picks the chunks of a
    `budget`-token sparse set (outliers included), rebuilds their keys from the factors (a
    GEMM) while their values come over the host link (the paper's CUDA multi-streams overlap
    the two), and attends to them. Defaults: the paper's settings (sec. 5: rank 160, chunk 8,
    a 1.56% sparse budget, 2048 of a 128K context, and 0.3% of the chunks outliers)."""

    rank: int = Field(default=160, gt=0, le=65536)
    budget: int = Field(default=2048, gt=0, le=MAX_TOKENS)
    chunk: int = Field(default=8, gt=0, le=4096)
    outlier_share: float = Field(default=0.003, ge=0.0, lt=1.0)


class SwiftKV(Frozen):
    """SwiftKV (Qiao et al., arXiv 2410.03960): SingleInputKV computes the KV of the last
    `skip_fraction` of the layers from the output of the layer before them, so prompt tokens
    skip those layers (only their K/V projections run); AcrossKV (`across` > 1) shares one KV
    among `across` adjacent layers of the skipped ones, so they hold 1/`across` of their KV."""

    skip_fraction: float = Field(default=0.5, ge=0.0, lt=1.0)
    across: int = Field(default=1, ge=1, le=64)

    def skipped_layers(self, num_layers: int) -> int:
        """Layers prompt tokens skip (rounded down, at least one layer kept)."""
        return min(int(self.skip_fraction * num_layers), num_layers - 1)

    def kv_share(self, num_layers: int) -> float:
        """The share of the model's KV bytes a token holds (AcrossKV over the skipped layers)."""
        s = self.skipped_layers(num_layers)
        kept = num_layers - s + -(-s // self.across)
        return kept / num_layers


class Precision(Frozen):
    """Resolved precisions: what the weights are stored in, what the matrix units compute in,
    what the KV cache holds, and what activations are kept in between kernels. `weights` is
    the main format; `formats` the format of each linear where a checkpoint mixes them
    (unquantised ones read as `activations`; None: every linear in `weights`, the embedding
    and LM head in `activations`). `matrix_formats`: the quantised formats this device's
    matrix units compute in (W8A8, NVFP4 W4A4); any other runs weight-only in 16-bit."""

    weights: WeightDtype
    compute: Literal["fp32", "bf16", "fp16", "fp8", "int8", "fp4"]
    kv_cache: Literal["fp32", "bf16", "fp16", "fp8", "int4", "int2"]
    activations: Literal["fp32", "bf16", "fp16"]
    formats: WeightFormats | None = None
    matrix_formats: tuple[str, ...] = ()
    fp8_blocks: bool = False  # fp8 weights scaled per block (the checkpoint's own), not tensor
    kv_eviction: KvEviction | None = None  # a KV token budget (None: every token kept)
    shadowkv: ShadowKV | None = None  # low-rank keys on the GPU, values in host memory
    swiftkv: SwiftKV | None = None  # prompt tokens skip the last layers; AcrossKV sharing

    def kv_kept(self, computed: np.ndarray, prompt: float) -> np.ndarray:
        """The KV tokens sequences of `prompt` prompt tokens keep with `computed` computed: all
        of them, or what the KV token budget keeps (a window is the batch shape's)."""
        if self.kv_eviction is None:
            return computed
        return self.kv_eviction.held_of(computed, prompt)

    @property
    def weight_only(self) -> bool:
        """True when quantized weights are dequantised and multiplied in 16-bit."""
        return self.weights not in UNQUANTISED and self.compute in ("bf16", "fp16")

    def compute_of(self, fmt: str) -> str:
        """The dtype a GEMM on weights stored in `fmt` computes in."""
        if fmt == self.weights:
            return self.compute
        return fmt if fmt in self.matrix_formats else self.activations

    def gemm_weights(
        self, parts: Mapping[LinearName, float], layers: tuple[int, int]
    ) -> tuple[float, str, str]:
        """(bytes per weight, compute dtype, main format) of a GEMM whose weight joins `parts`
        (linear, share of the weights) in layers [start, stop): the layers' mean bytes, and
        the format most of its weights are in with the dtype it computes in."""
        if self.formats is None:
            if all(p in ("embed", "lm_head") for p in parts):
                return bytes_per_weight(self.activations), self.activations, self.activations
            return bytes_per_weight(self.weights), self.compute, self.weights
        wb, main = mix(self.formats, parts, layers)
        return wb, self.compute_of(main), main

    def layer_bytes(self, linear: LinearName, num_layers: int) -> tuple[float, ...]:
        """Bytes per weight of `linear` in each layer."""
        if self.formats is None:
            fmt = self.activations if linear in ("embed", "lm_head") else self.weights
            return (bytes_per_weight(fmt),) * num_layers
        return self.formats.layer_bytes(linear, num_layers)

    def table_bytes(self, linear: Literal["embed", "lm_head"]) -> float:
        """Bytes per weight of the embedding or the LM head."""
        if self.formats is None:
            return bytes_per_weight(self.activations)
        return bytes_per_weight(self.formats.format_of(linear))


def check_quantization(value: str | None) -> str | None:
    """`value` if it is a weight format llmsim prices (fp8, int8, int4, fp4, gguf:TYPE), else
    a ValueError saying which are."""
    if value is None or value in ("fp8", "int8", "int4", "fp4"):
        return value
    gguf = parse_gguf(value)
    if gguf is not None:
        try:
            gguf_formats(gguf, num_layers=1)
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        return value
    raise ValueError(
        f"unknown quantization {value!r} (fp8, int8, int4, fp4, or gguf:TYPE such as gguf:Q4_K_M)"
    )


def kernel_format(quantization: str) -> str:
    """The engine kernels a `--quantization` value needs (`EngineSpec.quantized_kernels`)."""
    return "gguf" if parse_gguf(quantization) is not None else quantization


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
    weight-only otherwise (Marlin); int4 and GGUF block formats are always weight-only. Without
    `quantization`, a checkpoint's own formats (`ModelSpec.weight_formats`) hold;
    `gguf:TYPE` gives llama.cpp's formats of that file type."""
    dtypes = {"auto": model.dtype, "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
    if dtype not in dtypes and dtype not in ("bf16", "fp16"):
        raise SpecError(f"unknown dtype {dtype!r} (auto, bfloat16, float16)", field="dtype")
    act = dtypes.get(dtype, dtype)
    if act == "fp32":
        act = "bf16"
    try:
        check_quantization(quantization)
    except ValueError as exc:
        raise SpecError(str(exc), field="quantization") from None
    formats = model.weight_formats
    weights: str
    if quantization is not None and (gguf := parse_gguf(quantization)) is not None:
        formats = gguf_formats(
            gguf,
            num_layers=model.num_layers,
            num_experts=model.moe.num_experts if model.moe else 1,
            tied_embeddings=model.tie_word_embeddings,
        )
        weights = formats.default
    elif quantization is not None and not (
        formats is not None and quantization == model.weight_dtype
    ):  # the flag naming the checkpoint's own method reads its formats, as vLLM does
        formats, weights = None, quantization
    else:
        weights = model.weight_dtype if model.weight_dtype != "fp32" else act
    if weights in UNQUANTISED:
        weights = act
    if formats is not None:
        formats = formats.resolved(act)
    matrix = tuple(f for f in QUANTISED_COMPUTE if hw.supports(f))
    compute = weights if weights in matrix else act
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
    return Precision(
        weights=weights,
        compute=compute,
        kv_cache=kv,
        activations=act,
        formats=formats,
        matrix_formats=matrix,
        # a block-wise fp8 checkpoint served as fp8 keeps its blocks (vLLM's Fp8Config)
        fp8_blocks=weights == "fp8" and model.weight_block_size is not None,
    )
