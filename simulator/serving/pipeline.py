"""Pipeline parallelism with micro-batches in flight: one replica of pp stages.

vLLM V1 with `--pipeline-parallel-size pp` keeps up to pp batches in flight (its engine core's
batch queue): while one batch runs on stage 2, the next runs on stage 1. Here:

- while fewer than pp batches are in flight, the scheduler forms a batch from the requests
  not in flight (a request is in at most one in-flight batch: a decode needs the token its
  previous batch samples); `max_num_seqs` counts the requests in flight too, as vLLM's does.
  When pp batches are in flight or nothing else is runnable, the engine core waits for the
  oldest batch, and requests arriving meanwhile wait with it (vLLM V1's
  `step_with_batch_queue`);
- the batch's CPU work (the engine's per-step and per-sequence overhead, and any swap copies)
  runs on the engine core, one batch at a time, overlapping earlier batches' GPU work;
- the batch then passes the stages in order: stage s starts once the batch has arrived from
  stage s - 1 and stage s has finished the batch before it. After every stage but the last
  the activations travel to the next (the cost model's `pp_send_recv` ops: NVLink inside a
  node, the scale-out network between nodes), overlapping the sender's next batch;
- its tokens are sampled when the last stage finishes; its requests can be scheduled again.

Stage times (`StageClock`): the step's GPU time from the replica's StepTimer (every layer of
every stage plus the transfers, as `costmodel.ops.step_ops` sums them), less the transfers and
less the LM head, logits gather and sampler (`scales_with == "sampled"`), split evenly over the
stages (vLLM splits the layers evenly); the LM head and sampler are added to the last stage.

TTFT thus includes the whole pipeline's latency, and a request's inter-token gap is at least
one pass through it; throughput gains from pp batches in flight, and bubbles appear when fewer
are runnable. Without micro-batching (the default, `serving.replica.Replica`) a pp > 1 replica
runs one batch at a time through all stages.

Not modelled: vLLM scheduling a prompt's next chunk into the next micro-batch before the
previous chunk has left the pipeline (here each chunk takes its own pass), stages of unequal
layer counts or dense/MoE mix, the embedding on the first stage, the sender stalling until the
receiver is ready, decode segments (every batch is simulated), speculative decoding, static
batching, combining micro-batching with DP attention.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import simpy

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment
from simulator.costmodel.ops import stage_boundaries, step_ops
from simulator.costmodel.roofline import evaluate, total_time
from simulator.errors import SpecError
from simulator.metrics.recorder import Recorder
from simulator.serving.replica import Chunk, Replica
from simulator.serving.request import Request
from simulator.serving.scheduler import StepPlan, schedule
from simulator.serving.stepping import SteppedReplica, check_plain_steps
from simulator.serving.steptime import StepTimer
from simulator.specs.serving import SchedulerSpec

if TYPE_CHECKING:
    from simulator.serving.group import ReplicaGroup


@dataclass(frozen=True, slots=True)
class BatchTimes:
    """One batch's engine-core CPU seconds before stage 0, GPU seconds at each stage, and
    seconds of the transfer after each stage but the last."""

    cpu_s: float
    stage_s: tuple[float, ...]
    send_s: tuple[float, ...]


class Clock(Protocol):
    """What a PipelineReplica needs to time its batches."""

    stages: int

    def times(self, *, chunks: list[Chunk], decodes: list[int]) -> BatchTimes: ...


class StageClock:
    """Stage times of a pp-stage replica from its StepTimer (the module docstring's split)."""

    def __init__(
        self,
        dep: Deployment,
        *,
        timer: StepTimer,
        max_tokens: int,
        max_seqs: int,
    ) -> None:
        self.timer = timer
        self.stages = dep.layout.pp
        gpn = dep.hardware.interconnect.gpus_per_node
        self._crosses = stage_boundaries(dep.layout, gpus_per_node=gpn)
        tokens = BatchShape(prefill_tokens=np.arange(max_tokens + 1, dtype=float))
        sampled = BatchShape(sampled=np.arange(max_seqs + 1, dtype=float))
        sends = [
            op
            for op in step_ops(dep.model, dep.layout, dep.precision, tokens, gpus_per_node=gpn)
            if op.name.startswith("pp_send_recv")
        ]
        self._send = {  # one boundary's transfer, inside a node (False) or between nodes
            c.op.scale_out: np.broadcast_to(c.time_s, (max_tokens + 1,)).tolist()
            for c in evaluate(sends, dep.hardware, dep.engine)
        }
        tail_ops = [
            op
            for op in step_ops(dep.model, dep.layout, dep.precision, sampled, gpus_per_node=gpn)
            if op.scales_with == "sampled"
        ]
        tail = np.zeros(max_seqs + 1) + total_time(evaluate(tail_ops, dep.hardware, dep.engine))
        self._tail = tail.tolist()
        self._step_s, self._per_seq_s = dep.engine.overhead.step_s, dep.engine.overhead.per_seq_s

    def times(self, *, chunks: list[Chunk], decodes: list[int]) -> BatchTimes:
        tokens = sum(c[0] for c in chunks) + len(decodes)
        sampled = len(decodes) + sum(1 for c in chunks if c[2])
        whole = self.timer.kernel_s(chunks=chunks, decode_contexts=decodes)
        sends = tuple(self._send[crosses][tokens] for crosses in self._crosses)
        tail = self._tail[sampled]
        body = max(whole - sum(sends) - tail, 0.0) / self.stages
        stage = (body,) * (self.stages - 1) + (body + tail,)
        cpu = self._step_s + self._per_seq_s * (len(chunks) + len(decodes))
        return BatchTimes(cpu_s=cpu, stage_s=stage, send_s=sends)


@dataclass(slots=True)
class InFlight:
    """A batch in the pipeline: its plan, when its CPU work began, and when the last stage
    finished it (its tokens sampled)."""

    plan: StepPlan
    chunks: list[Chunk]
    decodes: list[int]
    start_s: float
    done_s: float


class PipelineReplica(SteppedReplica):
    """A replica of `group` with `clock.stages` stages, keeping up to that many batches in
    flight."""

    def __init__(
        self,
        env: simpy.Environment,
        *,
        clock: Clock,
        group: ReplicaGroup,
        index: int,
        recorder: Recorder,
        on_finish: Callable[[Request], None],
    ) -> None:
        super().__init__(env, group=group, index=index, recorder=recorder, on_finish=on_finish)
        self.clock = clock
        self.inflight: deque[InFlight] = deque()
        self._busy: set[Request] = set()  # requests in a batch in flight
        self._cpu_free = 0.0
        self._stage_free = [0.0] * clock.stages
        self._specs: dict[int, SchedulerSpec] = {}

    def run(self) -> Generator[simpy.Event, Any, None]:
        while True:
            if len(self.inflight) < self.clock.stages:
                plan = self._schedule()
                if plan.entries:
                    self._launch(plan)
                    continue
            if self.inflight:  # nothing more to run now: wait for the oldest batch
                head = self.inflight.popleft()
                yield self.env.timeout(max(head.done_s - self.env.now, 0.0))
                self._land(head)
                continue
            if self.running or self.waiting:
                stuck = self.waiting[0] if self.waiting else self.running[0]
                raise RuntimeError(f"replica {self.index}: nothing schedulable ({stuck})")
            self._wakeup = self.env.event()
            yield self._wakeup

    def _schedule(self) -> StepPlan:
        """The scheduler's plan over the requests not in flight, with room for max_num_seqs
        less those in flight; `running` keeps its order, admissions at the end."""
        room = self.spec.max_num_seqs - len(self._busy)
        if room <= 0:
            return StepPlan()
        if room not in self._specs:
            self._specs[room] = self.spec.model_copy(update={"max_num_seqs": room})
        busy = self._busy
        ready = [r for r in self.running if r not in busy]
        before = set(ready)
        plan = schedule(self._specs[room], running=ready, waiting=self.waiting, kv=self.kv)
        kept = set(ready)
        self.running = [r for r in self.running if r in busy or r in kept]
        self.running += [r for r in ready if r not in before]
        return plan

    def _launch(self, plan: StepPlan) -> None:
        """Time the batch through the engine core and the stages (FIFO at each)."""
        chunks, decodes = self.batch_of(plan)
        times = self.clock.times(chunks=chunks, decodes=decodes)
        swaps = (plan.swapped_out + plan.swapped_in) * self.swap_s_per_block
        start = max(self.env.now, self._cpu_free)
        self._cpu_free = ready = start + times.cpu_s + swaps
        for s, stage_s in enumerate(times.stage_s):
            begin = max(ready, self._stage_free[s])  # arrived, and the stage is free
            self._stage_free[s] = begin + stage_s
            ready = begin + stage_s + (times.send_s[s] if s < len(times.send_s) else 0.0)
        self.inflight.append(InFlight(plan, chunks, decodes, start, self._stage_free[-1]))
        self._busy.update(req for req, _ in plan.entries)

    def _land(self, batch: InFlight) -> None:
        self._busy.difference_update(req for req, _ in batch.plan.entries)
        self.apply(
            batch.plan,
            chunks=batch.chunks,
            decodes=batch.decodes,
            start=batch.start_s,
            end=batch.done_s,
        )


@dataclass(frozen=True)
class MicroBatching:
    """How `serving.cluster.serve` builds each replica of a group with pipeline
    micro-batching: one PipelineReplica timed by `clock`."""

    clock: Clock

    def build(
        self,
        env: simpy.Environment,
        *,
        group: ReplicaGroup,
        index: int,
        recorder: Recorder,
        on_finish: Callable[[Request], None],
    ) -> list[Replica]:
        replica = PipelineReplica(
            env,
            clock=self.clock,
            group=group,
            index=index,
            recorder=recorder,
            on_finish=on_finish,
        )
        return [replica]


def with_micro_batching(group: ReplicaGroup, dep: Deployment) -> ReplicaGroup:
    """`group` (built by `cluster.replica_group` for `layout`) with pp micro-batches in
    flight per replica. Needs pp > 1 and a continuous or prefill-first scheduler."""
    if dep.layout.pp < 2:
        raise SpecError(
            "pipeline micro-batching needs pipeline_parallel_size > 1",
            field="pipeline_micro_batching",
        )
    check_plain_steps(group, what="pipeline micro-batching")
    spec = group.scheduler
    if spec.kind == "static":
        raise SpecError(
            "pipeline micro-batching needs the continuous or prefill_first scheduler",
            field="pipeline_micro_batching",
        )
    clock = StageClock(
        dep,
        timer=group.step_timer,
        max_tokens=max(spec.max_num_batched_tokens, spec.max_num_seqs),
        max_seqs=spec.max_num_seqs,
    )
    return dataclasses.replace(group, loop=MicroBatching(clock=clock))
