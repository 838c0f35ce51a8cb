"""Device memory: weights per device, activation workspace, engine reserve, KV capacity.

Mirrors how vLLM sizes its KV cache: usable = gpu_memory_utilization x capacity, minus the
weights of the busiest device, minus the peak activation of a profiling forward pass with
max_num_batched_tokens tokens (and the sampler's logits for max_num_seqs sequences), minus the
engine's reserve (CUDA context, workspaces, graph pool); what remains holds KV blocks. Engines
that take the fraction otherwise say so (`kv_budget`): SGLang's static pool holds weights and KV
only (activations outside it), TensorRT-LLM's KV pool is a fraction of what is free once
weights, activations and the reserve are allocated.

With an offload spec (`costmodel.offload`), the weights it moves to host memory or NVMe leave
the device and its staging buffers join it. A plan that does not fit names the smallest
`--cpu-offload-gb` that would make it fit.

Not modelled: allocator fragmentation, multimodal encoders' memory. LoRA adapter slots are
`MemoryPlan.lora_bytes` (`costmodel.lora`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import numpy as np

from simulator.costmodel.offload import OffloadPlan, plan_offload
from simulator.errors import SpecError
from simulator.specs.deployment import KvEviction, Parallelism, Precision
from simulator.specs.engine import EngineSpec, KvBudget
from simulator.specs.hardware import HardwareSpec
from simulator.specs.model import (
    DTYPE_BYTES,
    MLP,
    CCAttention,
    GQAttention,
    MLAttention,
    ModelSpec,
    kv_bytes_per_elem,
    kv_residual_tokens,
)
from simulator.specs.offload import OffloadSpec
from simulator.specs.weights import LinearName
from simulator.units import GiB

T = TypeVar("T")


def _attention_params_per_device(
    model: ModelSpec, tp: int
) -> tuple[dict[LinearName, float], float]:
    """(sharded params of each attention linear, replicated 16-bit params) of one attention
    block on one device. MLA's q_a and kv_a projections are replicated, as is the bias."""
    attn, h = model.attention, model.hidden_size
    if isinstance(attn, GQAttention):
        q = attn.q_dim // tp
        kv = max(1, attn.num_kv_heads // tp) * attn.head_dim
        shares: dict[LinearName, float] = {"q": h * q, "k": h * kv, "v": h * kv, "o": q * h}
        return shares, (q + 2 * kv if attn.qkv_bias else 0)
    heads = attn.num_heads // tp
    replicated = h * attn.kv_elems_per_token + attn.kv_lora_rank  # kv_a + its norm
    kv_b = attn.kv_lora_rank * heads * (attn.qk_nope_head_dim + attn.v_head_dim)
    o = heads * attn.v_head_dim * h
    if attn.q_lora_rank:
        replicated += h * attn.q_lora_rank + attn.q_lora_rank
        q = attn.q_lora_rank * heads * attn.head_dim
    else:
        q = h * heads * attn.head_dim
    return {"q": q, "v": kv_b, "o": o}, replicated


def _linear_bytes(shares: dict[LinearName, float], prec: Precision, n_layers: int) -> np.ndarray:
    """Bytes per layer of linears holding `shares` params each (per device)."""
    out = np.zeros(n_layers)
    for linear, params in shares.items():
        out += params * np.asarray(prec.layer_bytes(linear, n_layers))
    return out


def layer_weight_bytes(model: ModelSpec, layout: Parallelism, prec: Precision) -> np.ndarray:
    """Bytes of each layer's weights held by one device of its pipeline stage, each linear in
    its own format (`Precision.layer_bytes`)."""
    tp, h, n = layout.tp, model.hidden_size, model.num_layers
    ab = DTYPE_BYTES[prec.activations]
    shares, replicated = _attention_params_per_device(model, tp)
    norms = (2 if model.norm == "layer" else 1) * h * 2
    attn_bytes = _linear_bytes(shares, prec, n) + (replicated + norms) * ab

    def mlp_bytes(mlp: MLP, devices: float) -> np.ndarray:
        """A (gated) MLP's bytes per layer split over `devices` (biases with its down proj)."""
        inter = h * mlp.intermediate_size / devices
        parts: dict[LinearName, float] = {"up": inter, "down": mlp.params(h) / devices - inter}
        if mlp.gated:
            parts = {"gate": inter, "up": inter, "down": mlp.params(h) / devices - 2 * inter}
        return _linear_bytes(parts, prec, n)

    per_layer = attn_bytes + mlp_bytes(model.mlp, tp)
    if model.moe is not None:
        moe = model.moe
        group = layout.tp * (layout.dp if layout.ep > layout.tp else 1)  # devices sharing experts
        experts = moe.num_experts * mlp_bytes(moe.expert, group)
        shared = (
            moe.num_shared_experts * mlp_bytes(moe.shared_expert, tp)
            if moe.shared_expert is not None
            else 0.0
        )
        router = h * moe.num_experts * ab
        moe_layer = attn_bytes + experts + shared + router
        per_layer[moe.first_dense_layers :] = moe_layer[moe.first_dense_layers :]
    return per_layer


def weight_bytes_per_device(
    model: ModelSpec,
    layout: Parallelism,
    prec: Precision,
    *,
    offloaded: np.ndarray | None = None,
) -> float:
    """Weights on the busiest device: layers split evenly over pipeline stages, embedding on
    the first stage and the LM head on the last (both vocab-parallel over TP, 16-bit unless the
    checkpoint's formats say otherwise, as a GGUF file's do);
    `offloaded` (bytes per layer) stay off the device."""
    layers = layer_weight_bytes(model, layout, prec)
    if offloaded is not None:
        layers = layers - offloaded
    stages = np.array_split(layers, layout.pp)
    per_stage = np.array([s.sum() for s in stages])
    table = model.vocab_size * model.hidden_size / layout.tp
    per_stage[0] += table * prec.table_bytes("embed")
    if not model.tie_word_embeddings or layout.pp > 1:
        per_stage[-1] += table * prec.table_bytes("lm_head")
    return float(per_stage.max())


def activation_bytes(
    model: ModelSpec, layout: Parallelism, prec: Precision, *, max_tokens: int, max_seqs: int
) -> float:
    """Peak activation memory of vLLM's profiling run: the widest intermediate tensors of one
    layer for `max_tokens` tokens plus fp32 logits and probabilities for `max_seqs` rows
    (with context parallelism a device holds 1/cp of the tokens, rounded up)."""
    h, tp, a = model.hidden_size, layout.tp, DTYPE_BYTES[prec.activations]
    max_tokens = -(-max_tokens // layout.cp)
    attn = model.attention
    width = attn.num_heads * attn.head_dim / tp + 2 * attn.kv_elems_per_token
    inter = 3 * model.mlp.intermediate_size / tp
    if model.moe is not None:
        inter = max(inter, 3 * model.moe.top_k * model.moe.expert.intermediate_size / tp)
    layer = max_tokens * a * (4 * h + width + inter)
    sampler = max_seqs * model.vocab_size * 4.0 * 2
    return float(layer + sampler)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Per-device memory budget (bytes) and the KV cache it leaves."""

    capacity_bytes: float
    usable_bytes: float
    weights_bytes: float
    activation_bytes: float
    reserve_bytes: float
    kv_bytes_per_token: float  # per device: this device's share of layers and KV heads
    block_size: int
    offloaded_bytes: float = 0.0  # weights this device keeps in host memory or on NVMe
    staging_bytes: float = 0.0  # GPU buffers the offloaded weights pass through
    offload: OffloadPlan | None = None
    min_cpu_offload_gib: int | None = None  # the least --cpu-offload-gb that fits (no fit)
    kv_budget: KvBudget = "total"  # what usable_bytes' fraction of capacity applies to
    residual_bytes: float = 0.0  # per sequence slot: KIVI's 16-bit windows, CCA's conv state
    hold: KvHold | None = None  # what a sequence keeps under sliding windows or a budget
    lora_bytes: float = 0.0  # multi-LoRA: the adapter slots vLLM preallocates (costmodel.lora)
    # ShadowKV: each token's values live in host memory (this device's share), which holds
    # `host_kv_bytes` of them; 0: the KV is all on the device
    host_kv_bytes_per_token: float = 0.0
    host_kv_bytes: float = 0.0

    @property
    def kv_cache_bytes(self) -> float:
        resident = self.weights_bytes + self.staging_bytes + self.reserve_bytes
        resident += self.residual_bytes + self.lora_bytes
        if self.kv_budget == "static":  # activations live outside the static pool
            return self.usable_bytes - resident
        if self.kv_budget == "free":  # the fraction applies to what is left
            fraction = self.usable_bytes / self.capacity_bytes
            return fraction * (self.capacity_bytes - resident - self.activation_bytes)
        return self.usable_bytes - resident - self.activation_bytes

    @property
    def fits(self) -> bool:
        return self.kv_cache_bytes >= self.kv_bytes_per_token * self.block_size

    @property
    def kv_capacity_tokens(self) -> int:
        return max(0, self.kv_capacity_blocks * self.block_size)

    @property
    def kv_capacity_blocks(self) -> int:
        blocks = max(0, int(self.kv_cache_bytes // (self.kv_bytes_per_token * self.block_size)))
        if self.host_kv_bytes_per_token > 0:  # the values' host memory bounds it too
            host = self.host_kv_bytes // (self.host_kv_bytes_per_token * self.block_size)
            blocks = min(blocks, max(0, int(host)))
        return blocks

    def max_batch(self, *, seq_len: int, prompt_len: int | None = None) -> int:
        """Largest number of sequences of `seq_len` tokens whose KV fits at once; with a KV
        token budget, sequences decoding past a prompt of `prompt_len` tokens (default: all
        of `seq_len` a prompt, held whole)."""
        prompt = seq_len if prompt_len is None else prompt_len
        held = seq_len if self.hold is None else self.hold.tokens(seq_len, prompt)
        blocks_per_seq = -(-held // self.block_size)
        return self.kv_capacity_blocks // max(1, blocks_per_seq)

    def summary(self) -> str:
        g = GiB
        off = ""
        if self.offloaded_bytes or self.staging_bytes:
            where = self.offload.spec.source if self.offload else "host"
            off = (
                f" (+ {self.offloaded_bytes / g:.2f} GiB offloaded to {where})"
                f" + staging {self.staging_bytes / g:.2f} GiB"
            )
        weights = f"weights {self.weights_bytes / g:.2f} GiB{off}"
        activations = f"activations {self.activation_bytes / g:.2f} GiB"
        reserve = f"engine reserve {self.reserve_bytes / g:.2f} GiB"
        if self.kv_budget == "static":
            return (
                f"{weights} + {reserve} vs {self.usable_bytes / g:.2f} GiB static pool of"
                f" {self.capacity_bytes / g:.2f} GiB ({activations} outside it)"
            )
        if self.kv_budget == "free":
            fraction = self.usable_bytes / self.capacity_bytes
            return (
                f"{weights} + {activations} + {reserve} of {self.capacity_bytes / g:.2f} GiB,"
                f" KV pool {fraction:.2f} of the rest"
            )
        return (
            f"{weights} + {activations} + {reserve}"
            f" vs {self.usable_bytes / g:.2f} GiB usable of {self.capacity_bytes / g:.2f} GiB"
        )

    def as_dict(self) -> dict[str, float | int | bool | str]:
        return {
            "capacity_bytes": self.capacity_bytes,
            "usable_bytes": self.usable_bytes,
            "weights_bytes": self.weights_bytes,
            "activation_bytes": self.activation_bytes,
            "reserve_bytes": self.reserve_bytes,
            "offloaded_bytes": self.offloaded_bytes,
            "staging_bytes": self.staging_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "kv_capacity_blocks": self.kv_capacity_blocks,
            "block_size": self.block_size,
            "kv_budget": self.kv_budget,
            "residual_bytes": self.residual_bytes,
            "host_kv_bytes_per_token": self.host_kv_bytes_per_token,
            "fits": self.fits,
        }


def _stage_layers(model: ModelSpec, layout: Parallelism) -> int:
    """Layers of the busiest pipeline stage (an uneven split gives the first stages one more)."""
    return -(-model.num_layers // layout.pp)


def _kv_elems_per_token_per_device(model: ModelSpec, layout: Parallelism) -> int:
    attn = model.attention
    elems = (
        2 * max(1, attn.num_kv_heads // layout.tp) * attn.head_dim
        if isinstance(attn, GQAttention)
        else attn.kv_elems_per_token
    )
    return elems * _stage_layers(model, layout)


def kv_bytes_per_token_per_device(model: ModelSpec, layout: Parallelism, prec: Precision) -> float:
    """KV bytes one token occupies on one device: its stage's layers, its share of KV heads
    (replicated when there are fewer KV heads than TP ranks; MLA's latent is replicated); a
    low-bit format's scales and zero points included (`specs.model.kv_bytes_per_elem`); and
    with context parallelism 1/cp of them: each of the cp ranks holds 1/cp of every sequence's
    KV (as vLLM's decode context parallelism interleaves it), so a replica holds cp times the
    tokens."""
    elems = _kv_elems_per_token_per_device(model, layout)
    full = float(elems * kv_bytes_per_elem(prec.kv_cache)) / layout.cp
    return full * gpu_kv_share(model, prec)


def comm_memory_bytes(engine: EngineSpec, hw: HardwareSpec, tp: int) -> float:
    """Per-GPU memory of the engine's communicators at tensor-parallel size `tp`
    (`EngineSpec.comm_memory_bytes`, by size; one not listed takes the next larger listed
    one's), on NVIDIA GPUs behind an NVSwitch; 0 alone on a GPU, elsewhere, or where the
    profile lists none."""
    table = engine.comm_memory_bytes
    if tp <= 1 or not table or hw.vendor != "nvidia" or hw.interconnect.topology != "switch":
        return 0.0
    sizes = sorted(table)
    return float(table[next((s for s in sizes if s >= tp), sizes[-1])])


def mla_kv_padding(
    model: ModelSpec, hw: HardwareSpec, prec: Precision, engine: EngineSpec
) -> float:
    """How much more KV memory an MLA layer's cached row takes under `engine` than its elements:
    vLLM 0.7 on CUDA pads the row (latent plus rotary key) to `mla_kv_align_bytes` (576 bf16
    elements, 1,152 bytes, to 1,280); 1 for other attention, other engines and other vendors."""
    align = engine.mla_kv_align_bytes
    if align is None or hw.vendor != "nvidia" or not isinstance(model.attention, MLAttention):
        return 1.0
    row = model.attention.kv_elems_per_token * kv_bytes_per_elem(prec.kv_cache)
    return math.ceil(row / align) * align / row


def absorbed_mla_bytes(
    model: ModelSpec, layout: Parallelism, prec: Precision, engine: EngineSpec
) -> float:
    """Bytes per device of the absorbed MLA matrices an engine keeps beside the weights
    (`mla_absorbed_weights`), per layer of the busiest stage, as vLLM 0.7's MLA backend builds
    them (vllm/attention/backends/mla/utils.py, `VLLM_MLA_PERFORM_MATRIX_ABSORPTION` on by
    default until 0.8.0): W_Q_UK (query input x local heads x latent) and W_UV_O (local heads
    x latent x hidden) in fp8 where the weights are fp8 (re-quantised per block), else 16-bit;
    W_QR (query input x local heads x rotary dims) and kv_b_proj dequantised (latent x local
    heads x (no-rope + value dims)) in 16-bit. DeepSeek-V3 at TP8: 75 MiB a layer."""
    attn = model.attention
    if not engine.mla_absorbed_weights or not isinstance(attn, MLAttention):
        return 0.0
    heads = attn.num_heads / layout.tp
    q_in = attn.q_lora_rank or model.hidden_size
    half = float(DTYPE_BYTES[prec.activations])
    low = 1.0 if prec.weights == "fp8" else half
    absorbed = low * heads * attn.kv_lora_rank * (q_in + model.hidden_size)
    kept = (
        half
        * heads
        * (
            q_in * attn.qk_rope_head_dim
            + attn.kv_lora_rank * (attn.qk_nope_head_dim + attn.v_head_dim)
        )
    )
    return float((absorbed + kept) * _stage_layers(model, layout))


def gpu_kv_share(model: ModelSpec, prec: Precision) -> float:
    """The share of a token's KV bytes the device holds: SwiftKV's AcrossKV shares one KV
    among adjacent skipped layers (`SwiftKV.kv_share`); ShadowKV keeps, per layer, the token's
    row of the rank-r key factor and 1/chunk of a post-RoPE key (its chunk's landmark) in
    place of its K and V (arXiv 2410.21465, sec. 4): (r / K width + 1 / chunk) / 2 of them,
    plus its outlier chunks' share kept whole (Llama-3.1-8B, r = 160 of 1024, chunk 8, 0.3%
    outliers: 14.4%). Each sequence's rank x K-width key basis per layer is not counted
    (at 122K tokens 0.5% of what the sequence holds). 1 without either."""
    share = 1.0
    if prec.swiftkv is not None:
        share *= prec.swiftkv.kv_share(model.num_layers)
    sk = prec.shadowkv
    if sk is not None and isinstance(model.attention, GQAttention):
        width = model.attention.num_kv_heads * model.attention.head_dim
        low_rank = (sk.rank / width + 1.0 / sk.chunk) / 2.0
        share *= min(1.0, low_rank + sk.outlier_share)
    return share


def shadowkv_host_bytes_per_token(model: ModelSpec, layout: Parallelism, prec: Precision) -> float:
    """Host bytes of one token's values under ShadowKV on one device (0 without it)."""
    if prec.shadowkv is None:
        return 0.0
    elems = _kv_elems_per_token_per_device(model, layout) / 2.0
    return float(elems * kv_bytes_per_elem(prec.kv_cache)) / layout.cp


def kv_residual_bytes(
    model: ModelSpec, layout: Parallelism, prec: Precision, *, max_seqs: int
) -> float:
    """What each of `max_seqs` sequence slots keeps beside its KV blocks: a low-bit KV
    format's 16-bit window of recent tokens (KIVI's R tokens, `specs.model.kv_residual_tokens`:
    what they cost in 16 bits beyond their quantized bytes), and CCA's convolution state (the
    last taps - 1 latent queries and keys of each convolution, and the previous token's hidden
    state for the value shift, per layer, as ZAYA1's vLLM cache keeps them)."""
    a = DTYPE_BYTES[prec.activations]
    total = 0.0
    residual = kv_residual_tokens(prec.kv_cache)
    if residual:
        extra = a - kv_bytes_per_elem(prec.kv_cache)
        total += residual * _kv_elems_per_token_per_device(model, layout) * extra
    attn = model.attention
    if isinstance(attn, CCAttention):
        channels = attn.num_heads // layout.tp + max(1, attn.num_kv_heads // layout.tp)
        taps = sum(attn.conv_kernels) - 2
        layers = _stage_layers(model, layout)
        total += layers * (channels * attn.head_dim * taps + model.hidden_size) * a
    return float(max_seqs * total)


@dataclass(frozen=True, slots=True)
class KvHold:
    """What a sequence's KV holds, in tokens at the plan's `kv_bytes_per_token` (all layers).
    With a token budget (`eviction`) a sequence keeps what its policy keeps once its prompt is
    in (`KvEviction.held`). Where sliding-window layers keep only the last `window` tokens, a
    `window_share` of the bytes (the window layers' share of all layers) stops growing at the
    window and the rest grows with every token: vLLM V1 frees the blocks of sliding-window
    layers that fall outside the window (its hybrid KV cache manager,
    vllm/v1/core/single_type_kv_cache_manager.py, SlidingWindowManager)."""

    window: int | None = None
    window_share: float = 0.0
    eviction: KvEviction | None = None

    def tokens(self, computed: int, prompt: int = 0) -> int:
        """Tokens' worth of KV a sequence of `prompt` prompt tokens holds with `computed`."""
        kept = computed if self.eviction is None else self.eviction.held(computed, prompt)
        if self.window is None:
            return kept
        local = min(kept, self.window)
        # rounded up, less a rounding error (never above `kept`)
        return min(kept, math.ceil((1.0 - self.window_share) * kept + self.window_share * local))

    def tokens_of(self, computed: np.ndarray, prompt: np.ndarray) -> np.ndarray:
        """`tokens` of each sequence (arrays of computed and prompt tokens)."""
        kept = np.asarray(computed, dtype=float)
        if self.eviction is not None:
            kept = self.eviction.held_of(kept, prompt)
        if self.window is not None:
            local = np.minimum(kept, self.window)
            mixed = np.ceil((1.0 - self.window_share) * kept + self.window_share * local)
            kept = np.minimum(kept, mixed)
        return kept.astype(int)

    def most_tokens(self, total: np.ndarray, prompt: np.ndarray) -> np.ndarray:
        """The most `tokens` each sequence holds on its way to `total` tokens: at the end of
        its prompt (before a budget evicts) or at the end."""
        p = np.asarray(prompt, dtype=float)
        return np.maximum(self.tokens_of(np.minimum(total, p), p), self.tokens_of(total, p))


def kv_hold(model: ModelSpec, eviction: KvEviction | None = None) -> KvHold | None:
    """The KvHold of `model` under `eviction`, or None where every layer keeps every token."""
    window = model.attention.sliding_window
    if window is not None and window >= model.max_position_embeddings:
        window = None
    if window is None and eviction is None:
        return None
    share = model.num_window_layers / model.num_layers if window is not None else 0.0
    return KvHold(window=window, window_share=share, eviction=eviction)


def pick(value: T | None, default: T) -> T:
    """`value` unless it is None (0 is a value to check, not a request for the default)."""
    return default if value is None else value


def positive(value: int, *, field: str, whole: bool = True) -> int:
    """`value` if it is a finite number of at least 1 (a whole one with `whole`), else a
    SpecError naming `field` (NaN, which every comparison lets through, included)."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise SpecError(f"expected a number, got {value!r}", field=field)
    if not math.isfinite(value):
        raise SpecError(f"must be a finite number, got {value}", field=field)
    if value < 1:
        raise SpecError(f"must be at least 1, got {value}", field=field)
    if whole and value != int(value):
        raise SpecError(f"must be a whole number, got {value}", field=field)
    return value


def plan_memory(
    model: ModelSpec,
    hw: HardwareSpec,
    layout: Parallelism,
    prec: Precision,
    engine: EngineSpec,
    *,
    gpu_memory_utilization: float | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    offload: OffloadSpec | None = None,
    host_reserved_bytes: float = 0.0,
) -> MemoryPlan:
    """The memory budget of the busiest device; see `MemoryPlan.fits`. Knobs left None take
    the engine's defaults; a KV token budget (`prec.kv_eviction`) caps what a sequence holds.
    `offload` moves weights off the device (SpecError if host memory, less
    `host_reserved_bytes` such as swap space, cannot hold them); a plan that does not fit
    carries the least `cpu_offload_gb` that would (`min_cpu_offload_gib`)."""
    sched = engine.scheduler
    util = pick(gpu_memory_utilization, sched.gpu_memory_utilization)
    if not 0 < util <= 1:
        raise SpecError(f"must be in (0, 1], got {util}", field="gpu_memory_utilization")
    max_tokens = positive(
        pick(max_num_batched_tokens, sched.max_num_batched_tokens), field="max_num_batched_tokens"
    )
    max_seqs = positive(pick(max_num_seqs, sched.max_num_seqs), field="max_num_seqs")
    base = MemoryPlan(
        capacity_bytes=hw.memory.capacity_bytes,
        usable_bytes=util * hw.memory.capacity_bytes,
        weights_bytes=weight_bytes_per_device(model, layout, prec),
        activation_bytes=activation_bytes(
            model, layout, prec, max_tokens=max_tokens, max_seqs=max_seqs
        ),
        reserve_bytes=engine.memory_reserve_bytes
        + absorbed_mla_bytes(model, layout, prec, engine)
        + comm_memory_bytes(engine, hw, layout.tp),
        kv_bytes_per_token=kv_bytes_per_token_per_device(model, layout, prec)
        * mla_kv_padding(model, hw, prec, engine),
        block_size=sched.block_size,
        kv_budget=sched.kv_budget,
        residual_bytes=kv_residual_bytes(model, layout, prec, max_seqs=max_seqs),
        hold=kv_hold(model, prec.kv_eviction),
        host_kv_bytes_per_token=shadowkv_host_bytes_per_token(model, layout, prec),
        host_kv_bytes=hw.host.memory_bytes if prec.shadowkv is not None else 0.0,
    )
    offloaded = partial(with_offload, base, model, hw, layout, prec, max_tokens=max_tokens)
    plan = base
    if offload is not None and offload.active:
        plan = offloaded(offload, host_reserved_bytes=host_reserved_bytes)
    if plan.fits or (offload is not None and offload.resident_layers is not None):
        return plan
    every_layer_gib = math.ceil(float(layer_weight_bytes(model, layout, prec).sum()) / GiB)
    least = least_cpu_offload_gib(offloaded, offload or OffloadSpec(), most_gib=every_layer_gib)
    return dataclasses.replace(plan, min_cpu_offload_gib=least)


def with_offload(
    plan: MemoryPlan,
    model: ModelSpec,
    hw: HardwareSpec,
    layout: Parallelism,
    prec: Precision,
    offload: OffloadSpec,
    *,
    max_tokens: int,
    host_reserved_bytes: float = 0.0,
) -> MemoryPlan:
    """`plan` (made without offload) with `offload`'s weights off the device."""
    off = plan_offload(
        model,
        hw,
        layout,
        prec,
        offload,
        layer_bytes=layer_weight_bytes(model, layout, prec),
        max_tokens=max_tokens,
        host_reserved_bytes=host_reserved_bytes,
    )
    return dataclasses.replace(
        plan,
        weights_bytes=weight_bytes_per_device(
            model, layout, prec, offloaded=off.offloaded_layer_bytes
        ),
        offloaded_bytes=off.host_bytes,
        staging_bytes=off.staging_bytes,
        offload=off,
    )


def least_cpu_offload_gib(
    offloaded: Callable[[OffloadSpec], MemoryPlan], offload: OffloadSpec, *, most_gib: int
) -> int | None:
    """The smallest whole `cpu_offload_gb` with which the plan fits (`offloaded`: the plan,
    made without offload, under an offload spec), on top of `offload`'s other settings and
    whatever host memory it takes (at least 1, as the plan does not fit without); None if
    `most_gib` (streaming every layer) would not do."""

    def fits(gib: float) -> bool:
        spec = offload.model_copy(update={"cpu_offload_gb": gib, "host_memory_bytes": math.inf})
        return offloaded(spec).fits

    # Freed memory never falls as more streams: streamed bytes less staging is
    # g (1 - buffers / S) with S, the streamed layers, growing with g. So bisect.
    lo, hi = 0, most_gib
    if not fits(float(hi)):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(float(mid)) else (mid, hi)
    return hi


def require_fit(plan: MemoryPlan, *, what: str, alternatives: str = "") -> None:
    """Raise SpecError with the breakdown if the model does not fit: `alternatives` first
    (layouts that fit, `deployment.fitting_layouts`), then the least `--cpu-offload-gb` that
    would make it fit where streaming weights can."""
    if plan.fits:
        return
    hint = f"; {alternatives}" if alternatives else ""
    if plan.min_cpu_offload_gib is not None:
        n = plan.min_cpu_offload_gib
        hint += (
            f"{'; or' if hint else ';'} --cpu-offload-gb {n} (scenario: cpu_offload_gb: {n}) "
            "would stream weights from host memory"
        )
    elif plan.offload is None or plan.offload.spec.resident_layers is None:
        hint += "; it would not fit even with every layer streamed from host memory"
    raise SpecError(f"does not fit: {plan.summary()}{hint}", source=what, field="memory")
