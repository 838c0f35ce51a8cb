"""What the pipelined and the DP-attention engines share: a Replica whose batches another
loop times.

`SteppedReplica` is a Replica (the router sees its queues, KV cache and `submit`; `batch_of`
prices a plan and `apply` records a batch that ran, as in the plain loop) whose batches are
timed by someone else: `serving.pipeline` keeps several in flight, `serving.dp_group` steps
several ranks in lockstep. Not modelled here: speculative decoding, disaggregated prefill and
KV tiers below HBM (their hooks live in Replica's own loop).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import simpy

from simulator.errors import SpecError
from simulator.metrics.recorder import Recorder
from simulator.serving.replica import Replica
from simulator.serving.request import Request

if TYPE_CHECKING:
    from simulator.serving.group import ReplicaGroup


def check_plain_steps(group: ReplicaGroup, *, what: str) -> None:
    """SpecError unless `group`'s replicas step without speculative decoding, KV tiers,
    multi-step or async scheduling (which only the plain Replica's loop models)."""
    if group.speculative is not None:
        raise SpecError(f"{what} with speculative decoding is not modelled", field="speculative")
    if group.scheduler.num_scheduler_steps > 1:
        raise SpecError(
            f"{what} with multi-step scheduling is not modelled", field="num_scheduler_steps"
        )
    if group.kv_tiers is not None:
        raise SpecError(f"{what} with KV offload tiers is not modelled", field="kv_offload")
    if group.timer.async_scheduling:
        raise SpecError(f"{what} with async scheduling is not modelled", field="async_scheduling")


class SteppedReplica(Replica):
    """A replica of `group` (its scheduler, step timer, swap cost and an empty KV cache of its
    own) whose batches another loop times and records with `apply`."""

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
            kv=group.new_kv(),
            timer=group.timer,
            recorder=recorder,
            on_finish=on_finish,
            swap_s_per_block=group.swap_s_per_block,
        )
