"""Operator time on a device: roofline with named efficiency factors.

kernel time = max(flops / (peak * compute_eff), bytes / (bandwidth * memory_eff)) + kernel latency
collective  = latency + bytes on the wire / (link bandwidth * busbw efficiency)

All functions broadcast over numpy arrays (one element per step of a vectorised sweep). An op
with no work costs nothing, not even its kernel latency. Efficiency factors come from the
hardware spec (`efficiency:` in its YAML), each with the measurement it came from.

Not modelled: L2 cache reuse across kernels, clock throttling under power caps, overlap of
communication with compute, contention between concurrent kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.costmodel.batch import Num
from simulator.costmodel.ops import Op
from simulator.specs.engine import EngineSpec
from simulator.specs.hardware import DecodeSplit, HardwareSpec

BOUNDS = ("compute", "memory", "latency", "network")


@dataclass(frozen=True, slots=True)
class OpCost:
    """Cost of one op per instance (times in seconds; arrays when the batch is vectorised)."""

    op: Op
    time_s: np.ndarray
    compute_s: np.ndarray
    memory_s: np.ndarray
    network_s: np.ndarray
    latency_s: np.ndarray

    @property
    def total_s(self) -> np.ndarray:
        return self.time_s * self.op.count

    @property
    def bound(self) -> np.ndarray:
        """Which of compute, memory, latency (fixed costs) or network dominates. An op with no
        work (an all-reduce over one device) counts as latency-bound: only fixed costs remain."""
        parts = np.stack(
            np.broadcast_arrays(self.compute_s, self.memory_s, self.latency_s, self.network_s)
        )
        names = np.asarray(BOUNDS)[np.argmax(parts, axis=0)]
        return np.where(parts.max(axis=0) > 0, names, "latency")


def _ceil_div(a: Num, b: float) -> np.ndarray:
    return np.ceil(np.asarray(a, dtype=float) / b)


def _pow2_tiles(lo: int, hi: int) -> list[float]:
    tiles, t = [], float(max(1, lo))
    while t <= hi:
        tiles.append(t)
        t *= 2
    return tiles or [float(hi)]


def gemm_efficiency(hw: HardwareSpec, op: Op) -> np.ndarray:
    """Fraction of the dense peak a GEMM reaches: library peak fraction x tile padding x wave
    quantisation x size ramp (of the work the tile costs). The tile (powers of two between the
    spec's minimum and maximum) is the fastest for the shape; split-K fills the machine when
    there are fewer output tiles than SMs and k is long."""
    eff = hw.efficiency.gemm
    m = np.maximum(np.asarray(op.m, dtype=float), 1.0)
    n = np.maximum(np.asarray(op.n, dtype=float), 1.0)
    groups = np.maximum(np.asarray(op.groups, dtype=float), 1.0)
    max_split = np.maximum(1.0, np.floor(np.asarray(op.k, dtype=float) / eff.split_k_min_k))
    units = hw.compute.units
    frac = eff.peak_fraction.get(op.dtype, eff.peak_fraction.get("bf16", 0.7))  # type: ignore[call-overload]
    curve = eff.size_curves.get(op.dtype, eff.size_curve)  # type: ignore[call-overload]
    flops = np.asarray(op.flops, dtype=float)
    best = np.zeros(np.broadcast_shapes(m.shape, n.shape, groups.shape, max_split.shape))
    for tile_m in _pow2_tiles(eff.tile_m_min, eff.tile_m):
        for tile_n in _pow2_tiles(eff.tile_n_min, eff.tile_n):
            tiles_m, tiles_n = np.ceil(m / tile_m), np.ceil(n / tile_n)
            padding = (m * n) / (tiles_m * tile_m * tiles_n * tile_n)
            tiles = tiles_m * tiles_n * groups
            split_k = np.clip(np.floor(units / tiles), 1.0, max_split)
            work = tiles * split_k
            waves = work / (np.ceil(work / units) * units)
            # The size ramp follows the work this tile costs: its padded FLOPs over the wave
            # utilisation (time = X / curve(X) with X never falling as m or n grows, and the
            # curve's bounded elasticity keeps that monotone). The library takes the fastest.
            occupied = padding * waves
            best = np.maximum(best, occupied * curve(flops / occupied))
    return frac * best


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


def attention_work(op: Op, *, tile: float) -> np.ndarray:
    """Independent blocks of work an attention kernel spreads over the SMs: sequences x KV
    heads x tiles of the rows each (sequence, KV head) pair has. Prefill packs the query heads
    of a GQA group into one block's rows (s x group rows); decode splits the KV length.
    Continuous in the length (at least one tile), so work grows in proportion to it, which
    keeps the fitted curves' bounded elasticity from making a longer sequence faster."""
    length = np.asarray(op.seq_len, dtype=float)
    if op.kind == "attention_prefill":
        length = length * _group(op)
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
        kv * max(_group(op) / FA2_PREFILL_TILE, 1.0),
        kv * _group(op) * np.maximum(length / FA2_PREFILL_TILE, 1.0),
    )
    return np.maximum(np.asarray(op.batch, dtype=float), 1.0) * per_seq


