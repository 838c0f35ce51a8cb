"""Attention kernels as the engines launch them: the thread blocks of flash-attention prefill
and paged decode under each split-KV rule, and the decode KV read with its latency limits.
`roofline` prices attention ops with these; see its module docstring for the roofline itself.
Sources are cited where each rule is defined."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import get_args

import numpy as np

from simulator.costmodel.ops import Op
from simulator.specs._base import Curve
from simulator.specs.engine import EngineSpec
from simulator.specs.hardware import DecodeSplit, GemmEfficiency, HardwareSpec, RowKernel
from simulator.specs.loader import tuned_moe_shapes

ALL_ROW_KERNELS = frozenset(get_args(RowKernel))
PREFILL_TILE = 128.0  # query rows per thread block in flash-attention prefill
# FlashAttention-2 as vLLM calls it for prefill: a paged KV cache forces the split-KV kernel
# (flash_api.cpp mha_varlen_fwd: `run_mha_fwd(params, stream, paged_KV)`), whose blocks hold
# 64 query rows (kBlockM, set_params_splitkv) of ONE query head: the grid runs over all query
# heads, and only a one-token query packs a GQA group (`seqlenq_ngroups_swapped`).
# FlashAttention-3 packs the group's query heads into a block's 128 rows (hopper/heuristics.h
# should_pack_gqa: varlen with max_seqlen_q <= kBlockM; a paged, non-TMA cache always packs).
FA2_PREFILL_TILE = 64.0
DECODE_SPLIT = 256.0  # KV tokens per unit of decode work (the size measure of the curves)
# Decode kernels of FlashAttention 2 and 3 at head_dim <= 128 on a paged cache: 128 KV tokens
# per tile (kBlockN; a split holds at least one), 64 packed query rows per block (kBlockM).
# vllm-project/flash-attention csrc/flash_attn/flash_api.cpp (set_params_splitkv) and
# hopper/tile_size.h (tile_size_fwd_sm90, paged_kv_non_TMA).
DECODE_TILE_N = 128.0
DECODE_TILE_M = 64.0
# vLLM 0.2 PagedAttention V2: PARTITION_SIZE 512 tokens; the V1 kernel (no partitions) runs
# once num_seqs x num_heads > 512 at max context <= 8192 (vllm/model_executor/layers/attention.py).
PAGED_V2_PARTITION = 512.0
PAGED_V2_MAX_PAIRS = 512.0
DECODE_BOUND_POWER = 4.0  # p of the p-norm joining the bandwidth and per-block decode times
# vLLM writes the new tokens' K and V into the paged cache in a kernel of its own before the
# attention kernel, one thread block per token of min(K row elements, 512) threads
# (csrc/cache_kernels.cu reshape_and_cache_flash: grid(num_tokens),
# block(min(num_heads * head_size, 512)); concat_and_cache_mla: min(kv_lora_rank, 512)).
CACHE_WRITE_MAX_THREADS = 512.0


def attention_work(op: Op, *, tile: float) -> np.ndarray:
    """Independent blocks of work an attention kernel spreads over the SMs: sequences x KV
    heads x tiles of the rows each (sequence, KV head) pair has. Prefill packs the query heads
    of a GQA group into one block's rows (s x group rows); decode splits the KV length.
    Continuous in the length (at least one tile), so work grows in proportion to it, which
    keeps the fitted curves' bounded elasticity from making a longer sequence faster."""
    length = np.asarray(op.seq_len, dtype=float)
    if op.kind == "attention_prefill":
        length = length * gqa_group(op)
    tiles = np.maximum(length / tile, 1.0)
    return np.maximum(np.asarray(op.batch, dtype=float), 1.0) * max(op.kv_heads, 1.0) * tiles


def prefill_work(op: Op, split: DecodeSplit) -> np.ndarray:
    """Thread blocks of a prefill attention kernel (continuous, as `attention_work`): under
    FlashAttention-2 (`split` "fa2") sequences x query heads x 64-row tiles, the query heads
    of a GQA group each in their own blocks; otherwise `attention_work` with 128-row tiles
    of packed groups. See FA2_PREFILL_TILE for the sources. The cost model passes the
    device's own kernel (`attention.decode_split`), the one its prefill factors were fitted
    to: an engine's decode split (`EngineSpec.decode_split`) does not change prefill blocks.
    Not modelled: the real causal tile counts and wave quantisation of the blocks."""
    if split != "fa2":
        return attention_work(op, tile=PREFILL_TILE)
    length = np.asarray(op.seq_len, dtype=float)
    kv = max(op.kv_heads, 1.0)
    per_seq = np.where(
        length <= 1.0,
        kv * max(gqa_group(op) / FA2_PREFILL_TILE, 1.0),
        kv * gqa_group(op) * np.maximum(length / FA2_PREFILL_TILE, 1.0),
    )
    return np.maximum(np.asarray(op.batch, dtype=float), 1.0) * per_seq


