"""Operator time on a device: roofline with named efficiency factors.

kernel time = max(flops / (peak * compute_eff), bytes / (bandwidth * memory_eff)) + kernel latency
collective  = latency + bytes on the wire / (link bandwidth * busbw efficiency)

All functions broadcast over numpy arrays (one element per step of a vectorised sweep). An op
with no work costs nothing, not even its kernel latency. Efficiency factors come from the
hardware spec (`efficiency:` in its YAML), each with the measurement it came from. Attention
kernels' thread blocks and the decode KV read live in `costmodel.attention_kernels`; the launch
cost of one-block-per-token elementwise kernels in `costmodel.elementwise_kernels`.

Not modelled: L2 cache reuse across kernels, clock throttling under power caps, overlap of
communication with compute (but for context parallelism's ring, `_overlap_ring`, and an
engine's fused GEMM + tensor-parallel all-reduce, `_overlap_tp`),
contention between concurrent kernels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from simulator.costmodel import elementwise_kernels
from simulator.costmodel.attention_kernels import (
    Kernels,
    cache_write_waves,
    decode_blocks,
    decode_kv_s,
    gqa_group,
    gqa_relayout,
    kernels,
    per_query_head_reads,
    prefill_work,
)
from simulator.costmodel.ops import Op
from simulator.specs.engine import EngineSpec
from simulator.specs.hardware import GemmEfficiency, HardwareSpec

T = TypeVar("T")
D = TypeVar("D")

BOUNDS = ("compute", "memory", "latency", "network")


@dataclass(frozen=True, slots=True)
class OpCost:
    """Cost of one op per instance (times in seconds). Every field is an array of the op's batch
    shape (one element for a scalar op), whatever the op's dtype."""

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


def _pow2_tiles(lo: int, hi: int) -> list[float]:
    tiles, t = [], float(max(1, lo))
    while t <= hi:
        tiles.append(t)
        t *= 2
    return tiles or [float(hi)]


# Weight-only kernels take the batch's rows in blocks of 16, the m of one mma.sync tile: Marlin
# (the int4, fp8 and fp4 weight-only GEMMs of vLLM) runs ceil(m / 16) row blocks, 1-4 per pass
# (IST-DASLab/marlin@0f102e11 marlin/marlin_cuda_kernel.cu, `marlin_cuda`: thread_m_blocks),
# so a decode batch of a few rows pads to 16, not to the 16-bit GEMM library's smallest tile.
WEIGHT_ONLY_TILE_M = 16


def gemm_key(op: Op) -> str:
    """The key of a GEMM's per-dtype factors: `fp8_block` for a dense fp8 GEMM on weights
    scaled per block, else its dtype. A fused MoE kernel on such weights keeps fp8's: its own
    `fused_moe_fraction` of them prices the block scales (`Kernels.moe_fraction_of`)."""
    return "fp8_block" if op.fp8_blocks and op.fused_moe is None else op.dtype


def gemm_factor(table: Mapping[Any, T], op: Op, default: D) -> T | D:
    """The GEMM library's per-dtype factor for `op`: its key's (`gemm_key`) where the table
    has one, else its dtype's (block-scaled fp8 without factors of its own takes fp8's), else
    `default`."""
    key = gemm_key(op)
    return table[key] if key in table else table.get(op.dtype, default)