def _group(op: Op) -> float:
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
    rows = np.ceil(_group(op) / DECODE_TILE_M)
    unsplit = seqs * max(op.kv_heads, 1.0) * rows
    units = float(hw.compute.units)
    match split:
        case "none":
            return unsplit
        case "fa2":
            if _group(op) <= 1.0:
                return unsplit
            fill = 2.0 * units
        case "fa3":
            fill = units / 1.1
    return np.minimum(unsplit * tiles, np.maximum(unsplit, fill))


def _decode_slots(hw: HardwareSpec, split: DecodeSplit) -> float:
    """Decode blocks resident at once: two per SM for the 128-thread blocks of FA2 and
    PagedAttention, else one."""
    per_sm = 2.0 if split in ("fa2", "paged_v2") else 1.0
    return per_sm * hw.compute.units


@dataclass(frozen=True, slots=True)
class _Kernels:
    """How an engine runs the kernels on a device (`evaluate`'s engine, resolved once)."""

    attention_factor: float
    fused_quant: bool
    split: DecodeSplit


def _kernels(hw: HardwareSpec, engine: EngineSpec | None) -> _Kernels:
    if engine is None:  # every kernel as measured alone
        return _Kernels(1.0, False, decode_split(hw))
    return _Kernels(
        engine.attention_factor, engine.fused_activation_quant, decode_split(hw, engine)
    )


def _decode_kv_s(hw: HardwareSpec, op: Op, k: _Kernels) -> np.ndarray:
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
        * at.decode_group_curve(_group(op)),
    )
    kv_bytes = np.asarray(op.kv_bytes, dtype=float)
    seconds = kv_bytes / (hw.memory.bandwidth_bytes_per_s * eff)
    limits: list[np.ndarray] = []
    if at.decode_block_bytes_per_s is not None:
        resident = np.minimum(decode_blocks(hw, op, k.split), _decode_slots(hw, k.split))
        rate = at.decode_block_bytes_per_s * k.attention_factor * kv
        limits.append(kv_bytes / (rate * resident))
    if at.decode_walk_tokens_per_s is not None and k.split == "fa3":
        walk = at.decode_walk_tokens_per_s * k.attention_factor * kv
        limits.append(_walk_tokens(op, at.decode_walk_seqs) / walk)
    if not limits:
        return seconds
    # A soft maximum: near a crossing both limits cost (and the fit sees a gradient).
    p = DECODE_BOUND_POWER
    return (seconds**p + sum(t**p for t in limits)) ** (1.0 / p)


def _walk_tokens(op: Op, shared: float) -> np.ndarray:
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


def _peak(hw: HardwareSpec, dtype: str) -> float:
    peak = hw.peak_flops(dtype)
    return peak if peak > 0 else max(hw.peak_flops("bf16"), hw.peak_flops("fp16"))