def gqa_group(op: Op) -> float:
    return max(op.heads, 1.0) / max(op.kv_heads, 1.0)


def decode_split(hw: HardwareSpec, engine: EngineSpec | None = None) -> DecodeSplit:
    """The split-KV rule of the decode kernel: the engine's where it names one, else the
    device's."""
    if engine is not None and engine.decode_split is not None:
        return engine.decode_split
    return hw.efficiency.attention.decode_split


def decode_blocks(hw: HardwareSpec, op: Op, split: DecodeSplit | None = None) -> np.ndarray:
    """Thread blocks a paged decode kernel launches under `split` (default: the device's
    `decode_split`): sequences x KV heads x packed query tiles (FlashAttention packs a GQA
    group's query heads into one block's rows) x KV splits. A split kernel gives each block at
    least one 128-token KV tile and otherwise splits until the blocks fill its target: `fa2`
    (vLLM's FA2 paged path, flash_api.cpp mha_varlen_fwd: num_splits_heuristic over 2 x SMs)
    two blocks per SM, and only for GQA layers (the split-KV path is taken only where the
    query's group is swapped into rows, `seqlenq_ngroups_swapped`; an MHA block streams its
    sequence's whole KV); `fa3` (hopper/flash_prepare_scheduler.cu, dynamic split with a 10%
    margin) SMs / 1.1; no split once sequences x heads alone reach it. `paged_v2` (vLLM 0.2's
    PagedAttention, csrc/attention/attention_kernels.cu and layers/attention.py) launches one
    block per (query head, sequence, 512-token partition), and its V1 kernel (no partitions)
    once sequences x heads pass 512 with contexts up to 8192.

    Continuous in the KV length and the batch, and never falling as either grows: the real
    heuristics pick integer splits (eligibility rules, wave rounding, the V1/V2 switch) whose
    jumps would make a longer context or a larger batch faster, so the split count is the
    smooth fill, not the chosen integer, and past the V1 switch `paged_v2` keeps the
    partitions of 512 (sequence, head) pairs. Not modelled: per-sequence splits of a batch
    with mixed lengths (`seq_len` is the mean).
    """
    split = hw.efficiency.attention.decode_split if split is None else split
    seqs = np.maximum(np.asarray(op.batch, dtype=float), 1.0)
    length = np.asarray(op.seq_len, dtype=float)
    if split == "paged_v2":
        pairs = seqs * max(op.heads, 1.0)
        parts = np.maximum(length / PAGED_V2_PARTITION, 1.0)
        return np.maximum(pairs, np.minimum(pairs, PAGED_V2_MAX_PAIRS) * parts)
    tiles = np.maximum(length / DECODE_TILE_N, 1.0)
    rows = np.ceil(gqa_group(op) / DECODE_TILE_M)
    unsplit = seqs * max(op.kv_heads, 1.0) * rows
    units = float(hw.compute.units)
    match split:
        case "none":
            return unsplit
        case "fa2":
            if gqa_group(op) <= 1.0:
                return unsplit
            fill = 2.0 * units
        case "fa3":
            fill = units / 1.1
    return np.minimum(unsplit * tiles, np.maximum(unsplit, fill))


