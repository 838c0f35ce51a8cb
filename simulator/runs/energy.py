"""Energy, power and cost of a serving run, from its engine steps.

Power of one GPU during a step (POLCA and Splitwise characterise the two phases: prefill is
compute-bound and draws near TDP, decode is memory-bound and draws less):

    P = idle + (tdp - idle) x (active + compute x u_compute x clock^3 + memory x u_memory)

clamped to [parked, ceiling] (`PowerSpec` in `simulator/specs/hardware.py` holds the fractions and
the ceiling: TDP, a boost limit, or an operator cap). u_compute is the step's FLOPs at the dense
peak of their dtype over the step's time, u_memory its DRAM bytes at the datasheet bandwidth
over the step's time; both come from the cost model's own operator list (`step_ops`), so
attention FLOPs, KV reads, MoE experts hit and quantised weights count as the step costs them,
and the bytes of the engine's sampler passes over the logits when the requests sample at a
temperature, filter, penalise or ask for logprobs (`serving.steptime.sampler_passes`).
Steps include the engine's CPU time, during which the GPU sits clocked up (the `active` term).
Between steps a GPU draws its parked power (`PowerSpec.between_steps_w`): a serving engine
keeps a CUDA context open, which holds the clocks up, so a GPU waiting for work draws more
than a bare board's idle (an H100 here: 123-133 W against 70; +26-50 W on H100 and A100 and
+66 W on L40S in 18 days of production telemetry and controlled runs, arXiv:2605.23918), and
no step draws less. A pipeline stage is busy 1/pp of its replica's step (it runs its share of
the layers at the step's utilisation) and waits, parked, the rest.

A power cap (`with_power_cap`) lowers the clock so that full-load draw fits under it and scales
every dtype's dense peak by the same factor; bandwidth is unchanged, so compute-bound prefill
steps stretch and memory-bound decode steps barely move.

Not modelled: NVLink/network power (collectives draw only the active term), host CPU, DRAM
refresh and cooling (board power only), temperature, per-kernel power transients within a step,
clock boosting above the spec's peaks, the minimum power limit a board accepts. The recorded
steps lack each chunk's offset and each sequence's context, so a step's prefill chunks are
costed as fresh prompts of equal length and its decodes read the KV the replica holds after the
step less the chunks' own tokens.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from simulator.costmodel.batch import BatchShape, attended_pairs
from simulator.costmodel.ops import step_ops
from simulator.serving.steptime import sampler_passes
from simulator.specs.deployment import Parallelism, Precision
from simulator.specs.hardware import HardwareSpec
from simulator.specs.model import ModelSpec
from simulator.specs.workload import SamplingSpec

if TYPE_CHECKING:
    from simulator.costmodel.deployment import Deployment

ENERGY_KEYS = (
    "num_gpus",
    "energy_j",
    "parked_energy_j",
    "avg_power_w_per_gpu",
    "energy_per_output_token_j",
    "energy_per_request_j",
    "gpu_hours",
    "cost_usd",
    "usd_per_million_output_tokens",
    "usd_per_million_tokens",
)


# -- the power of one GPU -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PowerModel:
    """Draw of one GPU in watts as a function of its compute and memory utilisation."""

    idle_w: float
    parked_w: float
    tdp_w: float
    ceiling_w: float
    active_fraction: float
    compute_fraction: float
    memory_fraction: float
    clock_factor: float

    @classmethod
    def from_hardware(cls, hw: HardwareSpec) -> PowerModel:
        p = hw.power
        return cls(
            idle_w=p.idle_w,
            parked_w=p.between_steps_w,
            tdp_w=p.tdp_w,
            ceiling_w=p.ceiling_w,
            active_fraction=p.active_fraction,
            compute_fraction=p.compute_fraction,
            memory_fraction=p.memory_fraction,
            clock_factor=p.clock_factor,
        )

    def power_w(self, *, u_compute: np.ndarray | float, u_memory: np.ndarray | float) -> np.ndarray:
        """Watts while running a step at these utilisations (each clipped to [0, 1]), never below
        the parked draw (a step runs with the clocks up). Dynamic compute power at a lowered
        clock f falls as f^3 (see `PowerSpec.clock_factor`); the utilisation is against the peak
        at that clock."""
        uc = np.clip(np.asarray(u_compute, dtype=float), 0.0, 1.0)
        um = np.clip(np.asarray(u_memory, dtype=float), 0.0, 1.0)
        load = (
            self.active_fraction
            + self.compute_fraction * self.clock_factor**3 * uc
            + self.memory_fraction * um
        )
        watts = self.idle_w + (self.tdp_w - self.idle_w) * load
        return np.clip(watts, self.parked_w, self.ceiling_w)


# -- utilisation of steps -------------------------------------------------------------------------
def step_work_s(
    model: ModelSpec, hw: HardwareSpec, layout: Parallelism, prec: Precision, batch: BatchShape
) -> tuple[np.ndarray, np.ndarray]:
    """(compute_s, memory_s) of a step on one device of each stage, summed over the stages:
    its FLOPs at the dense peak of each op's dtype and its DRAM bytes (weights, activations, KV
    cache) at the datasheet bandwidth. Divided by the step's time they are the utilisations.
    Collectives are left out (link traffic, not DRAM)."""
    ops = step_ops(model, layout, prec, batch, gpus_per_node=hw.interconnect.gpus_per_node)
    sixteen = max(hw.peak_flops("bf16"), hw.peak_flops("fp16"))
    compute = np.zeros(1)
    memory = np.zeros(1)
    for op in ops:
        if op.kind == "collective":
            continue
        peak = hw.peak_flops(op.dtype) or sixteen
        compute = compute + op.count * np.asarray(op.flops, dtype=float) / peak
        traffic = np.asarray(op.bytes, dtype=float) + np.asarray(op.pre_bytes, dtype=float)
        memory = memory + op.count * traffic
    return compute, memory / hw.memory.bandwidth_bytes_per_s


def steps_batch(steps: pd.DataFrame, *, block_size: int, window: int | None) -> BatchShape:
    """The batch aggregates of recorded steps (columns num_seqs, prefill_tokens,
    decode_tokens, kv_used_blocks). The record has no chunk offsets or per-sequence contexts:
    chunks are taken as fresh prompts of equal length, and decodes as reading the KV the
    replica holds in the step less the chunks' tokens (at least one token each)."""
    prefill = steps["prefill_tokens"].to_numpy(dtype=float)
    decodes = steps["decode_tokens"].to_numpy(dtype=float)
    chunks = np.where(prefill > 0, np.maximum(steps["num_seqs"].to_numpy(float) - decodes, 1), 0)
    mean_chunk = np.divide(prefill, chunks, out=np.zeros_like(prefill), where=chunks > 0)
    kv_tokens = steps["kv_used_blocks"].to_numpy(dtype=float) * block_size
    decode_kv = np.where(decodes > 0, np.maximum(kv_tokens - prefill, decodes), 0.0)
    if window is not None:
        decode_kv = np.minimum(decode_kv, decodes * window)
    return BatchShape(
        prefill_tokens=prefill,
        prefill_seqs=chunks,
        prefill_pairs=chunks * attended_pairs(mean_chunk, 0.0, window),
        prefill_kv_tokens=np.minimum(mean_chunk, window or np.inf) * chunks,
        decode_seqs=decodes,
        decode_kv_tokens=decode_kv,
        sampled=decodes + chunks,
    )


