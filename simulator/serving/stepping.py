"""What the pipelined and the DP-attention engines share with a plain replica's step: the
batch a plan describes, and applying a finished batch's results.

`SteppedReplica` is a Replica (the router sees its queues, KV cache and `submit`) whose batches
are timed by someone else: `serving.pipeline` keeps several in flight, `serving.dp_group` steps
several ranks in lockstep. Not modelled here: speculative decoding and disaggregated prefill
(their hooks live in Replica's own loop).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

from simulator.errors import SpecError
from simulator.metrics.recorder import Recorder
from simulator.serving.kv_cache import BlockManager, PrefixCachingBlockManager
from simulator.serving.replica import Replica
from simulator.serving.request import Request
from simulator.serving.scheduler import StepPlan

if TYPE_CHECKING:
    from simulator.serving.cluster import ReplicaGroup

Chunk = tuple[int, int, bool]  # prefill tokens, cached offset, is the prompt's last chunk


def new_kv(group: ReplicaGroup) -> BlockManager:
    """An empty KV cache for one replica (or attention rank) of `group`."""
    manager = PrefixCachingBlockManager if group.enable_prefix_caching else BlockManager
    return manager(
        num_blocks=group.num_blocks,
        block_size=group.block_size,
        watermark=group.scheduler.watermark,
        host_blocks=group.host_blocks,
    )


def check_plain_steps(group: ReplicaGroup, *, what: str) -> None:
    """SpecError unless `group`'s replicas step without speculative decoding (which only the
    plain Replica's loop models)."""
    if group.speculative is not None:
        raise SpecError(f"{what} with speculative decoding is not modelled", field="speculative")


def batch_of(plan: StepPlan) -> tuple[list[Chunk], list[int]]:
    """The plan as the cost model prices it: prefill chunks and the KV lengths of the decodes
    (a decode: one token after the last sampled one)."""
    chunks: list[Chunk] = []
    decodes: list[int] = []
    for req, n in plan.entries:
        computed = req.num_computed
        if n == 1 and req.num_output > 0 and computed + 1 == req.known:
            decodes.append(computed + 1)
        else:
            chunks.append((n, computed, computed + n == req.known))
    return chunks, decodes


class SteppedReplica(Replica):
    """A replica of `group` (its scheduler, step timer, swap cost and an empty KV cache of its
    own) whose batches another loop times; `apply` records one that ran."""

    def __init__(
        self,
        env: simpy.Environment,
        *,
        group: ReplicaGroup,
        index: int,
        recorder: Recorder,
        on_finish: Callable[[Request], None],
    ) -> None:
        super().__init__(
            env,
            index=index,
            scheduler=group.scheduler,
            kv=new_kv(group),
            timer=group.timer,
            recorder=recorder,
            on_finish=on_finish,
            swap_s_per_block=group.swap_s_per_block,
        )

    def apply(
        self,
        plan: StepPlan,
        *,
        chunks: list[Chunk],
        decodes: list[int],
        start: float,
        end: float,
    ) -> None:
        """The batch of `plan` ran from `start` to `end`: advance its requests' counters,
        sample where a prompt or a decode completed, record the step and the inter-token
        gaps."""
        gaps: list[float] = []
        for req, n in plan.entries:
            if req.first_scheduled_s != req.first_scheduled_s:  # NaN: first time on the GPU
                req.first_scheduled_s = start
            req.num_computed += n
            if req.num_computed == req.prompt_len + req.num_output:  # a token to sample
                if req.num_output > 0:
                    gaps.append(req.last_token_s)
                self._sampled(req, end)
        self._record_gaps(gaps, end)
        self.recorder.step(
            replica=self.index,
            start_s=start,
            end_s=end,
            num_seqs=len(plan.entries),
            prefill_tokens=sum(c[0] for c in chunks),
            decode_tokens=len(decodes),
            kv_used_blocks=self.kv.used,
        )