def cache_write_waves(hw: HardwareSpec, op: Op) -> np.ndarray:
    """Waves of the KV-cache write kernel of an attention op: its tokens (prefill: sequences
    x mean query length; decode: one per sequence), one thread block each, over the blocks
    resident at once (SMs x the blocks of CACHE_WRITE_MAX_THREADS or fewer threads one SM
    holds). Few KV heads make small blocks, many of which share an SM; from 512 threads (4 KV
    heads of 128) on, four per SM on A100/H100. Zero where the op names no K row size."""
    if op.kv_row_elems <= 0:
        return np.zeros(1)
    batch = np.asarray(op.batch, dtype=float)
    tokens = (
        batch * np.asarray(op.seq_len, dtype=float) if op.kind == "attention_prefill" else batch
    )
    threads = min(op.kv_row_elems, CACHE_WRITE_MAX_THREADS)
    resident = max(hw.compute.threads_per_unit // threads, 1.0)
    return tokens / (hw.compute.units * resident)


def decode_slots(hw: HardwareSpec, split: DecodeSplit) -> float:
    """Decode blocks resident at once: two per SM for the 128-thread blocks of FA2 and
    PagedAttention, else one."""
    per_sm = 2.0 if split in ("fa2", "paged_v2") else 1.0
    return per_sm * hw.compute.units


@dataclass(frozen=True, slots=True)
class Kernels:
    """How an engine runs the kernels on a device (`evaluate`'s engine, resolved once)."""

    attention_factor: float
    fused_quant: bool
    split: DecodeSplit
    gemm: GemmEfficiency  # the engine's GEMM library on this device (`EfficiencySpec.gemm_for`)
    # the engine's attention kernel against the device's, by query length
    # (`EfficiencySpec.attention_speed`); None: the device's own
    prefill_speed: Curve | None = None
    # elementwise kernels priced by their one-block-per-token launch (`elementwise_kernels`)
    row_kernels: frozenset[str] = ALL_ROW_KERNELS
    # the fused MoE kernel's compute efficiency against the GEMM library's, by dtype
    # (`EngineSpec.fused_moe_fraction`; a dtype not named: 1)
    moe_fraction: Mapping[str, float] = field(default_factory=dict)
    # the shapes vLLM ships a tuned fused-MoE configuration for on this device, (local experts,
    # intermediate per shard, dtype) (`EngineSpec.fused_moe_configs`; None: every shape), and
    # the default configuration's compute efficiency against a tuned one's, by dtype
    moe_tuned: frozenset[tuple[int, int, str]] | None = None
    moe_default: Mapping[str, float] = field(default_factory=dict)
    # the decode kernel reads a grouped-query layer's KV once per query head
    # (`EngineSpec.decode_kv_per_query_head`; see `per_query_head_reads`)
    kv_per_query_head: bool = False

    def moe_fraction_of(self, dtype: str, *, fp8_blocks: bool = False) -> float:
        """The fused MoE kernel's compute efficiency against the GEMM library's in `dtype`
        (block-wise fp8 by its own entry where the profile names one, else as fp8)."""
        if fp8_blocks and "fp8_block" in self.moe_fraction:
            return self.moe_fraction["fp8_block"]
        return self.moe_fraction.get(dtype, 1.0)

    def moe_default_factor(
        self, shape: tuple[int, int], dtype: str, *, fp8_blocks: bool = False
    ) -> float | None:
        """The default configuration's compute efficiency against a tuned one's for the fused
        MoE GEMMs of `shape` (local experts, intermediate per shard) in `dtype` (`fp8_blocks`:
        block-wise fp8, with files and a default of its own), where vLLM ships no
        configuration for the shape (bf16 and fp16 share a file); None where it does, or the
        profile names no factor."""
        kind = "fp8_block" if fp8_blocks else dtype
        if self.moe_tuned is None or kind not in self.moe_default:
            return None
        if (shape[0], shape[1], "bf16" if kind == "fp16" else kind) in self.moe_tuned:
            return None
        return self.moe_default[kind]


def kernels(hw: HardwareSpec, engine: EngineSpec | None) -> Kernels:
    """The engine's kernels on `hw`. Without an engine, every kernel as measured alone:
    attention factor 1, W8A8 quantisation in a kernel of its own, and vLLM's one-block-per-
    token elementwise kernels (those Vidur's profiles time)."""
    if engine is None:
        return Kernels(1.0, False, decode_split(hw), hw.efficiency.gemm)
    return Kernels(
        engine.attention_factor,
        engine.fused_activation_quant,
        decode_split(hw, engine),
        hw.efficiency.gemm_for(engine.gemm_library),
        hw.efficiency.attention_speed(engine.attention_kernel),
        frozenset(engine.scalar_row_kernels),
        engine.fused_moe_fraction,
        # the default configuration's cost was measured on NVIDIA GPUs alone (H100, H200)
        None
        if engine.fused_moe_configs is None or hw.vendor != "nvidia"
        else tuned_moe_shapes(engine.fused_moe_configs, hw.id),
        engine.fused_moe_default_fraction,
        engine.decode_kv_per_query_head,
    )


def per_query_head_reads(op: Op) -> Op:
    """A decode attention op as a kernel with one thread block per query head runs it: each
    block streams its KV head's cache, so a group of G query heads reads it G times (and the
    kernel launches, splits and streams as for a multi-head layer of as many KV heads as
    query heads). The new token's K and V are still written once per KV head."""
    group = gqa_group(op)
    if group <= 1.0:
        return op
    kv = np.asarray(op.kv_bytes, dtype=float)
    return dataclasses.replace(
        op,
        kv_heads=float(op.heads),
        kv_bytes=kv * group,
        bytes=np.asarray(op.bytes, dtype=float) + kv * (group - 1.0),
    )


def decode_kv_s(hw: HardwareSpec, op: Op, k: Kernels) -> np.ndarray:
    """Seconds to read the KV cache: at the kernel's efficiency (fraction x curves of length,
    work and group), and no faster than either of two latency limits: the resident blocks
    stream it one page after another (`decode_block_bytes_per_s` per block), which bounds a
    few long blocks; and, under the `fa3` split (where it was measured), the page walk covers
    `decode_walk_tokens_per_s` KV tokens a second, whatever their bytes (`_walk_tokens`). The
    times are joined by a p-norm (p = 4), never below any of them; each never falls as the
    batch or the KV length grows (bytes per resident block never falls: see `decode_blocks`),
    so neither does their norm."""
    at = hw.efficiency.attention
    kv = at.fp8_kv_factor if op.kv_dtype == "fp8" else 1.0
    eff = np.minimum(
        1.0,
        at.decode_fraction
        * k.attention_factor
        * kv
        * at.decode_len_curve(op.seq_len)
        * at.decode_parallel_curve(attention_work(op, tile=DECODE_SPLIT))
        * at.decode_group_curve(gqa_group(op)),
    )
    kv_bytes = np.asarray(op.kv_bytes, dtype=float)
    seconds = kv_bytes / (hw.memory.bandwidth_bytes_per_s * eff)
    limits: list[np.ndarray] = []
    if at.decode_block_bytes_per_s is not None:
        resident = np.minimum(decode_blocks(hw, op, k.split), decode_slots(hw, k.split))
        rate = at.decode_block_bytes_per_s * k.attention_factor * kv
        limits.append(kv_bytes / (rate * resident))
    if at.decode_walk_tokens_per_s is not None and k.split == "fa3":
        walk = at.decode_walk_tokens_per_s * k.attention_factor * kv
        limits.append(walk_tokens(op, at.decode_walk_seqs) / walk)
    if not limits:
        return seconds
    # A soft maximum: near a crossing both limits cost (and the fit sees a gradient).
    p = DECODE_BOUND_POWER
    return (seconds**p + sum(t**p for t in limits)) ** (1.0 / p)


def walk_tokens(op: Op, shared: float) -> np.ndarray:
    """KV tokens on the page walk's critical path: the KV length times the sequences, up to
    `shared` of them (`decode_walk_seqs`); more sequences are walked side by side. Counted in
    tokens, not bytes: the same for one KV head or eight, bf16 or fp8, any GQA group.

    Measured, not derived from the kernel's source (aiconfigurator's H100 rows of vLLM 0.14's
    FlashAttention-3 paged decode, 64-token pages scattered at random): with 16 or fewer
    sequences the kernel covers about 1.8e9 KV tokens/s whatever the KV heads (kv=1 and kv=2
    alike; fp8 no faster than bf16), so one KV head streams at a third of what eight do; from
    16 to 64 sequences (fp8, kv=1, ctx=131071: 1345, 1352, 1356 us) the time stays the same.
    Why the walk is shared up to ~16 sequences is not established."""
    seqs = np.maximum(np.asarray(op.batch, dtype=float), 1.0)
    return np.asarray(op.seq_len, dtype=float) * np.minimum(seqs, shared)


def gqa_relayout(op: Op, split: DecodeSplit) -> np.ndarray:
    """1 where vLLM's FA2 decode re-lays out the query of a GQA layer into (group, KV heads)
    rows with a copy (flash_api.cpp mha_varlen_fwd, `seqlenq_ngroups_swapped`: a view for one
    sequence or one KV head, a copy otherwise), else 0."""
    gqa = split == "fa2" and op.heads > op.kv_heads >= 2
    return np.where(gqa & (np.asarray(op.batch, dtype=float) >= 2), 1.0, 0.0)
