"""Attention data parallelism with wide expert parallelism: N attention ranks in lockstep.

vLLM's `--data-parallel-size N --enable-expert-parallel` and SGLang's `--enable-dp-attention`
run N attention ranks of tp GPUs each. Every rank has its own scheduler, batch and KV cache,
but each MoE layer spreads its experts over all N x tp GPUs (EP = N x tp), so an engine step
is one collective step of all ranks: a rank with nothing to run executes a dummy batch (vLLM's
`execute_dummy_batch`), and the step lasts as long as the slowest rank's own part (attention,
dense layers, router, shared experts, LM head) plus the part the group shares (the busiest EP
rank's expert FFNs over every rank's tokens, the all-to-all dispatch and combine):

    step = max over ranks of kernel_s(rank's batch) + shared GPU time(group tokens, largest
           rank's tokens) + step_s + per_seq_s x (most sequences on a rank)

`kernel_s` is the rank's StepTimer on the wide-EP layout, whose tables leave out the ops that
scale with the EP group (`scales_with == "ep_group"`); `EPGroupTimes` prices those for the
group's actual tokens. With equal batches on every rank this is the cost model's step of the
wide-EP layout (`costmodel.step.step_cost`), which assumes exactly that.

Not modelled: vLLM padding every rank's batch to the largest rank's token count (only the
CUDA-graph choice follows the largest rank), dummy batches' tokens in the experts, overlap of
the all-to-all with compute (DeepEP's two micro-batches, SGLang's two-batch overlap), EPLB's
redundant experts (give their effect as `expert_load_imbalance`), decode segments (every
lockstep step is simulated), speculative decoding and disaggregated prefill on the ranks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import simpy

from simulator.costmodel.deployment import Deployment
from simulator.costmodel.ops import (
    Op,
    dispatch_ops,
    dispatch_tokens,
    expert_ffn_ops,
    expert_imbalance_from_skew,
)
from simulator.costmodel.roofline import evaluate, total_launches, total_time
from simulator.errors import SpecError
from simulator.metrics.recorder import Recorder
from simulator.serving.replica import Chunk, Replica
from simulator.serving.request import Request
from simulator.serving.scheduler import StepPlan, schedule
from simulator.serving.stepping import SteppedReplica, check_plain_steps
from simulator.serving.steptime import StepTimer
from simulator.specs.engine import EngineSpec
from simulator.specs.hardware import HardwareSpec
from simulator.specs.model import ModelSpec

if TYPE_CHECKING:
    from simulator.serving.group import ReplicaGroup

Batch = tuple[list[Chunk], list[int]]  # prefill chunks, decode KV lengths


class EPGroupTimes:
    """GPU seconds and kernel launches of the ops an EP group shares: the expert FFNs of the
    busiest rank, tabulated over the group's token count (0 to ranks x `max_rank_tokens`),
    and the all-to-alls, costed per distinct size and kept."""

    def __init__(self, dep: Deployment, *, max_rank_tokens: int) -> None:
        self._dep = dep
        tokens = np.arange(dep.layout.dp * max_rank_tokens + 1, dtype=float)
        ffn = expert_ffn_ops(dep.model, dep.layout, dep.precision, group_tokens=tokens)
        gpu, kernels = _totals(ffn, dep.hardware, dep.engine)
        self._ffn_gpu, self._ffn_k = gpu.tolist(), kernels.tolist()
        self._a2a: dict[float, tuple[float, float]] = {}

    def cost(self, *, group_tokens: int, sender_tokens: int) -> tuple[float, float]:
        """(GPU seconds, kernel launches) for `group_tokens` tokens over all ranks, the largest
        rank holding `sender_tokens`."""
        dep = self._dep
        moved = float(
            dispatch_tokens(dep.layout, group_tokens=group_tokens, sender_tokens=sender_tokens)
        )
        if moved not in self._a2a:
            ops = dispatch_ops(dep.model, dep.layout, dep.precision, tokens=moved)
            gpu, kernels = _totals(ops, dep.hardware, dep.engine)
            self._a2a[moved] = (float(gpu[0]), float(kernels[0]))
        a2a_gpu, a2a_k = self._a2a[moved]
        return self._ffn_gpu[group_tokens] + a2a_gpu, self._ffn_k[group_tokens] + a2a_k


def _totals(ops: list[Op], hw: HardwareSpec, engine: EngineSpec) -> tuple[np.ndarray, np.ndarray]:
    """(GPU seconds, kernel launches) of `ops` as `engine` runs them, summed over the ops, per
    batch element."""
    costs = evaluate(ops, hw, engine)
    return total_time(costs), total_launches(costs)


class Lockstep(Protocol):
    """What a DP group needs to time its steps: `LockstepTimer`, or a test's simpler one."""

    def step(self, batches: Sequence[Batch]) -> float: ...


