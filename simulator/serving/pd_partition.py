"""Intra-GPU prefill/decode disaggregation (Nexus, arXiv 2507.06608): `with_pd_partition`.

One replica runs two engine loops at once on the same GPUs, each in its own partition of the
SMs (green contexts or MPS in the paper): a prefill stream and a decode stream. They share one
KV cache, so a prompt's KV never moves:

1. the router sends a request to the replica's prefill stream, which schedules and prices its
   prompt chunks as the plain loop does (`serving.replica.Replica`) and samples the first
   token (TTFT ends here);
2. the request then joins the decode stream at its next step boundary (with a seat free,
   max_num_seqs), its blocks still held in the shared cache; the decode stream decodes it to
   the end. A request the decode stream preempts recomputes there.

Each stream's step is priced by the replica's cost model on a partitioned device
(`partition_hardware`): a stream with a fraction s of the SMs has s of every compute peak and
of the SMs, and the DRAM bandwidth it can pull (`bandwidth_shares`): min(1, s / saturation)
of the datasheet's alone (the diminishing return of SMs on bandwidth,
serving/pd_partition.yaml), and, when both streams are busy, shares in proportion to those
demands, scaled down together where they exceed the whole. A step is priced when it starts
with the other stream's state then (busy: it has requests); a change of that state during the
step does not reprice it.

The split (`PdPartition`): `static` keeps the prefill stream on its share and the decode stream
on the rest whatever runs. `dynamic` decides it before each step, as Nexus does: the decode
stream gets the smallest share on a grid of tenths whose decode step (its running batch,
priced under contention) meets the TBT target, at most 0.9; the prefill stream gets the rest.
A stream alone on the replica has the whole GPU, priced exactly as today's replica.

The paper names hysteresis and phase-specific schedulers without their details being
available here; llmsim offers its own reading of each (`PdPartition`): `hysteresis` h keeps a
dynamic decode share that still meets the target unless a smaller one meets (1 - h) x the
target (it rises at once, falls only with margin), and `prefill_order: spf` puts the prefill
stream's queue in shortest-prompt-first order before each of its steps (the decode stream keeps
the engine's order). Not modelled: kernel-level interference beyond the bandwidth shares, the
SM split's switching cost (the run counts the switches, `split_summary`).

Both streams' steps are recorded under the replica's index, so they overlap in time in the
step rows; the energy account counts the GPU once while both run
(`runs.energy.stream_overlap`)."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

import simpy

from simulator.costmodel.deployment import Deployment
from simulator.costmodel.offload import OffloadPlan
from simulator.errors import SpecError
from simulator.metrics.recorder import Recorder
from simulator.serving.kv_cache import BlockManager
from simulator.serving.replica import Replica
from simulator.serving.request import Request
from simulator.serving.steptime import StepTimer, Timer
from simulator.specs.hardware import HardwareSpec
from simulator.specs.serving import PdPartition, SchedulerSpec
from simulator.specs.workload import SamplingSpec

if TYPE_CHECKING:
    from simulator.serving.group import ReplicaGroup

Stream = Literal["prefill", "decode"]
# The decode stream's candidate shares under the dynamic split (tenths; each stream keeps some)
DECODE_SHARES = tuple(round(0.1 * i, 1) for i in range(1, 10))


@cache
def saturation() -> float:
    """The fraction of the SMs that pulls the whole DRAM bandwidth (pd_partition.yaml)."""
    import yaml

    # (the package's resources, not `__file__`: a compiled module's is not its own path)
    text = resources.files("simulator.serving").joinpath("pd_partition.yaml").read_text()
    return float(yaml.safe_load(text)["bandwidth_saturation_sm_fraction"])


def bandwidth_shares(
    prefill_sm: float, decode_sm: float, *, both_busy: bool, sat: float | None = None
) -> tuple[float, float]:
    """The fractions of DRAM bandwidth the prefill and decode streams get with these SM shares:
    each alone pulls min(1, share / saturation); both busy share in proportion to those
    demands, scaled down together where they sum above 1. Never above 1 for either."""
    sat = saturation() if sat is None else sat
    fp, fd = min(1.0, prefill_sm / sat), min(1.0, decode_sm / sat)
    if both_busy and fp + fd > 1.0:
        total = fp + fd
        return fp / total, fd / total
    return fp, fd


def partition_hardware(
    hw: HardwareSpec, *, sm_share: float, bandwidth_share: float
) -> HardwareSpec:
    """`hw` as a stream with `sm_share` of its SMs and `bandwidth_share` of its DRAM bandwidth
    sees it: the SMs and every compute peak scaled by the share, the bandwidth by its own.
    Shares above 1 are refused (a partition never gives a stream more than the GPU); (1, 1) is
    `hw` itself."""
    if not (0.0 < sm_share <= 1.0 and 0.0 < bandwidth_share <= 1.0):
        raise ValueError(f"shares must be in (0, 1], got {sm_share}, {bandwidth_share}")
    if sm_share == 1.0 and bandwidth_share == 1.0:
        return hw
    compute = hw.compute.model_copy(
        update={
            "units": max(1, round(hw.compute.units * sm_share)),
            "peak_flops_per_s": {k: v * sm_share for k, v in hw.compute.peak_flops_per_s.items()},
        }
    )
    memory = hw.memory.model_copy(
        update={"bandwidth_bytes_per_s": hw.memory.bandwidth_bytes_per_s * bandwidth_share}
    )
    return hw.model_copy(update={"compute": compute, "memory": memory})


@dataclass
class PartitionTimers:
    """Step timers of one deployment on partitions of its GPUs, built when first asked for
    and kept (`full` is the replica's own timer: the whole GPU)."""

    dep: Deployment
    full: StepTimer
    max_num_seqs: int
    max_num_batched_tokens: int
    max_context: int
    enforce_eager: bool
    sampling: SamplingSpec | None
    offload: OffloadPlan | None
    _built: dict[tuple[float, float], StepTimer] = field(default_factory=dict)

    def timer(self, sm_share: float, bandwidth_share: float) -> StepTimer:
        key = (round(sm_share, 6), round(bandwidth_share, 6))
        if key == (1.0, 1.0):
            return self.full
        if key not in self._built:
            hw = partition_hardware(self.dep.hardware, sm_share=key[0], bandwidth_share=key[1])
            self._built[key] = StepTimer(
                dataclasses.replace(self.dep, hardware=hw),
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                max_context=self.max_context,
                enforce_eager=self.enforce_eager,
                sampling=self.sampling,
                offload=self.offload,
            )
        return self._built[key]

    def stream_timer(self, stream: Stream, decode_sm: float, *, both_busy: bool) -> StepTimer:
        """The timer of `stream` when the decode stream has `decode_sm` of the SMs and the
        prefill stream the rest."""
        prefill_sm = 1.0 - decode_sm
        bp, bd = bandwidth_shares(prefill_sm, decode_sm, both_busy=both_busy)
        if stream == "prefill":
            return self.timer(prefill_sm, bp)
        return self.timer(decode_sm, bd)


class _Split:
    """One replica's two streams and how the SMs are split between them (module doc)."""

    def __init__(self, partition: PdPartition, timers: PartitionTimers) -> None:
        self.partition = partition
        self.timers = timers
        self.prefill: StreamReplica | None = None
        self.decode: StreamReplica | None = None
        self.ready: deque[Request] = deque()  # prefilled, waiting for a decode seat
        self.last_decode_share = 0.0  # the decode stream's SM share at its last step
        # the last dynamic choice: (time, decode sequences, their context) and its share
        self._chosen: tuple[tuple[float, int, float], float] = ((-1.0, 0, 0.0), 0.0)
        # the dynamic split's choices with both streams busy: how many, how many changed the
        # decode share from the one before, and the shares' sum (`split_summary`)
        self.decisions = 0
        self.changes = 0
        self.share_sum = 0.0

    def timer(self, stream: Stream) -> StepTimer:
        assert self.prefill is not None and self.decode is not None
        other = self.decode if stream == "prefill" else self.prefill
        busy = bool(other.running or other.waiting) or (stream == "decode" and bool(self.ready))
        part = self.partition
        if part.mode == "static":
            decode_sm = 1.0 - (part.prefill_share or 0.5)
            return self.timers.stream_timer(stream, decode_sm, both_busy=busy)
        if not busy:  # alone on the replica: the whole GPU
            if stream == "decode":
                self.last_decode_share = 1.0
            return self.timers.full
        decode_sm = self.decode_share()
        self.last_decode_share = decode_sm
        return self.timers.stream_timer(stream, decode_sm, both_busy=True)

    def decode_share(self) -> float:
        """Dynamic split: `share_for` the decode stream's running batch, now."""
        assert self.decode is not None
        return self.share_for(self.decode.running, self.decode.env.now)

    def share_for(self, reqs: list[Request], now: float) -> float:
        """The smallest decode share whose step of the decode batch `reqs`, with the prefill
        stream busy, meets the TBT target (the largest if none does). With hysteresis h, a
        share that still meets the target is kept unless a smaller one meets (1 - h) x the
        target: the split falls only with margin, and rises at once. `now`: the time of the
        step asking (a step reads its timer more than once; one choice per step counts)."""
        if not reqs:  # preempted requests recomputing, or none yet: an even split
            return 0.5
        target = self.partition.tbt_target_s or 0.0
        total = float(sum([r.num_computed for r in reqs]) + len(reqs))
        key = (now, len(reqs), total)
        if key == self._chosen[0]:
            return self._chosen[1]

        def meets(share: float, limit: float) -> bool:
            timer = self.timers.stream_timer("decode", share, both_busy=True)
            step = timer.decode_run(num_seqs=len(reqs), total_context=total, steps=1)
            return float(step[0]) <= limit

        before = self._chosen[1] if self.decisions else None
        band = self.partition.hysteresis
        if band and before is not None and meets(before, target):
            lower = [share for share in DECODE_SHARES if share < before]
            chosen = next((s for s in lower if meets(s, target * (1.0 - band))), before)
        else:
            chosen = next((s for s in DECODE_SHARES if meets(s, target)), DECODE_SHARES[-1])
        self.decisions += 1
        self.changes += before is not None and chosen != before
        self.share_sum += chosen
        self._chosen = (key, chosen)
        return chosen

    def prefilled(self, req: Request) -> None:
        """The prefill stream sampled `req`'s first token: to the decode stream, KV in place."""
        assert self.decode is not None
        self.ready.append(req)
        self.decode.wake()

    def admit(self, decode: Replica) -> None:
        """At a decode step boundary: prefilled requests join its batch while seats are free."""
        seats = decode.spec.max_num_seqs
        while self.ready and len(decode.running) < seats:
            decode.running.append(self.ready.popleft())

    def prefill_step(self, prefill: Replica) -> None:
        """At a prefill step boundary: a decode stream with only preempted requests waiting
        may find the blocks the prefill stream freed. With `spf` the prefill stream's queue
        is put in shortest-prompt-first order (priority first, then the fewest prompt tokens
        left, then arrival) before it schedules; prompts already started are not cut."""
        assert self.decode is not None
        if self.decode.waiting and not self.decode.running:
            self.decode.wake()
        waiting = prefill.waiting
        if self.partition.prefill_order == "spf" and len(waiting) > 1:
            ordered = sorted(waiting, key=_shortest_prompt_first)
            waiting.clear()
            waiting.extend(ordered)


def _shortest_prompt_first(req: Request) -> tuple[int, int, float, int]:
    return (req.priority, req.remaining, req.arrival_s, req.id)


def split_summary(replicas: Sequence[Replica]) -> dict[str, float] | None:
    """The dynamic splits' choices while both streams were busy, over the partitioned
    replicas among `replicas`: how many, how many changed the decode share from the one
    before, and the mean decode share chosen (None when none is partitioned dynamically)."""
    splits = [
        r._split
        for r in replicas
        if isinstance(r, StreamReplica)
        and r.stream == "prefill"
        and r._split.partition.mode == "dynamic"
    ]
    if not splits:
        return None
    decisions = sum(s.decisions for s in splits)
    return {
        "split_decisions": float(decisions),
        "split_changes": float(sum(s.changes for s in splits)),
        "mean_decode_share": sum(s.share_sum for s in splits) / decisions if decisions else 0.0,
    }


class StreamReplica(Replica):
    """One stream of a partitioned replica: a Replica whose step timer is its share of the
    GPU at the moment it asks (`_Split.timer`). The prefill stream is the router's target and
    counts the decode stream's requests as outstanding."""

    def __init__(
        self,
        env: simpy.Environment,
        *,
        split: _Split,
        stream: Stream,
        index: int,
        scheduler: SchedulerSpec,
        kv: BlockManager,
        timer: Timer,
        recorder: Recorder,
        on_finish: Callable[[Request], None],
        swap_s_per_block: float,
        on_prefilled: Callable[[Request], None] | None = None,
        between_steps: Callable[[Replica], None] | None = None,
    ) -> None:
        self._split = split
        self.stream: Stream = stream
        super().__init__(
            env,
            index=index,
            scheduler=scheduler,
            kv=kv,
            timer=timer,
            recorder=recorder,
            on_finish=on_finish,
            swap_s_per_block=swap_s_per_block,
            on_prefilled=on_prefilled,
            between_steps=between_steps,
        )

    @property
    def timer(self) -> Timer:
        return self._split.timer(self.stream)

    @timer.setter
    def timer(self, value: Timer) -> None:  # the split decides; the given one is `full`
        del value

    def _decode_segment(self, reqs: list[Request], steps: int) -> Generator[simpy.Event, Any, None]:
        # The other stream takes blocks while this run of decode steps is in flight: its
        # blocks are taken when it starts (the fit was just checked), not when it ends.
        if steps > 1:
            self.kv.extend(reqs, steps)
        return super()._decode_segment(reqs, steps)

    @property
    def outstanding(self) -> int:
        own = len(self.running) + len(self.waiting) + self.incoming + self._loading
        decode = self._split.decode
        if self.stream == "prefill" and decode is not None:
            own += len(decode.running) + len(decode.waiting) + len(self._split.ready)
        return own


@dataclass(frozen=True)
class PdPartitioned:
    """How `serving.cluster.serve` builds each replica of a group with intra-GPU P/D
    partitioning: a prefill and a decode stream sharing one KV cache (module doc)."""

    partition: PdPartition
    timers: PartitionTimers

    def build(
        self,
        env: simpy.Environment,
        *,
        group: ReplicaGroup,
        index: int,
        recorder: Recorder,
        on_finish: Callable[[Request], None],
    ) -> list[Replica]:
        split = _Split(self.partition, self.timers)
        kv = group.new_kv()

        def finished(req: Request) -> None:  # blocks were freed: both streams look again
            on_finish(req)
            for stream in (split.prefill, split.decode):
                if stream is not None:
                    stream.wake()

        def stream(
            name: Stream,
            between_steps: Callable[[Replica], None],
            on_prefilled: Callable[[Request], None] | None = None,
        ) -> StreamReplica:
            return StreamReplica(
                env,
                split=split,
                stream=name,
                index=index,
                scheduler=group.scheduler,
                kv=kv,
                timer=group.timer,
                recorder=recorder,
                on_finish=finished,
                swap_s_per_block=group.swap_s_per_block,
                on_prefilled=on_prefilled,
                between_steps=between_steps,
            )

        split.prefill = stream("prefill", split.prefill_step, on_prefilled=split.prefilled)
        split.decode = stream("decode", split.admit)
        return [split.prefill]


def with_pd_partition(
    group: ReplicaGroup,
    dep: Deployment,
    partition: PdPartition,
    *,
    max_context: int,
    enforce_eager: bool = False,
    sampling: SamplingSpec | None = None,
    offload: OffloadPlan | None = None,
) -> ReplicaGroup:
    """`group` (from `cluster.replica_group` for `dep`) with each replica split into a prefill
    and a decode stream on shares of its SMs (`partition`). Refuses what only the plain loop
    models alongside it: speculative decoding, multi-step or async scheduling, KV tiers,
    LoRA, the static scheduler and another engine loop."""
    what = "intra-GPU P/D partitioning"
    if group.loop is not None:
        raise SpecError(
            f"{what} with DP attention or pipeline micro-batching is not modelled",
            field="pd_partition",
        )
    for on, name in (
        (group.speculative is not None, "speculative decoding"),
        (group.scheduler.num_scheduler_steps > 1, "multi-step scheduling"),
        (group.kv_tiers is not None, "KV offload tiers"),
        (group.timer.async_scheduling, "async scheduling"),
        (group.lora is not None, "LoRA"),
        (group.scheduler.kind == "static", "the static scheduler"),
        (dep.engine.overlap.nano_batches > 1, "nano-batches"),
    ):
        if on:
            raise SpecError(f"{what} with {name} is not modelled", field="pd_partition")
    spec = group.scheduler
    timers = PartitionTimers(
        dep=dep,
        full=group.step_timer,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_context=max_context,
        enforce_eager=enforce_eager,
        sampling=sampling,
        offload=offload,
    )
    return dataclasses.replace(group, loop=PdPartitioned(partition=partition, timers=timers))