def gemm_efficiency(
    hw: HardwareSpec,
    op: Op,
    eff: GemmEfficiency | None = None,
    *,
    tile: tuple[int, int] | None = None,
) -> np.ndarray:
    """Fraction of the dense peak a GEMM reaches: library peak fraction x tile padding x wave
    quantisation x size ramp (of the work the tile costs), at most the device's data ceiling
    (real weights). The tile (powers of two between the spec's minimum and maximum) is the
    fastest for the shape, or the kernel's fixed `tile` (rows, columns); split-K fills the
    machine when there are fewer output tiles than SMs and k is long. `eff`: the GEMM
    library's factors (default: the device's own)."""
    eff = hw.efficiency.gemm if eff is None else eff
    m = np.maximum(np.asarray(op.m, dtype=float), 1.0)
    n = np.maximum(np.asarray(op.n, dtype=float), 1.0)
    groups = np.maximum(np.asarray(op.groups, dtype=float), 1.0)
    # A smooth fill, as for attention's split-KV: whole splits would make k just below a
    # multiple of split_k_min_k slower than the multiple (k = 960 slower than 1024).
    max_split = np.maximum(1.0, np.asarray(op.k, dtype=float) / eff.split_k_min_k)
    units = hw.compute.units
    frac = gemm_factor(eff.peak_fraction, op, eff.peak_fraction.get("bf16", 0.7))
    curve = gemm_factor(eff.size_curves, op, eff.size_curve)
    flops = np.asarray(op.flops, dtype=float)
    best = np.zeros(np.broadcast_shapes(m.shape, n.shape, groups.shape, max_split.shape))
    tile_m_min = min(eff.tile_m_min, WEIGHT_ONLY_TILE_M) if op.weight_only else eff.tile_m_min
    if tile is None:
        tiles = [
            (tile_m, tile_n)
            for tile_m in _pow2_tiles(tile_m_min, eff.tile_m)
            for tile_n in _pow2_tiles(eff.tile_n_min, eff.tile_n)
        ]
    else:  # a kernel's fixed configuration, which does not split k
        tiles, max_split = [tile], np.ones_like(max_split)
    for tile_m, tile_n in tiles:
        tiles_m, tiles_n = np.ceil(m / tile_m), np.ceil(n / tile_n)
        padding = (m * n) / (tiles_m * tile_m * tiles_n * tile_n)
        count = tiles_m * tiles_n * groups
        split_k = np.clip(np.floor(units / count), 1.0, max_split)
        work = count * split_k
        waves = work / (np.ceil(work / units) * units)
        # The size ramp follows the work this tile costs: its padded FLOPs over the wave
        # utilisation (time = X / curve(X) with X never falling as m or n grows, and the
        # curve's bounded elasticity keeps that monotone). The library takes the fastest.
        occupied = padding * waves
        best = np.maximum(best, occupied * curve(flops / occupied))
    ceiling = gemm_factor(eff.data_ceiling, op, None)
    return frac * best if ceiling is None else np.minimum(frac * best, ceiling)


# vLLM's get_default_config (vllm/model_executor/layers/fused_moe/fused_moe.py, 0.6-0.14) for
# calls of more tokens than local experts: BLOCK_SIZE_M 64, BLOCK_SIZE_N 64 (BLOCK_SIZE_K 32,
# GROUP_SIZE_M 8, Triton's default warps and stages), whatever the shape
DEFAULT_MOE_TILE = (64, 64)


def _peak(hw: HardwareSpec, dtype: str) -> float:
    peak = hw.peak_flops(dtype)
    return peak if peak > 0 else max(hw.peak_flops("bf16"), hw.peak_flops("fp16"))


