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
from simulator.specs.hardware import HardwareSpec

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


def gemm_efficiency(hw: HardwareSpec, op: Op) -> np.ndarray:
    """Fraction of the dense peak a GEMM reaches: library peak fraction x tile padding x wave
    quantisation x size ramp. Skinny m uses the smallest row tile that covers it; split-K
    fills the machine when there are fewer output tiles than SMs and k is long."""
    eff = hw.efficiency.gemm
    m = np.maximum(np.asarray(op.m, dtype=float), 1.0)
    tile_m = np.clip(2.0 ** np.ceil(np.log2(m)), eff.tile_m_min, eff.tile_m)
    tiles_m, tiles_n = _ceil_div(m, 1.0) / tile_m, _ceil_div(op.n, eff.tile_n)
    tiles_m = np.ceil(tiles_m)
    padding = (m * op.n) / (tiles_m * tile_m * tiles_n * eff.tile_n)
    tiles = tiles_m * tiles_n * np.maximum(np.asarray(op.groups, dtype=float), 1.0)
    units = hw.compute.units
    max_split = np.maximum(1.0, np.floor(np.asarray(op.k, dtype=float) / 512))
    split_k = np.clip(np.floor(units / tiles), 1.0, max_split)
    work = tiles * split_k
    waves = work / (np.ceil(work / units) * units)
    frac = eff.peak_fraction.get(op.dtype, eff.peak_fraction.get("bf16", 0.7))  # type: ignore[call-overload]
    return frac * padding * waves * eff.size_curve(np.asarray(op.flops, dtype=float))


def _peak(hw: HardwareSpec, dtype: str) -> float:
    peak = hw.peak_flops(dtype)
    return peak if peak > 0 else max(hw.peak_flops("bf16"), hw.peak_flops("fp16"))


def _kernel_cost(
    hw: HardwareSpec, op: Op, attention_factor: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    flops = np.asarray(op.flops, dtype=float)
    nbytes = np.asarray(op.bytes, dtype=float)
    eff = hw.efficiency
    mem_eff = eff.memory.stream_fraction * eff.memory.size_curve(nbytes)
    peak = _peak(hw, op.dtype)
    comp_eff: np.ndarray | float
    match op.kind:
        case "gemm":
            comp_eff = gemm_efficiency(hw, op)
        case "attention_prefill":
            comp_eff = (
                eff.attention.prefill_fraction
                * attention_factor
                * eff.attention.prefill_len_curve(op.seq_len)
            )
        case "attention_decode":
            comp_eff = eff.attention.prefill_fraction * attention_factor
            mem_eff = np.minimum(
                1.0,
                eff.attention.decode_fraction
                * attention_factor
                * eff.attention.decode_len_curve(op.seq_len),
            )
        case _:
            comp_eff = 1.0
    compute = np.divide(flops, peak * comp_eff, out=np.zeros_like(flops), where=flops > 0)
    memory = nbytes / (hw.memory.bandwidth_bytes_per_s * mem_eff)
    busy = (flops > 0) | (nbytes > 0)
    latency = np.where(busy, eff.kernel_latency_s, 0.0)
    return compute, memory, latency


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


def _collective_cost(hw: HardwareSpec, op: Op) -> tuple[np.ndarray, np.ndarray]:
    msg = np.asarray(op.msg_bytes, dtype=float)
    coll = hw.efficiency.collective
    bw = collective_bandwidth(hw, op.group_size, scale_out=op.scale_out)
    eff = coll.busbw_fraction * coll.size_curve(np.maximum(msg, 1.0))
    network = wire_bytes(op) / (bw * eff)
    if op.collective == "send_recv":
        fixed = hw.interconnect.scale_out_latency_s if op.scale_out else hw.interconnect.latency_s
    else:
        fixed = coll.latency_s
    latency = np.where(msg > 0, fixed, 0.0)
    return np.where(msg > 0, network, 0.0), latency


def evaluate(ops: list[Op], hw: HardwareSpec, *, attention_factor: float = 1.0) -> list[OpCost]:
    """Time every op on `hw`; `attention_factor` (the engine's) scales attention efficiency."""
    costs = []
    for op in ops:
        zero = np.zeros(1)
        if op.kind == "collective":
            network, latency = _collective_cost(hw, op)
            compute = memory = zero
            time = network + latency
        else:
            compute, memory, latency = _kernel_cost(hw, op, attention_factor)
            network = zero
            time = np.maximum(compute, memory) + latency
        costs.append(OpCost(op, time, compute, memory, network, latency))
    return costs


def total_time(costs: list[OpCost]) -> np.ndarray:
    """Sum of count x time over all ops."""
    return sum((c.total_s for c in costs), start=np.zeros(1))
