"""A replica group: `count` identical replicas of one deployment (scheduler, step timer, KV
cache) and `replica_group`, which builds one from a model, device, layout, precision and
engine with its memory plan, refusing what does not fit or is not modelled.
`serving.cluster` serves requests on groups."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import simpy

from simulator.costmodel.deployment import Deployment, fitting_layouts
from simulator.costmodel.lora import LoraCost, slot_bytes
from simulator.costmodel.memory import KvHold, MemoryPlan, require_fit
from simulator.errors import SpecError
from simulator.metrics.recorder import Recorder
from simulator.serving.drafter import resolve_drafter
from simulator.serving.kv_cache import BlockManager
from simulator.serving.kv_tiers import KVTiers, block_manager, plan_tiers
from simulator.serving.replica import Replica
from simulator.serving.request import Request
from simulator.serving.steptime import StepTimer, Timer
from simulator.specs.engine import EngineSpec, FrontEndCost
from simulator.specs.lora import LoraSpec
from simulator.specs.model import ModelSpec
from simulator.specs.serving import KVOffloadSpec, SchedulerSpec, SpeculativeSpec
from simulator.specs.workload import SamplingSpec
from simulator.workload.requests import RequestTable


class ReplicaLoop(Protocol):
    """How `serving.cluster.serve` builds each replica of a group whose engine loop is not the
    plain Replica's: DP-attention ranks in lockstep (`dp_group.DPAttention`) or pipeline
    micro-batches in flight (`pipeline.MicroBatching`). Returns the router's targets."""

    def build(
        self,
        env: simpy.Environment,
        *,
        group: ReplicaGroup,
        index: int,
        recorder: Recorder,
        on_finish: Callable[[Request], None],
    ) -> list[Replica]: ...


@dataclass(frozen=True)
class ReplicaGroup:
    """`count` identical replicas: their scheduler, step-time model (a `Timer`: the cost
    model's StepTimer, or a test's stand-in that only the plain loop runs on) and KV cache of
    `num_blocks` blocks of `block_size` tokens each."""

    scheduler: SchedulerSpec
    timer: Timer
    num_blocks: int
    block_size: int
    count: int = 1
    host_blocks: int = 0  # swap space per replica, in blocks
    swap_s_per_block: float = 0.0  # time to copy one block between host and GPU
    speculative: SpeculativeSpec | None = None  # its acceptance rates; the timer has the rest
    enable_prefix_caching: bool = False  # vLLM's --enable-prefix-caching
    kv_tiers: KVTiers | None = None  # tiers below HBM (prefix caching on: serving.kv_tiers)
    kv_hold: KvHold | None = None  # sliding windows, a KV token budget
    # How each replica is built when not a plain Replica: DP-attention ranks in lockstep
    # (serving.dp_group) or pipeline micro-batches in flight (serving.pipeline).
    loop: ReplicaLoop | None = None
    # What a request costs outside the engine's steps: the API server in front of each
    # replica (its engine profile's at the deployment's entrypoint; None: nothing added).
    frontend: FrontEndCost | None = None
    # Multi-LoRA: the adapters' step costs and load times (serving.lora; None: off)
    lora: LoraCost | None = None

    @property
    def step_timer(self) -> StepTimer:
        """`timer` as the cost model's StepTimer, which the planner and the loops that price
        steps their own way (DP attention, micro-batching, a partitioned replica) need."""
        if not isinstance(self.timer, StepTimer):
            raise TypeError(f"a StepTimer is needed here, not {type(self.timer).__name__}")
        return self.timer

    def new_kv(self) -> BlockManager:
        """An empty KV cache for one replica (or attention rank) of the group."""
        return block_manager(
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            watermark=self.scheduler.watermark,
            host_blocks=self.host_blocks,
            prefix_caching=self.enable_prefix_caching,
            tiers=self.kv_tiers,
            hold=self.kv_hold,
        )


