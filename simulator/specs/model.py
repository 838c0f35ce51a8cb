"""Transformer model specs: the architecture facts that change cost or memory.

A ModelSpec is built from a Hugging Face `config.json` (`simulator.specs.hf.from_hf_config`);
the built-in catalogue is a folder of such configs. Covered: dense MHA/GQA/MQA, DeepSeek MLA
(latent KV), compressed convolutional attention (CCA/CCGQA: attention in a latent), gated and
plain MLPs, MoE (routed experts, top-k, shared experts, leading dense layers), sliding-window
attention and hybrid local/global layouts, tied embeddings, the position encoding (rotary: a
kernel of its own per layer; ALiBi: inside attention). Not modelled: multi-token-prediction
heads (excluded from parameter counts, as published totals exclude them), vision towers.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Literal

from pydantic import Field, model_validator

from simulator.errors import SpecError
from simulator.specs._base import MAX_DIM, MAX_LAYERS, MAX_TOKENS, Frozen
from simulator.specs.weights import WeightDtype, WeightFormats

__all__ = ["DTYPE_BYTES", "MLP", "GQAttention", "MLAttention", "MoE", "ModelSpec", "WeightDtype"]
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "fp4": 0.5,
    "int2": 0.25,
}

# KV cache formats below 8 bits: (bits per element, elements per quantization group, each
# group carrying an fp16 scale and an fp16 zero point, recent tokens kept in 16 bits).
# int2: KIVI (Liu et al., arXiv 2402.02750, sec. 4 and 5.1): keys quantized per channel and
# values per token in groups of G = 32, the last R = 128 tokens held in full precision until
# a group of them is quantized. int4: COMET's KV4 (Liu et al., arXiv 2410.12168, FMPQ):
# groups of 128 channels with a scale and zero each, no full-precision window.
KV_QUANT_FORMATS: dict[str, tuple[int, int, int]] = {
    "int4": (4, 128, 0),
    "int2": (2, 32, 128),
}


def kv_bytes_per_elem(kv_dtype: str) -> float:
    """Bytes one cached K or V element occupies at `kv_dtype`, a low-bit format's scales and
    zero points (two fp16 per group) included."""
    if kv_dtype in KV_QUANT_FORMATS:
        bits, group, _ = KV_QUANT_FORMATS[kv_dtype]
        return bits / 8.0 + 4.0 / group
    return DTYPE_BYTES[kv_dtype]


def kv_residual_tokens(kv_dtype: str) -> int:
    """Recent tokens of each sequence a low-bit KV format keeps in 16 bits (KIVI's R)."""
    return KV_QUANT_FORMATS[kv_dtype][2] if kv_dtype in KV_QUANT_FORMATS else 0


class GQAttention(Frozen):
    """Multi-head attention with `num_kv_heads` K/V heads (MHA: = num_heads, MQA: 1)."""

    kind: Literal["gqa"] = "gqa"
    num_heads: int = Field(gt=0, le=MAX_DIM)
    num_kv_heads: int = Field(gt=0, le=MAX_DIM)
    head_dim: int = Field(gt=0, le=MAX_DIM)
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = Field(default=None, gt=0, description="tokens attended, or all")
    sliding_window_layers: int | None = Field(
        default=None,
        ge=0,
        le=MAX_LAYERS,
        description="layers that attend within sliding_window (the rest attend to all tokens: "
        "a hybrid local/global layout, as Gemma-2/3's layer_types); None: every layer",
    )

    @model_validator(mode="after")
    def _groups(self) -> GQAttention:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        return self

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def batch_window(self) -> int | None:
        """The window every layer attends within (a batch's attended KV is capped at it), or
        None: no window, or a hybrid layout whose global layers attend to all tokens."""
        return self.sliding_window if self.sliding_window_layers is None else None

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def kv_elems_per_token(self) -> int:
        """Cached K and V elements per token per layer."""
        return 2 * self.kv_dim

    def params(self, hidden: int) -> int:
        p = hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * hidden
        if self.qkv_bias:
            p += self.q_dim + 2 * self.kv_dim
        if self.o_bias:
            p += hidden
        if self.qk_norm:
            p += 2 * self.head_dim
        return p


class MLAttention(Frozen):
    """DeepSeek multi-head latent attention: K/V compressed to `kv_lora_rank` plus a shared
    rotary key of `qk_rope_head_dim`; only the latent is cached."""

    kind: Literal["mla"] = "mla"
    num_heads: int = Field(gt=0, le=MAX_DIM)
    q_lora_rank: int | None = Field(default=None, gt=0)
    kv_lora_rank: int = Field(gt=0, le=MAX_DIM)
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)
    sliding_window: None = None
    sliding_window_layers: None = None
    batch_window: None = None

    @property
    def num_kv_heads(self) -> int:
        return 1  # one latent shared by all heads

    @property
    def head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_elems_per_token(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def params(self, hidden: int) -> int:
        h, qk = self.num_heads, self.head_dim
        if self.q_lora_rank:
            q = hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * h * qk
        else:
            q = hidden * h * qk
        kv_a = hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv_b = self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
        o = h * self.v_head_dim * hidden
        return q + kv_a + kv_b + o


class CCAttention(GQAttention):
    """Compressed Convolutional (Grouped Query) Attention, CCA / CCGQA (Figliolia et al.,
    arXiv 2510.04476): queries, keys and values are down-projected to a latent of `num_heads`
    (queries) and `num_kv_heads` (keys, values) heads of `head_dim`, smaller than the hidden
    size by the compression factor, and attention runs inside that latent: the cache holds
    the latent K and V, and attention's FLOPs shrink with it. Before attention the latent
    queries and keys pass through two causal convolutions along the sequence, a depthwise one
    of `conv_kernels[0]` taps and one grouped by head of `conv_kernels[1]` taps (ZAYA1's
    `cca_time0` / `cca_time1`, both 2, transformers' configuration_zaya.py); values are half
    from the token and half from the one before (a value shift, no extra projection)."""

    kind: Literal["cca"] = "cca"  # type: ignore[assignment]
    conv_kernels: tuple[int, int] = (2, 2)

    @model_validator(mode="after")
    def _kernels(self) -> CCAttention:
        if min(self.conv_kernels) < 1:
            raise ValueError(f"conv_kernels must be at least 1, got {self.conv_kernels}")
        return self

    def compression(self, hidden: int) -> float:
        """How much smaller the query latent is than the hidden size (the paper's C)."""
        return hidden / self.q_dim

    def params(self, hidden: int) -> int:
        taps0, taps1 = self.conv_kernels
        channels = self.q_dim + self.kv_dim  # the convolved queries and keys
        return super().params(hidden) + channels * taps0 + channels * taps1 * self.head_dim


Attention = Annotated[GQAttention | CCAttention | MLAttention, Field(discriminator="kind")]


class MLP(Frozen):
    """Feed-forward block: gated (SwiGLU: gate, up, down) or plain (up, act, down)."""

    intermediate_size: int = Field(gt=0, le=MAX_DIM)
    gated: bool = True
    bias: bool = False

    @property
    def num_matrices(self) -> int:
        return 3 if self.gated else 2

    def params(self, hidden: int) -> int:
        p = self.num_matrices * hidden * self.intermediate_size
        if self.bias:
            p += (self.num_matrices - 1) * self.intermediate_size + hidden
        return p


class MoE(Frozen):
    """Mixture of experts replacing the MLP in layers >= `first_dense_layers`."""

    num_experts: int = Field(gt=1, le=MAX_DIM)
    top_k: int = Field(gt=0)
    expert: MLP
    num_shared_experts: int = Field(default=0, ge=0)
    shared_expert: MLP | None = None
    first_dense_layers: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> MoE:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        if self.num_shared_experts and self.shared_expert is None:
            raise ValueError("num_shared_experts > 0 needs shared_expert")
        return self

    def params(self, hidden: int, *, active: bool) -> int:
        routed = self.top_k if active else self.num_experts
        p = routed * self.expert.params(hidden) + hidden * self.num_experts  # + router
        if self.shared_expert is not None:
            p += self.num_shared_experts * self.shared_expert.params(hidden)
        return p


class ModelSpec(Frozen):
    id: str = Field(default="", description="catalogue id or config path, set by the loader")
    name: str
    hidden_size: int = Field(gt=0, le=MAX_DIM)
    num_layers: int = Field(gt=0, le=MAX_LAYERS)
    vocab_size: int = Field(gt=0, le=MAX_DIM)
    attention: Attention
    mlp: MLP = Field(description="the dense MLP (all layers of a dense model)")
    moe: MoE | None = None
    norm: Literal["rms", "layer"] = "rms"
    position: Literal["rope", "alibi", "learned"] = Field(
        default="rope",
        description="position encoding: rotary (a kernel per layer), ALiBi "
        "(inside attention) or learned embeddings",
    )
    embedding_norm: bool = Field(default=False, description="a norm after the embedding (BLOOM)")
    tie_word_embeddings: bool = False
    dtype: Literal["fp32", "bf16", "fp16"] = "bf16"
    weight_dtype: WeightDtype = Field(
        default="bf16",
        description="native checkpoint precision of the linear weights (the main one where "
        "they mix: see weight_formats)",
    )
    weight_formats: WeightFormats | None = Field(
        default=None,
        description="the checkpoint's format of each linear where they differ (None: every "
        "linear in weight_dtype, the embedding and LM head in dtype)",
    )
    weight_block_size: tuple[int, int] | None = Field(
        default=None,
        description="the block of block-wise fp8 weight scales (quantization_config's "
        "weight_block_size, e.g. DeepSeek-V3's 128 x 128); None: per-tensor or per-channel",
    )
    max_position_embeddings: int = Field(default=4096, gt=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _moe_layers(self) -> ModelSpec:
        if self.moe is not None and self.moe.first_dense_layers > self.num_layers:
            raise ValueError("moe.first_dense_layers exceeds num_layers")
        local = self.attention.sliding_window_layers
        if local is not None and local > self.num_layers:
            raise ValueError(
                f"attention.sliding_window_layers ({local}) exceeds num_layers ({self.num_layers})"
            )
        return self

    @property
    def moe_layer_flags(self) -> list[bool]:
        """For each layer: is it a MoE layer?"""
        return (
            [i >= self.num_dense_layers for i in range(self.num_layers)]
            if self.moe
            else [False] * self.num_layers
        )

    @property
    def num_window_layers(self) -> int:
        """Layers attending within the sliding window (0 without one)."""
        if self.attention.sliding_window is None:
            return 0
        local = self.attention.sliding_window_layers
        return self.num_layers if local is None else local

    # -- layer counts ---------------------------------------------------------------------
    @property
    def num_moe_layers(self) -> int:
        return 0 if self.moe is None else self.num_layers - self.moe.first_dense_layers

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    # -- parameters -----------------------------------------------------------------------
    @property
    def _norm_params(self) -> int:
        return (2 if self.norm == "layer" else 1) * self.hidden_size

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the LM head (unless tied) and any embedding norm."""
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        emb_norm = self._norm_params if self.embedding_norm else 0
        return self.vocab_size * self.hidden_size + head + emb_norm

    def _layer_params(self, *, active: bool) -> int:
        h = self.hidden_size
        attn = self.attention.params(h) + 2 * self._norm_params
        dense = self.num_dense_layers * (attn + self.mlp.params(h))
        moe = 0
        if self.moe is not None:
            moe = self.num_moe_layers * (attn + self.moe.params(h, active=active))
        return dense + moe

    @cached_property
    def num_params(self) -> int:
        """Total parameters (all experts), excluding multi-token-prediction heads."""
        return self.embedding_params + self._layer_params(active=False) + self._norm_params

    @cached_property
    def num_active_params(self) -> int:
        """Parameters one token passes through (top-k experts only); = num_params if dense."""
        return self.embedding_params + self._layer_params(active=True) + self._norm_params

    # -- KV cache -------------------------------------------------------------------------
    def served_length(self, max_model_len: int | None) -> int:
        """vLLM's max_model_len: the longest request (prompt + output) served, `max_model_len`
        where given (no longer than the context length: a SpecError otherwise), else the
        model's context length."""
        context = self.max_position_embeddings
        if max_model_len is not None and max_model_len > context:
            raise SpecError(
                f"{max_model_len} is longer than {self.id}'s context length {context}",
                field="max_model_len",
            )
        return max_model_len or context

    def kv_bytes_per_token(self, kv_dtype: str | None = None) -> float:
        """Bytes of KV cache one token occupies across all layers, at `kv_dtype` (default:
        the model's native activation dtype), every layer counted (what a token costs while
        it is inside every window; `costmodel.memory.KvHold` caps what sliding-window layers
        keep)."""
        dtype_bytes = kv_bytes_per_elem(kv_dtype or self.dtype)
        return float(self.attention.kv_elems_per_token * self.num_layers * dtype_bytes)