# -- a fleet's energy and cost --------------------------------------------------------------------
@dataclass(frozen=True)
class GroupAccount:
    """One replica group as energy and cost see it: `count` replicas of `deployment`, KV
    blocks of `block_size` tokens, GPUs billed at `usd_per_gpu_hour`, serving requests that
    sample as `sampling`."""

    deployment: Deployment
    count: int
    block_size: int
    usd_per_gpu_hour: float
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    # replica-seconds its replicas were on (an autoscaled group, serving.fleet); None: all
    # `count` for the whole run
    on_s: float | None = None
    # under a fleet power budget (serving.power): the deployment its capped replicas ran on
    capped: Deployment | None = None
    # each replica runs two streams of steps at once on shares of its GPU (intra-GPU
    # prefill/decode partitioning, serving.pd_partition): its step rows overlap in time
    streams_overlap: bool = False

    @property
    def gpus_per_replica(self) -> int:
        return self.deployment.layout.devices_per_replica


def sampler_memory_s(
    dep: Deployment, sampling: SamplingSpec, sampled: np.ndarray | float
) -> np.ndarray:
    """Seconds at the datasheet bandwidth of the DRAM bytes the engine's sampler passes
    (`sampler_passes`) move for `sampled` sequences, beyond the greedy pick `step_ops` has."""
    per_logit = sum(w.bytes_per_logit for w in sampler_passes(dep.engine, sampling).values())
    logits = np.asarray(sampled, dtype=float) * dep.model.vocab_size
    return per_logit * logits / dep.hardware.memory.bandwidth_bytes_per_s