def default_scheduler(
    engine: EngineSpec,
    *,
    max_model_len: int | None = None,
    model: ModelSpec | None = None,
    **overrides: Any,
) -> SchedulerSpec:
    """The engine's scheduler defaults, with `overrides` (None values ignored). Without
    chunked prefill an engine that sizes its step by the model (vLLM) holds at least
    `max_model_len` tokens a step unless max_num_batched_tokens is given. Prompts share a
    step with the running decodes (`continuous`) where the engine mixes them: chunks with
    chunked prefill (`mixed_prefill`), whole prompts without it (`unchunked_mixed`); elsewhere
    a step is all prefill or all decode (`prefill_first`). `model`: the served model, where
    the engine's default depends on it (`EngineSpec.chunked_by_default`)."""
    sched = engine.scheduler
    given = {k: v for k, v in overrides.items() if v is not None}
    chunked = given.get("chunked_prefill", engine.chunked_by_default(max_model_len, model))
    mixed = sched.mixed_prefill if chunked else sched.unchunked_mixed
    values = {
        "kind": "continuous" if mixed else "prefill_first",  # unless `kind` is given
        "max_num_seqs": sched.max_num_seqs,
        "max_num_batched_tokens": engine.step_tokens(chunked=chunked, max_model_len=max_model_len),
        "chunked_prefill": chunked,
        "watermark": sched.watermark,
        "admission": sched.new_token_ratio if not mixed else None,
        "schedule_ahead": sched.schedule_ahead,
    }
    return SchedulerSpec(**(values | given))


def _check_multi_step(spec: SchedulerSpec, engine: EngineSpec, *, speculative: bool) -> None:
    """SpecError for multi-step scheduling on an engine without it, or with speculation."""
    if spec.num_scheduler_steps == 1:
        return
    if not engine.multi_step_scheduling:
        raise SpecError(
            f"engine {engine.id or engine.name} has no multi-step scheduling (vLLM V0's "
            "--num-scheduler-steps; try --engine vllm-0.6)",
            field="num_scheduler_steps",
        )
    if speculative:
        raise SpecError(
            "multi-step scheduling with speculative decoding is not modelled",
            field="num_scheduler_steps",
        )