class LockstepTimer:
    """Duration of one lockstep step of the DP group (the module docstring's formula). The
    shared ops' launches count only when the step runs eagerly (no CUDA graph: the engine
    captures none, `enforce_eager`, or the largest rank's tokens exceed the captured size)."""

    def __init__(
        self, *, local: StepTimer, shared: EPGroupTimes, engine: EngineSpec, enforce_eager: bool
    ) -> None:
        self.local = local
        self.shared = shared
        ov = engine.overhead
        self._graphs = engine.cuda_graphs and not enforce_eager
        self._graph_max = engine.cuda_graph_max_tokens
        self._eager_s, self._step_s, self._per_seq_s = ov.launch_eager_s, ov.step_s, ov.per_seq_s

    def step(self, batches: Sequence[Batch]) -> float:
        """Seconds of a step in which rank i runs `batches[i]` (empty: a dummy batch)."""
        kernel = 0.0
        total = largest = seqs = 0
        for chunks, decodes in batches:
            tokens = sum(c[0] for c in chunks) + len(decodes)
            if not tokens:  # a dummy batch is never the slowest rank
                continue
            kernel = max(kernel, self.local.kernel_s(chunks=chunks, decode_contexts=decodes))
            total += tokens
            largest = max(largest, tokens)
            seqs = max(seqs, len(chunks) + len(decodes))
        gpu, launches = self.shared.cost(group_tokens=total, sender_tokens=largest)
        graphed = self._graphs and largest <= self._graph_max
        shared = gpu if graphed else max(gpu, launches * self._eager_s)
        return kernel + shared + self._step_s + self._per_seq_s * seqs


class DPRank(SteppedReplica):
    """One attention rank: its own queues and KV cache (the router sends requests to it), its
    steps taken by its DPGroup."""

    def __init__(
        self,
        env: simpy.Environment,
        *,
        dp: DPGroup,
        index: int,
        recorder: Recorder,
        on_finish: Callable[[Request], None],
    ) -> None:
        super().__init__(
            env, group=dp.replica_group, index=index, recorder=recorder, on_finish=on_finish
        )
        self.dp = dp

    def run(self) -> Generator[simpy.Event, Any, None]:
        """No loop of its own: the group steps every rank."""
        yield from ()

    def submit(self, req: Request) -> None:
        super().submit(req)
        self.dp.wake()


class DPGroup:
    """`size` DPRanks stepping in lockstep, numbered from `first_index`."""

    def __init__(
        self,
        env: simpy.Environment,
        *,
        size: int,
        first_index: int,
        group: ReplicaGroup,
        timer: Lockstep,
        recorder: Recorder,
        on_finish: Callable[[Request], None],
    ) -> None:
        self.env = env
        self.replica_group = group
        self.timer = timer
        self._wakeup = env.event()
        self.ranks = [
            DPRank(env, dp=self, index=first_index + i, recorder=recorder, on_finish=on_finish)
            for i in range(size)
        ]
        self.process = env.process(self.run())

    def wake(self) -> None:
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    def run(self) -> Generator[simpy.Event, Any, None]:
        while True:
            if not any(r.running or r.waiting for r in self.ranks):
                self._wakeup = self.env.event()
                yield self._wakeup
                continue
            plans = [
                schedule(r.spec, running=r.running, waiting=r.waiting, kv=r.kv)
                if r.running or r.waiting
                else StepPlan()
                for r in self.ranks
            ]
            if not any(p.entries for p in plans):
                stuck = next(r for r in self.ranks if r.waiting)
                raise RuntimeError(
                    f"replica {stuck.index}: nothing schedulable ({stuck.waiting[0]})"
                )
            batches = [r.batch_of(p) for r, p in zip(self.ranks, plans, strict=True)]
            swaps = (
                max(p.swapped_out + p.swapped_in for p in plans)
                * self.replica_group.swap_s_per_block
            )
            start = self.env.now
            yield self.env.timeout(swaps + self.timer.step(batches))
            for rank, plan, (chunks, decodes) in zip(self.ranks, plans, batches, strict=True):
                if plan.entries:
                    rank.apply(plan, chunks=chunks, decodes=decodes, start=start, end=self.env.now)