def step_utilisation(
    steps: pd.DataFrame, dep: Deployment, *, block_size: int, sampling: SamplingSpec | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(compute, memory) utilisation of one busy GPU of `dep` during each of `steps`: the
    step's work at peak (`step_work_s`, and the sampler passes of requests sampling as
    `sampling`, greedy if None: `sampler_memory_s`) over its duration (0 for a step of no
    duration)."""
    duration = (steps["end_s"] - steps["start_s"]).to_numpy(dtype=float)
    if not len(steps):
        return np.zeros(0), np.zeros(0)
    batch = steps_batch(steps, block_size=block_size, window=dep.model.attention.batch_window)
    compute_s, memory_s = step_work_s(dep.model, dep.hardware, dep.layout, dep.precision, batch)
    memory_s = memory_s + sampler_memory_s(dep, sampling or SamplingSpec(), batch.sampled)
    safe = np.where(duration > 0, duration, np.inf)
    shape = duration.shape
    return np.broadcast_to(compute_s / safe, shape), np.broadcast_to(memory_s / safe, shape)


def step_power_w(steps: pd.DataFrame, group: GroupAccount) -> np.ndarray:
    """Watts of one busy GPU (one device of a busy stage) during each of `steps`, all of
    which ran on replicas of `group`."""
    dep = group.deployment
    u_compute, u_memory = step_utilisation(
        steps, dep, block_size=group.block_size, sampling=group.sampling
    )
    watts = PowerModel.from_hardware(dep.hardware).power_w(u_compute=u_compute, u_memory=u_memory)
    return np.broadcast_to(watts, u_compute.shape)


def stream_overlap(
    steps: pd.DataFrame, watts: np.ndarray, power: PowerModel
) -> tuple[float, float]:
    """(seconds, joules) by which summing `steps` one by one over-counts a replica that runs
    two streams at once (`serving.pd_partition`: each stream's steps follow one another, the
    two streams' overlap). While two steps run, the GPU is busy once and draws its idle and
    `active` terms once, plus both steps' compute and memory terms (each step's utilisation
    is already a share of the whole GPU's peaks), clamped to [parked, ceiling]:

        P = clip(P_a + P_b - (idle + (tdp - idle) x active), parked, ceiling)

    The seconds are the overlaps (the replica's busy time is the union of its steps), the
    joules P_a + P_b - P over them. `watts[i]` is the draw of `steps.iloc[i]` alone. Each
    overlapping pair is found once: sorted by start, a step's partner is the earlier step
    with the latest end (the other stream's running step; a stream's own steps never
    overlap). Pairs split across two chunks of an accumulated run are not seen."""
    if len(steps) < 2:
        return 0.0, 0.0
    replica = steps["replica"].to_numpy()
    start = steps["start_s"].to_numpy(dtype=float)
    end = steps["end_s"].to_numpy(dtype=float)
    order = np.lexsort((start, replica))
    replica, start, end, watts = replica[order], start[order], end[order], watts[order]
    shared = power.idle_w + (power.tdp_w - power.idle_w) * power.active_fraction
    cuts = np.flatnonzero(np.diff(replica)) + 1
    overlap_s = excess_j = 0.0
    for lo, hi in zip([0, *cuts], [*cuts, len(start)], strict=True):
        s, e, w = start[lo:hi], end[lo:hi], watts[lo:hi]
        latest = np.maximum.accumulate(e)
        holder = np.maximum.accumulate(np.where(e >= latest, np.arange(len(e)), 0))
        overlap = np.minimum(e[1:], latest[:-1]) - s[1:]
        hit = np.flatnonzero(overlap > 0)
        if not len(hit):
            continue
        both = w[1:][hit] + w[holder[:-1][hit]]
        together = np.clip(both - shared, power.parked_w, power.ceiling_w)
        overlap_s += float(overlap[hit].sum())
        excess_j += float(np.sum(overlap[hit] * (both - together)))
    return overlap_s, excess_j


CHUNK_STEPS = 100_000  # steps costed at once: the cost model's arrays stay small


def fleet_energy(
    *,
    steps: pd.DataFrame,
    requests: pd.DataFrame,
    groups: Sequence[GroupAccount],
    capped: np.ndarray | None = None,
) -> dict[str, float]:
    """Energy and cost of every GPU of `groups` (replicas numbered in group order, as
    `serving.cluster.serve` numbers them) from the run's start (t = 0, the benchmark's start,
    as the summary's duration) to the last finish: steps at their modelled power, the rest at
    parked power (`PowerSpec.between_steps_w`); `parked_energy_j` is that part (a pipeline
    stage waiting for the others included). Keys: ENERGY_KEYS. Per-token and per-request
    figures are 0 when nothing completed (as the summary's rates are). `capped`: which steps
    ran capped (a fleet power budget, `serving.power.capped_steps`): costed on their group's
    `capped` deployment."""
    if capped is not None and capped.any():
        steps = steps.assign(_capped=capped)
    account = EnergyAccumulator(groups)
    replica = steps["replica"].to_numpy()
    first = 0
    for g, group in enumerate(account.groups):  # group by group, as the sums always were
        mine = np.flatnonzero((replica >= first) & (replica < first + group.count))
        first += group.count
        for lo in range(0, len(mine), CHUNK_STEPS):  # bounded memory on long runs
            account.add_group(g, steps.iloc[mine[lo : lo + CHUNK_STEPS]])
    if len(steps):
        account.last_end = float(steps["end_s"].max())
    done = requests[requests["finish_s"].notna()]
    return account.figures(
        last_finish=float(requests["finish_s"].max()) if len(requests) else math.nan,
        completed=len(done),
        output_tokens=float(done["output_tokens"].sum()),
        prompt_tokens=float(done["prompt_tokens"].sum()),
    )


class EnergyAccumulator:
    """`fleet_energy` fed its steps a chunk at a time (a streaming run's recorder hands them
    over as they fill, `metrics.stream.StreamRecorder`): each group's step energy and busy
    seconds, and the last step's end, summed as the chunks come."""

    def __init__(self, groups: Sequence[GroupAccount]) -> None:
        self.groups = list(groups)
        self.step_j = [0.0] * len(self.groups)
        self.busy_s = [0.0] * len(self.groups)
        self.last_end = math.nan

    def add(self, steps: pd.DataFrame) -> None:
        """A chunk of step rows (any replicas, any order)."""
        if not len(steps):
            return
        end = float(steps["end_s"].max())
        self.last_end = end if math.isnan(self.last_end) else max(self.last_end, end)
        replica = steps["replica"].to_numpy()
        first = 0
        for g, group in enumerate(self.groups):
            mine = np.flatnonzero((replica >= first) & (replica < first + group.count))
            first += group.count
            if len(mine):
                self.add_group(g, steps.iloc[mine])

    def add_group(self, g: int, part: pd.DataFrame) -> None:
        """Steps of group `g`'s replicas only."""
        duration = (part["end_s"] - part["start_s"]).to_numpy(dtype=float)
        group = self.groups[g]
        if "_capped" in part.columns and group.capped is not None:
            capped = part["_capped"].to_numpy(dtype=bool)
            busy_w = np.empty(len(part))
            busy_w[~capped] = step_power_w(part[~capped], group)
            under = dataclasses.replace(group, deployment=group.capped, capped=None)
            busy_w[capped] = step_power_w(part[capped], under)
        else:
            busy_w = step_power_w(part, group)
        overlap_s = excess_j = 0.0  # two streams at once: the GPU counted once
        if group.streams_overlap:
            power = PowerModel.from_hardware(group.deployment.hardware)
            overlap_s, excess_j = stream_overlap(part, busy_w, power)
        # a busy stage runs 1/pp of the step
        pp = group.deployment.layout.pp
        self.step_j[g] += (float(np.sum(duration * busy_w)) - excess_j) / pp
        self.busy_s[g] += float(duration.sum()) - overlap_s

    def figures(
        self, *, last_finish: float, completed: int, output_tokens: float, prompt_tokens: float
    ) -> dict[str, float]:
        """ENERGY_KEYS from t = 0 to the later of `last_finish` and the last step's end."""
        ends = [last_finish, self.last_end]
        start = 0.0
        stop = max((float(t) for t in ends if np.isfinite(t)), default=start)
        span = max(stop - start, 0.0)
        energy = parked = cost = gpu_s = 0.0
        gpus = 0
        scaled = False  # a group's replicas on for less than the run (autoscaled)
        for g, group in enumerate(self.groups):
            pp = group.deployment.layout.pp
            parked_w = group.deployment.hardware.power.between_steps_w
            # each GPU runs its stage of every batch (1/pp of the step) and waits parked the
            # rest of the span: with micro-batching, steps overlap and their durations outrun
            # the span
            on_s = group.count * span if group.on_s is None else group.on_s
            waiting_j = parked_w * max(on_s - self.busy_s[g] / pp, 0.0)
            energy += group.gpus_per_replica * (self.step_j[g] + waiting_j)
            parked += group.gpus_per_replica * waiting_j
            n = group.gpus_per_replica * group.count
            gpus += n
            if group.on_s is None:
                cost += n * span / 3600.0 * group.usd_per_gpu_hour
            else:
                scaled = True
                cost += group.gpus_per_replica * on_s / 3600.0 * group.usd_per_gpu_hour
            gpu_s += group.gpus_per_replica * on_s
        return _energy_figures(
            energy=energy,
            parked=parked,
            cost=cost,
            gpus=gpus,
            span=span,
            gpu_s=gpu_s if scaled else gpus * span,
            completed=completed,
            output_tokens=output_tokens,
            prompt_tokens=prompt_tokens,
        )


def _energy_figures(
    *,
    energy: float,
    parked: float,
    cost: float,
    gpus: int,
    span: float,
    gpu_s: float,
    completed: int,
    output_tokens: float,
    prompt_tokens: float,
) -> dict[str, float]:
    """The figures of `energy` over `gpu_s` GPU-seconds (`gpus` x `span` unless a group was
    autoscaled)."""
    output = output_tokens
    tokens = output + prompt_tokens

    def per(total: float, count: float, scale: float = 1.0) -> float:
        return total / count * scale if count > 0 else 0.0

    return {
        "num_gpus": gpus,
        "energy_j": energy,
        "parked_energy_j": parked,
        "avg_power_w_per_gpu": per(energy, gpu_s),
        "energy_per_output_token_j": per(energy, output),
        "energy_per_request_j": per(energy, float(completed)),
        "gpu_hours": gpu_s / 3600.0,
        "cost_usd": cost,
        "usd_per_million_output_tokens": per(cost, output, 1e6),
        "usd_per_million_tokens": per(cost, tokens, 1e6),
    }