def _check_requests(
    requests: RequestTable,
    model: ModelSpec,
    plan: MemoryPlan,
    spec: SchedulerSpec,
    max_model_len: int | None = None,
    pooled: bool = False,
) -> None:
    total = requests.prompt_len + requests.output_len
    limit = max_model_len or model.max_position_embeddings
    too_long = np.flatnonzero(total > limit)
    if too_long.size:
        i = int(too_long[0])
        what = "max_model_len" if max_model_len else "the model's context length"
        raise SpecError(
            f"{too_long.size} requests exceed {what} {limit} (first: request {i}, "
            f"{int(total[i])} tokens)",
            field="workload",
        )
    total = total + spec.num_speculative_tokens  # + lookahead slots
    if plan.hold is not None:
        total = plan.hold.most_tokens(total, requests.prompt_len)
    blocks = -(-total // plan.block_size)
    if not pooled and blocks.max() > plan.kv_capacity_blocks:  # a pool checks its own room
        i = int(blocks.argmax())
        raise SpecError(
            f"request {i} needs {int(blocks[i])} KV blocks, the cache holds "
            f"{plan.kv_capacity_blocks}",
            field="workload",
        )


def replica_group(
    dep: Deployment,
    *,
    requests: RequestTable,
    scheduler: SchedulerSpec | None = None,
    enforce_eager: bool = False,
    gpu_memory_utilization: float | None = None,
    swap_space_gib: float = 4.0,
    speculative: SpeculativeSpec | None = None,
    enable_prefix_caching: bool = False,
    kv_offload: KVOffloadSpec | None = None,
    sampling: SamplingSpec | None = None,
    max_model_len: int | None = None,
    lora: LoraSpec | None = None,
    pooled: bool = False,
) -> tuple[ReplicaGroup, MemoryPlan]:
    """`layout.dp` replicas of a deployment, sized for `requests`: the memory plan (must fit),
    the KV cache in blocks, and the step timer. Requests the replicas could never serve are a
    SpecError. `speculative`: speculative decoding (its drafter's memory and passes);
    `offload`: weights streamed from host memory (`costmodel.offload`), every step pays it;
    `kv_offload`: KV-cache tiers below HBM behind prefix caching (`serving.kv_tiers`);
    `sampling`: how the requests sample (greedy by default): the engine's top-p / top-k sort,
    min-p pass and penalties are priced (not with speculative decoding); `max_model_len`:
    vLLM's --max-model-len, the longest request served (default: the model's context
    length); `lora`: vLLM's --enable-lora slots, preallocated out of the KV cache
    (`costmodel.lora`), and requests naming adapters served within them (`serving.lora`);
    `pooled`: the replicas' caches are in a cluster's KV pool, which checks that the longest
    request fits the pool's room (`serving.kv_pool.install`), not one cache."""
    dep.layout.check(dep.model, dep.hardware)
    spec = scheduler or default_scheduler(
        dep.engine,
        max_model_len=max_model_len or dep.model.max_position_embeddings,
        model=dep.model,
    )
    _check_multi_step(spec, dep.engine, speculative=speculative is not None)
    drafter = None
    if speculative is not None:
        drafter = resolve_drafter(
            speculative,
            dep,
        )
        spec = spec.model_copy(
            update={"num_speculative_tokens": speculative.num_speculative_tokens}
        )
    plan = dep.memory(
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_num_seqs=spec.max_num_seqs,
        host_reserved_bytes=swap_space_gib * 2**30,
    )
    if drafter is not None and plan.offload is not None:
        raise SpecError(
            "speculative decoding with offloaded weights is not modelled", field="offload"
        )
    if drafter is not None:
        plan = drafter.memory(plan)
    if lora is not None:
        plan = dataclasses.replace(plan, lora_bytes=slot_bytes(dep, lora))
    if enable_prefix_caching or kv_offload is not None or drafter is not None:
        what = (
            "prefix caching (--no-enable-prefix-caching turns it off)"
            if enable_prefix_caching
            else "KV offload"
            if kv_offload is not None
            else "speculative decoding"
        )
        for field, on, technique in (
            ("shadowkv", dep.precision.shadowkv is not None, "ShadowKV"),
            ("swiftkv", dep.precision.swiftkv is not None, "SwiftKV"),
        ):
            if on:
                raise SpecError(f"{technique} with {what} is not modelled", field=field)
        # With KV offload tiers vLLM turns its hybrid KV cache manager off (every window layer
        # keeps every token) but a token budget still keeps what it keeps; prefix caching keeps
        # a window's or a budget's savings on the requests' own blocks
        # (serving.kv_cache.PrefixCachingBlockManager), and speculative decoding's rejected
        # slots are rolled back within what the cache holds
        if kv_offload is not None and plan.hold is not None:
            budget = plan.hold.eviction
            kept = None if budget is None else KvHold(eviction=budget)
            plan = dataclasses.replace(plan, hold=kept)
    if not plan.fits:
        fits = fitting_layouts(
            dep,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_batched_tokens=spec.max_num_batched_tokens,
            max_num_seqs=spec.max_num_seqs,
            host_reserved_bytes=swap_space_gib * 2**30,
        )
        require_fit(plan, what=dep.label, alternatives=fits)
    if len(requests):
        # a window under prefix caching frees own blocks only: check each request whole
        checked = dataclasses.replace(plan, hold=None) if enable_prefix_caching else plan
        _check_requests(requests, dep.model, checked, spec, max_model_len, pooled=pooled)
        if lora is None and bool(np.any(requests.adapter >= 0)):
            raise SpecError(
                "requests name LoRA adapters but the replicas do not enable LoRA "
                "(--enable-lora, a replica group's lora)",
                field="workload.adapters",
            )
    longest = int((requests.prompt_len + requests.output_len).max()) if len(requests) else 1
    if drafter is not None:  # decodes verify 1 + k tokens; the drafter's passes are added
        timer = drafter.step_timer(
            max_num_seqs=spec.max_num_seqs,
            max_num_batched_tokens=spec.max_num_batched_tokens,
            max_context=longest + spec.num_speculative_tokens,
            enforce_eager=enforce_eager,
            sampling=sampling,
        )
    else:
        timer = StepTimer(
            dep,
            offload=plan.offload,
            max_num_seqs=spec.max_num_seqs,
            max_num_batched_tokens=spec.max_num_batched_tokens,
            max_context=longest,
            enforce_eager=enforce_eager,
            sampling=sampling,
        )
    # vLLM's --swap-space is per GPU; a replica's devices each hold their share of a block.
    block_bytes = plan.kv_bytes_per_token * plan.block_size
    host_link = dep.hardware.host.pcie_bw_bytes_per_s * dep.hardware.efficiency.host_link_fraction
    group = ReplicaGroup(
        scheduler=spec,
        timer=timer,
        num_blocks=plan.kv_capacity_blocks,
        block_size=plan.block_size,
        count=dep.layout.dp,
        host_blocks=int(swap_space_gib * 2**30 // block_bytes),
        swap_s_per_block=block_bytes / host_link,
        speculative=speculative,
        enable_prefix_caching=enable_prefix_caching,
        kv_tiers=None
        if kv_offload is None
        else plan_tiers(
            kv_offload,
            hw=dep.hardware,
            plan=plan,
            gpus=dep.layout.devices_per_replica,
            swap_space_gib=swap_space_gib,
        ),
        frontend=dep.engine.front_end(),
        kv_hold=plan.hold,
        lora=None if lora is None else LoraCost(dep, lora),
    )
    return group, plan