def _kernel_cost(
    hw: HardwareSpec, op: Op, k: Kernels
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
    if elementwise_kernels.priced(hw, op, k.row_kernels):
        memory = np.maximum(memory, elementwise_kernels.row_time_s(hw, op))
    peak = _peak(hw, op.dtype)
    at = eff.attention
    kv = at.fp8_kv_factor if op.kv_dtype == "fp8" else 1.0
    comp_eff: np.ndarray | float
    match op.kind:
        case "gemm":
            comp_eff = gemm_efficiency(hw, op, k.gemm)
            if op.fused_moe is not None:  # the engine's fused MoE kernel, not the GEMM library
                fraction = k.moe_fraction_of(op.dtype, fp8_blocks=op.fp8_blocks)
                comp_eff = comp_eff * fraction
                factor = k.moe_default_factor(op.fused_moe, op.dtype, fp8_blocks=op.fp8_blocks)
                if factor is not None:  # vLLM's default configuration: its large-batch tile
                    large = np.asarray(op.moe_tokens, dtype=float) > op.fused_moe[0]
                    fixed = gemm_efficiency(hw, op, k.gemm, tile=DEFAULT_MOE_TILE)
                    fixed = fixed * fraction * factor
                    comp_eff = np.where(large, fixed, comp_eff)
        case "attention_prefill":
            comp_eff = (
                at.prefill_fraction
                * k.attention_factor
                * kv
                * at.prefill_len_curve(op.seq_len)
                * at.prefill_parallel_curve(prefill_work(op, at.decode_split))
                * at.prefill_group_curve(gqa_group(op))
            )
            if k.prefill_speed is not None:  # the engine's kernel, not the device's
                comp_eff = comp_eff * k.prefill_speed(op.seq_len)
        case "attention_decode":
            comp_eff = at.prefill_fraction * k.attention_factor
            # KV-cache reads stream at the kernel's efficiency; the per-sequence query,
            # output and new-KV traffic at the device's.
            rest = np.maximum(nbytes - np.asarray(op.kv_bytes, dtype=float), 0.0)
            rest_eff = eff.memory.stream_fraction * eff.memory.size_curve(np.maximum(rest, 1.0))
            memory = decode_kv_s(hw, op, k) + rest / (bw * rest_eff)
        case _:
            comp_eff = 1.0
    compute = np.divide(flops, peak * comp_eff, out=np.zeros_like(flops), where=flops > 0)
    busy = (flops > 0) | (nbytes > 0)
    latency = np.where(busy, _fixed_s(hw, op, k), 0.0)
    pre = np.asarray(op.pre_bytes, dtype=float)
    serial = np.zeros(1)
    if not k.fused_quant and np.any(pre > 0):  # a separate kernel first: its time and launch
        quant = gemm_factor(k.gemm.quant_fraction, op, eff.memory.stream_fraction)
        pre_eff = quant * k.gemm.quant_size_curve(np.maximum(pre, 1.0))
        serial = np.where(pre > 0, pre / (bw * pre_eff), 0.0)
        latency = latency + np.where(pre > 0, eff.kernel_latency_s, 0.0)
    return compute, memory, latency, serial


def _fixed_s(hw: HardwareSpec, op: Op, k: Kernels) -> float | np.ndarray:
    """Fixed cost of one call of the op's kernel(s) (attention: plus a time per wave of thread
    blocks, and per wave of the KV-cache write kernel's one-block-per-token grid)."""
    attn = hw.efficiency.attention
    units = hw.compute.units
    match op.kind:
        case "attention_prefill":
            fixed = attn.prefill_fixed_s
            base = hw.efficiency.kernel_latency_s if fixed is None else fixed
            waves = prefill_work(op, attn.decode_split) / units
            write = attn.cache_write_block_s * cache_write_waves(hw, op)
            return base + attn.prefill_wave_s * waves + write
        case "attention_decode":
            fixed = attn.decode_fixed_s
            base = hw.efficiency.kernel_latency_s if fixed is None else fixed
            return (
                base
                + attn.decode_wave_s * decode_blocks(hw, op, k.split) / units
                + attn.decode_gqa_copy_s * gqa_relayout(op, k.split)
                + attn.cache_write_block_s * cache_write_waves(hw, op)
            )
        case "gemm":
            extra = gemm_factor(k.gemm.extra_latency_s, op, 0.0)
            return hw.efficiency.kernel_latency_s + extra
        case "memory" if elementwise_kernels.priced(hw, op, k.row_kernels):
            return elementwise_kernels.fixed_s(hw)
        case _:
            return hw.efficiency.kernel_latency_s


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


def spans_nodes(hw: HardwareSpec, op: Op) -> bool:
    """Whether `op` is a tensor-parallel all-reduce or all-gather over whole nodes (tp a
    multiple of gpus_per_node > 1 node), which NCCL runs hierarchically (`_hierarchical`).
    Collectives flagged `scale_out` (context parallelism's, one device per node and rank)
    keep the flat ring over the NIC."""
    g = hw.interconnect.gpus_per_node
    n = op.group_size
    return (
        op.collective in ("all_reduce", "all_gather") and not op.scale_out and n > g and n % g == 0
    )


def _hierarchical(hw: HardwareSpec, op: Op) -> tuple[np.ndarray, np.ndarray]:
    """(network, latency) seconds of an all-reduce or all-gather of `msg_bytes` over n devices
    in k = n / g nodes of g, as NCCL runs it across nodes (Hu et al., "Demystifying NCCL",
    arXiv 2507.04786; NCCL's tree/ring algorithms, NVIDIA/nccl docs): all-reduce =
    reduce-scatter inside each node over the scale-up fabric ((g - 1) / g of the message), an
    all-reduce of each device's 1/g share among the k devices of the same local rank over
    their own NICs (2 (k - 1) / k of msg / g, the per-GPU scale-out bandwidth; one NIC per
    GPU as on DGX/HGX), then an all-gather inside the node. An all-gather: the inter-node
    all-gather of the 1/g shares ((k - 1) / k of msg / g over the NIC), then the intra-node
    one ((g - 1) / g of msg). Each phase's efficiency follows its own message size; latency:
    the intra-node collective's fixed cost per intra phase, plus one scale-out hop latency
    per ring step between nodes (2 (k - 1) for the all-reduce, k - 1 for the gather)."""
    ic, coll = hw.interconnect, hw.efficiency.collective
    g = ic.gpus_per_node
    k = op.group_size // g
    msg = np.asarray(op.msg_bytes, dtype=float)
    share = msg / g
    eff_in = coll.busbw_fraction * coll.size_curve(np.maximum(msg, 1.0))
    eff_out = coll.busbw_fraction * coll.size_curve(np.maximum(share, 1.0))
    bw_in = collective_bandwidth(hw, g, scale_out=False)
    intra = (g - 1) / g * msg / (bw_in * eff_in)
    intra_fixed = coll.latency_s * coll.latency_group_curve(float(g))
    if op.collective == "all_reduce":
        inter = 2.0 * (k - 1) / k * share / (ic.scale_out_bw_bytes_per_s * eff_out)
        network = 2.0 * intra + inter
        fixed = 2.0 * intra_fixed + 2.0 * (k - 1) * ic.scale_out_latency_s
    else:
        inter = (k - 1) / k * share / (ic.scale_out_bw_bytes_per_s * eff_out)
        network = intra + inter
        fixed = intra_fixed + (k - 1) * ic.scale_out_latency_s
    return network, np.asarray(fixed) * np.ones_like(msg)


def _collective_cost(hw: HardwareSpec, op: Op) -> tuple[np.ndarray, np.ndarray]:
    msg = np.asarray(op.msg_bytes, dtype=float)
    if op.collective == "host_copy":  # over the host link at its measured share of PCIe
        link = hw.host.pcie_bw_bytes_per_s * hw.efficiency.host_link_fraction
        launch = hw.efficiency.kernel_latency_s  # one asynchronous copy's launch
        return np.where(msg > 0, msg / link, 0.0), np.where(msg > 0, launch, 0.0)
    if spans_nodes(hw, op):
        network, latency = _hierarchical(hw, op)
        return np.where(msg > 0, network, 0.0), np.where(msg > 0, latency, 0.0)
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
    choices = kernels(hw, engine)
    costs = []
    for op in ops:
        if op.kind == "attention_decode" and choices.kv_per_query_head:
            op = per_query_head_reads(op)  # the KV reads as the engine's kernel makes them
        zero = np.zeros(1)
        if op.kind == "collective":
            network, latency = _collective_cost(hw, op)
            compute = memory = zero
            time = network + latency
        else:
            compute, memory, latency, serial = _kernel_cost(hw, op, choices)
            network = zero
            time = np.maximum(compute, memory) + serial + latency
            memory = memory + serial  # the pre-kernel's traffic counts as memory time
        shape = np.shape(time) or (1,)
        costs.append(
            OpCost(
                op,
                _shaped(time, shape),
                _shaped(compute, shape),
                _shaped(memory, shape),
                _shaped(network, shape),
                _shaped(latency, shape),
            )
        )
    costs = _overlap_ring(costs)
    costs = overlap_shadowkv(costs)
    if engine is not None and engine.tp_comm_overlap > 0:
        costs = _overlap_tp(costs, engine.tp_comm_overlap)
    return costs


# The GEMMs whose output the tensor-parallel all-reduces carry (attention out, MLP out).
TP_PRODUCERS = ("o_proj", "down_proj", "expert_down_proj", "shared_down_proj")


def _overlap_tp(costs: list[OpCost], fraction: float) -> list[OpCost]:
    """An engine that fuses each all-reduce with the GEMM producing its input (T3, arXiv
    2401.16677; vLLM's opt-in async-TP collective fusion) sends finished tiles while the rest
    compute: the step hides min(all-reduce, `fraction` x the producers' time) of
    `tp_all_reduce`'s time (never more than the all-reduce, so no step gets slower). The
    fraction and its sources: `costmodel/tp_overlap.yaml`."""
    at = {c.op.name: i for i, c in enumerate(costs)}
    if "tp_all_reduce" not in at:
        return costs
    ar = costs[at["tp_all_reduce"]]
    producers = [costs[at[n]].total_s for n in TP_PRODUCERS if n in at]
    if not producers:
        return costs
    gemm_s = sum(producers, start=np.zeros(1))
    hidden = np.minimum(ar.total_s, fraction * gemm_s)
    exposed = (ar.total_s - hidden) / ar.op.count
    costs[at["tp_all_reduce"]] = dataclasses.replace(ar, time_s=_shaped(exposed, ar.time_s.shape))
    return costs


def tp_overlap_fraction() -> float:
    """The sourced share of the producer GEMMs a fused all-reduce runs under
    (`costmodel/tp_overlap.yaml`), what `--overlap-tp-comm` turns on."""
    import yaml

    text = (Path(__file__).parent / "tp_overlap.yaml").read_text()
    return float(yaml.safe_load(text)["tp_comm_fraction"])


def _overlap_ring(costs: list[OpCost]) -> list[OpCost]:
    """Context parallelism's ring (`ops.context_parallel_ops`): each of a layer's cp - 1 KV
    transfers runs while the rank attends to the block it holds, 1/cp of its attention, so a
    layer takes its first block's attention plus cp - 1 steps of max(attention, transfer) =
    its attention plus cp - 1 times what a transfer outlasts a block's. The transfer's time
    becomes that exposed part (compute-bound rings hide it all: Liu et al., arXiv 2310.01889
    section 3)."""
    at = {c.op.name: i for i, c in enumerate(costs)}
    if "cp_ring_kv" not in at or "attention_prefill" not in at:
        return costs
    ring, attn = costs[at["cp_ring_kv"]], costs[at["attention_prefill"]]
    cp = ring.op.count / attn.op.count + 1.0
    exposed = np.maximum(ring.time_s - attn.time_s / cp, 0.0)
    costs[at["cp_ring_kv"]] = dataclasses.replace(ring, time_s=exposed)
    return costs


def overlap_shadowkv(costs: list[OpCost]) -> list[OpCost]:
    """ShadowKV fetches the selected values over the host link on one CUDA stream while it
    rebuilds the selected keys on another (arXiv 2410.21465, sec. 4.2): a layer takes the
    longer of the two, so the fetch's time becomes what it outlasts the rebuild by."""
    at = {c.op.name: i for i, c in enumerate(costs)}
    if "shadowkv_value_fetch" not in at or "shadowkv_key_rebuild" not in at:
        return costs
    fetch, rebuild = costs[at["shadowkv_value_fetch"]], costs[at["shadowkv_key_rebuild"]]
    exposed = np.maximum(fetch.time_s - rebuild.time_s, 0.0)
    costs[at["shadowkv_value_fetch"]] = dataclasses.replace(fetch, time_s=exposed)
    return costs


def _shaped(x: np.ndarray | float, shape: tuple[int, ...]) -> np.ndarray:
    """`x` as a float array of `shape`: every field of every OpCost has the op's batch shape,
    at least one element (a scalar op's cost is an array of one, whatever its dtype). Cheap
    where it is already so, as it is called five times an op."""
    if type(x) is np.ndarray and x.shape == shape:
        return x
    if shape == (1,):
        return np.array(x, dtype=float, ndmin=1)
    return np.broadcast_to(np.asarray(x, dtype=float), shape)  # read-only, no copy of N zeros


def total_time(costs: list[OpCost]) -> np.ndarray:
    """Sum of count x time over all ops."""
    return sum((c.total_s for c in costs), start=np.zeros(1))


def total_launches(costs: list[OpCost]) -> np.ndarray:
    """Kernels launched: the repeat count of every op with work."""
    return sum((c.op.count * (c.time_s > 0) for c in costs), start=np.zeros(1))