def _kernel_cost(
    hw: HardwareSpec, op: Op, k: _Kernels
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(compute, memory, fixed, serial) seconds of one kernel op: `serial` is the memory-bound
    kernel that must finish before it starts (`pre_bytes`), which overlaps nothing; none
    where the engine fuses it into the kernel before (`k.fused_quant`)."""
    flops = np.asarray(op.flops, dtype=float)
    nbytes = np.asarray(op.bytes, dtype=float)
    eff = hw.efficiency
    bw = hw.memory.bandwidth_bytes_per_s
    mem_eff = eff.memory.stream_fraction * eff.memory.size_curve(nbytes)
    memory = nbytes / (bw * mem_eff)
    peak = _peak(hw, op.dtype)
    at = eff.attention
    kv = at.fp8_kv_factor if op.kv_dtype == "fp8" else 1.0
    comp_eff: np.ndarray | float
    match op.kind:
        case "gemm":
            comp_eff = gemm_efficiency(hw, op)
        case "attention_prefill":
            comp_eff = (
                at.prefill_fraction
                * k.attention_factor
                * kv
                * at.prefill_len_curve(op.seq_len)
                * at.prefill_parallel_curve(prefill_work(op, at.decode_split))
                * at.prefill_group_curve(_group(op))
            )
        case "attention_decode":
            comp_eff = at.prefill_fraction * k.attention_factor
            # KV-cache reads stream at the kernel's efficiency; the per-sequence query,
            # output and new-KV traffic at the device's.
            rest = np.maximum(nbytes - np.asarray(op.kv_bytes, dtype=float), 0.0)
            rest_eff = eff.memory.stream_fraction * eff.memory.size_curve(np.maximum(rest, 1.0))
            memory = _decode_kv_s(hw, op, k) + rest / (bw * rest_eff)
        case _:
            comp_eff = 1.0
    compute = np.divide(flops, peak * comp_eff, out=np.zeros_like(flops), where=flops > 0)
    busy = (flops > 0) | (nbytes > 0)
    latency = np.where(busy, _fixed_s(hw, op, k.split), 0.0)
    pre = np.asarray(op.pre_bytes, dtype=float)
    serial = np.zeros(1)
    if not k.fused_quant and np.any(pre > 0):  # a separate kernel first: its time and launch
        quant = eff.gemm.quant_fraction.get(op.dtype, eff.memory.stream_fraction)  # type: ignore[call-overload]
        pre_eff = quant * eff.gemm.quant_size_curve(np.maximum(pre, 1.0))
        serial = np.where(pre > 0, pre / (bw * pre_eff), 0.0)
        latency = latency + np.where(pre > 0, eff.kernel_latency_s, 0.0)
    return compute, memory, latency, serial


def _fixed_s(hw: HardwareSpec, op: Op, split: DecodeSplit) -> float | np.ndarray:
    """Fixed cost of one call of the op's kernel(s) (attention: plus a time per wave of thread
    blocks)."""
    attn = hw.efficiency.attention
    units = hw.compute.units
    match op.kind:
        case "attention_prefill":
            fixed = attn.prefill_fixed_s
            base = hw.efficiency.kernel_latency_s if fixed is None else fixed
            return base + attn.prefill_wave_s * prefill_work(op, attn.decode_split) / units
        case "attention_decode":
            fixed = attn.decode_fixed_s
            base = hw.efficiency.kernel_latency_s if fixed is None else fixed
            return (
                base
                + attn.decode_wave_s * decode_blocks(hw, op, split) / units
                + attn.decode_gqa_copy_s * _gqa_relayout(op, split)
            )
        case "gemm":
            extra = hw.efficiency.gemm.extra_latency_s.get(op.dtype, 0.0)  # type: ignore[call-overload]
            return hw.efficiency.kernel_latency_s + extra
        case _:
            return hw.efficiency.kernel_latency_s


def _gqa_relayout(op: Op, split: DecodeSplit) -> np.ndarray:
    """1 where vLLM's FA2 decode re-lays out the query of a GQA layer into (group, KV heads)
    rows with a copy (flash_api.cpp mha_varlen_fwd, `seqlenq_ngroups_swapped`: a view for one
    sequence or one KV head, a copy otherwise), else 0."""
    gqa = split == "fa2" and op.heads > op.kv_heads >= 2
    return np.where(gqa & (np.asarray(op.batch, dtype=float) >= 2), 1.0, 0.0)


def collective_bandwidth(hw: HardwareSpec, group: int, *, scale_out: bool) -> float:
    """Per-device bandwidth (bytes/s, one direction) a collective over `group` devices gets."""
    ic = hw.interconnect
    if scale_out or group > ic.gpus_per_node:
        return ic.scale_out_bw_bytes_per_s
    match ic.topology:
        case "switch":
            return ic.link_bw_bytes_per_s
        case "mesh":  # a direct link to each of the other group members
            return min(ic.link_bw_bytes_per_s, ic.peer_bw_bytes_per_s * (group - 1))
        case "pcie":
            return min(
                ic.peer_bw_bytes_per_s,
                hw.host.pcie_bw_bytes_per_s * hw.efficiency.host_link_fraction,
            )


def wire_bytes(op: Op) -> np.ndarray:
    """Bytes each device sends for the collective (ring algorithms)."""
    n, msg = op.group_size, np.asarray(op.msg_bytes, dtype=float)
    match op.collective:
        case "all_reduce":
            return 2.0 * (n - 1) / n * msg
        case "all_gather" | "all_to_all":
            return (n - 1) / n * msg
        case _:
            return msg


def _all_to_all_across_nodes(hw: HardwareSpec, op: Op, eff: np.ndarray) -> np.ndarray:
    """Network seconds of an all-to-all over n devices spanning nodes of g: of a device's n
    equal shares, g - 1 go to peers in its node over the scale-up fabric while n - g leave
    the node over its NIC at the same time (DeepEP's internode kernels); the slower sets the
    time."""
    n, g = op.group_size, hw.interconnect.gpus_per_node
    msg = np.asarray(op.msg_bytes, dtype=float)
    inside = (g - 1) / n * msg / (collective_bandwidth(hw, g, scale_out=False) * eff)
    outside = (n - g) / n * msg / (hw.interconnect.scale_out_bw_bytes_per_s * eff)
    return np.maximum(inside, outside)


def _collective_cost(hw: HardwareSpec, op: Op) -> tuple[np.ndarray, np.ndarray]:
    msg = np.asarray(op.msg_bytes, dtype=float)
    coll = hw.efficiency.collective
    bw = collective_bandwidth(hw, op.group_size, scale_out=op.scale_out)
    eff = coll.busbw_fraction * coll.size_curve(np.maximum(msg, 1.0))
    network = wire_bytes(op) / (bw * eff)
    if op.collective == "all_to_all" and op.group_size > hw.interconnect.gpus_per_node:
        network = _all_to_all_across_nodes(hw, op, eff)
    fixed: float | np.ndarray
    if op.collective == "send_recv":
        fixed = hw.interconnect.scale_out_latency_s if op.scale_out else hw.interconnect.latency_s
    else:
        fixed = coll.latency_s * coll.latency_group_curve(float(op.group_size))
    latency = np.where(msg > 0, fixed, 0.0)
    return np.where(msg > 0, network, 0.0), latency


def evaluate(ops: list[Op], hw: HardwareSpec, engine: EngineSpec | None = None) -> list[OpCost]:
    """Time every op on `hw` as `engine` runs it: its attention factor scales attention
    efficiency, and it may fuse W8A8 activation quantisation away. Without an engine, every
    kernel runs as measured alone (attention factor 1, quantisation in its own kernel)."""
    kernels = _kernels(hw, engine)
    costs = []
    for op in ops:
        zero = np.zeros(1)
        if op.kind == "collective":
            network, latency = _collective_cost(hw, op)
            compute = memory = zero
            time = network + latency
        else:
            compute, memory, latency, serial = _kernel_cost(hw, op, kernels)
            network = zero
            time = np.maximum(compute, memory) + serial + latency
            memory = memory + serial  # the pre-kernel's traffic counts as memory time
        costs.append(OpCost(op, time, compute, memory, network, latency))
    return costs


def total_time(costs: list[OpCost]) -> np.ndarray:
    """Sum of count x time over all ops."""
    return sum((c.total_s for c in costs), start=np.zeros(1))


def total_launches(costs: list[OpCost]) -> np.ndarray:
    """Kernels launched: the repeat count of every op with work."""
    return sum((c.op.count * (c.time_s > 0) for c in costs), start=np.zeros(1))