@dataclass(frozen=True)
class DPAttention:
    """How `serving.cluster.serve` builds each replica of a group with DP attention: `ranks`
    DPRanks (router targets, each numbered as a replica) stepped by one DPGroup."""

    ranks: int
    timer: Lockstep

    def build(
        self,
        env: simpy.Environment,
        *,
        group: ReplicaGroup,
        index: int,
        recorder: Recorder,
        on_finish: Callable[[Request], None],
    ) -> list[Replica]:
        dp = DPGroup(
            env,
            size=self.ranks,
            first_index=index,
            group=group,
            timer=self.timer,
            recorder=recorder,
            on_finish=on_finish,
        )
        return list(dp.ranks)


def with_dp_attention(
    group: ReplicaGroup,
    dep: Deployment,
    *,
    count: int,
    enforce_eager: bool = False,
) -> ReplicaGroup:
    """`group` (built by `cluster.replica_group` for the wide-EP `layout`, whose timer is a
    rank's) as `count` DP groups of `layout.dp` ranks each."""
    check_plain_steps(group, what="DP attention")
    spec = group.scheduler
    shared = EPGroupTimes(
        dep,
        max_rank_tokens=max(spec.max_num_batched_tokens, spec.max_num_seqs),
    )
    timer = LockstepTimer(
        local=group.step_timer, shared=shared, engine=dep.engine, enforce_eager=enforce_eager
    )
    return dataclasses.replace(
        group, count=count, loop=DPAttention(ranks=dep.layout.dp, timer=timer)
    )


def expert_parallel_sizes(
    *,
    model: ModelSpec,
    tensor_parallel_size: int,
    count: int,
    data_parallel_size: int,
    enable_expert_parallel: bool,
) -> tuple[int, int]:
    """(dp, ep) of a replica group's deployment. data_parallel_size > 1: that many attention
    ranks in one replica with EP = tp x dp over them (DP attention; needs EP). Otherwise dp is
    the group's independent replicas (`count`) and EP, if enabled, spans the TP group."""
    if enable_expert_parallel and model.moe is None:
        raise SpecError(f"{model.id or model.name} has no experts", field="enable_expert_parallel")
    if data_parallel_size > 1:
        if not enable_expert_parallel:
            raise SpecError(
                "attention ranks of one replica are coupled by expert parallelism: set "
                "enable_expert_parallel (independent replicas: use count)",
                field="data_parallel_size",
            )
        return data_parallel_size, tensor_parallel_size * data_parallel_size
    return count, tensor_parallel_size if enable_expert_parallel else 1


def expert_load_imbalance(
    *, model: ModelSpec, ep: int, given: float | None, skew: float | None
) -> float:
    """The layout's `expert_load_imbalance`: `given` (max/mean tokens per EP rank), or from a
    Zipf `skew` of expert popularity (`costmodel.ops.expert_imbalance_from_skew`), else 1
    (balanced). Either needs expert parallelism; not both."""
    if given is None and skew is None:
        return 1.0
    field = "expert_load_imbalance" if given is not None else "expert_routing_skew"
    if given is not None and skew is not None:
        raise SpecError("give expert_load_imbalance or expert_routing_skew, not both", field=field)
    if ep < 2 or model.moe is None:
        raise SpecError("needs expert parallelism (enable_expert_parallel)", field=field)
    if given is not None:
        return given
    assert skew is not None
    return expert_imbalance_from_skew(num_experts=model.moe.num_experts, ep=ep, skew=skew)
