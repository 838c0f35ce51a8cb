"""Which engine loop a replica group runs, from its scenario fields: a plain Replica, DP
attention ranks in lockstep (`serving.dp_group`), or pipeline micro-batches in flight
(`serving.pipeline`); and the expert-parallel layout those fields describe."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simulator.errors import SpecError
from simulator.serving.dp_group import (
    expert_load_imbalance,
    expert_parallel_sizes,
    with_dp_attention,
)
from simulator.serving.pipeline import with_micro_batching
from simulator.specs.model import ModelSpec

if TYPE_CHECKING:
    from simulator.costmodel.deployment import Deployment
    from simulator.serving.group import ReplicaGroup
    from simulator.specs.scenario import ReplicaGroupSpec


def expert_layout(model: ModelSpec, spec: ReplicaGroupSpec) -> dict[str, Any]:
    """`api.deployment`'s data_parallel_size, expert_parallel_size and expert_load_imbalance
    for a replica group: with data_parallel_size > 1, that many attention ranks per replica
    and EP = tp x dp (DP attention); otherwise `count` independent replicas, EP = tp when
    enabled."""
    dp, ep = expert_parallel_sizes(
        model=model,
        tensor_parallel_size=spec.tensor_parallel_size,
        count=spec.count,
        data_parallel_size=spec.data_parallel_size,
        enable_expert_parallel=spec.enable_expert_parallel,
    )
    imbalance = expert_load_imbalance(
        model=model, ep=ep, given=spec.expert_load_imbalance, skew=spec.expert_routing_skew
    )
    return {
        "data_parallel_size": dp,
        "expert_parallel_size": ep,
        "expert_load_imbalance": imbalance,
    }


def engine_loop(group: ReplicaGroup, *, spec: ReplicaGroupSpec, dep: Deployment) -> ReplicaGroup:
    """`group` (from `cluster.replica_group` for `dep`) with the loop `spec` asks for: DP
    attention (`data_parallel_size` > 1; `spec.count` DP groups) or pipeline micro-batching,
    else unchanged."""
    dp = spec.data_parallel_size > 1
    if not (dp or spec.pipeline_micro_batching):
        return group
    if spec.role != "both":
        raise SpecError(
            "DP attention and pipeline micro-batching are not modelled in disaggregated pools",
            field="role",
        )
    if dp and spec.pipeline_micro_batching:
        raise SpecError(
            "pipeline micro-batching with DP attention is not modelled",
            field="pipeline_micro_batching",
        )
    if dp:
        return with_dp_attention(group, dep, count=spec.count, enforce_eager=spec.enforce_eager)
    return with_micro_batching(group, dep)
