"""Scenario files for `llmsim run`: everything the bench flags cannot say.

A scenario serves one model on one or more replica groups (each its own hardware, engine,
parallel layout, precision and scheduler knobs) behind a router, fed by a workload, judged
against optional SLOs. The JSON schema is `Scenario.model_json_schema()`
(`llmsim run --schema` prints it); scenarios/ has examples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from simulator.errors import SpecError
from simulator.specs._base import (
    MAX_GPUS,
    MAX_HOST_GIB,
    MAX_REQUESTS,
    MAX_TOKENS,
    Frozen,
    Seconds,
    Watts,
)
from simulator.specs.deployment import KvEvictionPolicy, ShadowKV, SwiftKV, check_quantization
from simulator.specs.engine import Entrypoint
from simulator.specs.loader import (
    beside,
    host_cpu,
    list_engines,
    list_hardware,
    list_models,
    load_engine,
    read_yaml,
    validate,
)
from simulator.specs.lora import LoraSpec
from simulator.specs.offload import ExpertOffloadSpec, OffloadSpec
from simulator.specs.serving import (
    KVOffloadSpec,
    KvPoolSpec,
    KVTransferSpec,
    RouterSpec,
    SpeculativeSpec,
    kv_offload_problem,
)
from simulator.specs.workload import DatasetSpec, ShareGPTDataset, TraceDataset, WorkloadSpec


class SchedulerOverrides(Frozen):
    """Scheduler knobs; anything left out takes the engine profile's default."""

    kind: Literal["continuous", "prefill_first", "static"] | None = None
    policy: Literal["fcfs", "priority"] | None = None
    preemption_mode: Literal["recompute", "swap"] | None = None
    max_num_seqs: int | None = Field(default=None, gt=0, le=MAX_REQUESTS)
    max_num_batched_tokens: int | None = Field(default=None, gt=0, le=MAX_TOKENS)
    chunked_prefill: bool | None = None
    watermark: float | None = Field(default=None, ge=0, lt=1)
    num_scheduler_steps: int | None = Field(
        default=None, ge=1, description="vLLM V0's --num-scheduler-steps (multi-step scheduling)"
    )
    multi_step_stream_outputs: bool | None = Field(
        default=None,
        description="with multi-step scheduling, each step's tokens returned as it ends (vLLM's "
        "--multi-step-stream-outputs, its default from 0.6.2); false: a block's tokens at the "
        "block's end, its finished requests computing to it (vLLM 0.6.0-0.6.1)",
    )
    schedule_ahead: bool | None = Field(
        default=None,
        description="the next batch formed while a step runs (SGLang's overlap scheduler; "
        "false: SGLang's --disable-overlap-schedule, as far as admission goes)",
    )


class ReplicaGroupSpec(Frozen):
    """`count` identical replicas of tensor_parallel_size x pipeline_parallel_size x
    context_parallel_size GPUs (x data_parallel_size with DP attention)."""

    hardware: str
    engine: str = "vllm"
    role: Literal["both", "prefill", "decode"] = Field(
        default="both", description="both: colocated; prefill/decode: a disaggregated pool"
    )
    count: int = Field(default=1, ge=1, le=MAX_GPUS)
    tensor_parallel_size: int = Field(default=1, ge=1, le=MAX_GPUS)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=MAX_GPUS)
    context_parallel_size: int = Field(
        default=1,
        ge=1,
        le=MAX_GPUS,
        description="context-parallel ranks of tp x pp GPUs sharing every sequence's tokens "
        "and KV (ring-attention prefill, KV-sharded decode); GPUs = tp x pp x cp",
    )
    pipeline_micro_batching: bool = Field(
        default=False, description="pp > 1: up to pp batches in flight (vLLM V1); off: one"
    )
    data_parallel_size: int = Field(
        default=1,
        ge=1,
        le=MAX_GPUS,
        description="attention ranks per replica in lockstep, EP over all (vLLM -dp with "
        "--enable-expert-parallel; SGLang --dp-size with --enable-dp-attention)",
    )
    enable_expert_parallel: bool = Field(
        default=False, description="vLLM's flag: experts over EP = tp x data_parallel_size"
    )
    expert_load_imbalance: float | None = Field(
        default=None, ge=1, description="busiest EP rank's tokens / mean (default 1)"
    )
    expert_routing_skew: float | None = Field(
        default=None, ge=0, description="Zipf exponent of expert popularity -> the imbalance"
    )
    dtype: str = "auto"
    quantization: Annotated[str | None, AfterValidator(check_quantization)] = Field(
        default=None,
        description="weight format: fp8, int8, int4, fp4, or gguf:TYPE (a GGUF file type such "
        "as gguf:Q4_K_M, its tensors in llama.cpp's formats); None: the checkpoint's own",
    )
    kv_cache_dtype: str = Field(
        default="auto",
        description="vLLM's --kv-cache-dtype (auto, fp8), or int4 (COMET's KV4) / int2 "
        "(KIVI), which vLLM does not serve",
    )
    kv_budget: int | None = Field(
        default=None,
        gt=0,
        le=MAX_TOKENS,
        description="tokens of KV each sequence keeps once its prompt is in (SnapKV, H2O, "
        "StreamingLLM); None: all. Turns prefix caching off unless it is set",
    )
    kv_eviction: KvEvictionPolicy = Field(
        default="snapkv", description="what a kv_budget keeps: snapkv, h2o or streaming"
    )
    shadowkv: ShadowKV | None = Field(
        default=None,
        description="ShadowKV: low-rank keys on the GPU, values in host memory, sparse decode "
        "({rank, budget, chunk, outlier_share}); turns prefix caching off unless it is set",
    )
    swiftkv: SwiftKV | None = Field(
        default=None,
        description="SwiftKV: prompt tokens skip the last skip_fraction of the layers, "
        "AcrossKV shares KV among `across` of them; turns prefix caching off unless it is set",
    )
    enforce_eager: bool = False
    max_model_len: int | None = Field(
        default=None,
        gt=0,
        le=MAX_TOKENS,
        description="vLLM's --max-model-len: the longest request (prompt + output) served, and "
        "without chunked prefill the default step budget; None: the model's context length",
    )
    async_scheduling: bool = Field(
        default=False,
        description="vLLM's --async-scheduling: the next step's scheduling, input preparation "
        "and launches run while the GPU computes this one (engines with async scheduling)",
    )
    overlap_tp_comm: bool = Field(
        default=False,
        description="tensor-parallel all-reduces fused with the GEMM producing their input "
        "(T3-style): each hides under that GEMM (costmodel/tp_overlap.yaml)",
    )
    nano_batches: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="each step split into this many nano-batches whose compute, memory and "
        "network kernels overlap (NanoFlow, costmodel/nanobatch.py); None: the engine "
        "profile's (nanoflow: 2, every other profile: 1)",
    )
    pd_partition: str | None = Field(
        default=None,
        description="intra-GPU prefill/decode partitioning (Nexus, arXiv 2507.06608): a "
        "prefill and a decode stream run at once on shares of the SMs over one KV cache; "
        "static:<prefill SM share> or dynamic:<decode TBT target ms> (serving/pd_partition.py)",
    )
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    swap_space_gib: float = Field(
        default=4.0, ge=0, le=MAX_HOST_GIB, description="host swap space per GPU"
    )
    enable_prefix_caching: bool | None = Field(
        default=None,
        description="automatic prefix caching (vLLM's --enable-prefix-caching); None: the "
        "engine's default (on in vLLM V1, SGLang and TensorRT-LLM)",
    )
    entrypoint: Entrypoint = Field(
        default="server",
        description="how the engine runs: `server` (an API server, as `vllm serve`) or "
        "`offline` (vLLM's LLM class, as `vllm bench latency|throughput`); the engine's batch "
        "defaults on the device depend on it",
    )
    kv_offload: KVOffloadSpec | None = Field(
        default=None,
        description="KV-cache tiers below HBM (host DRAM, NVMe): backend, cpu_gib, nvme_gib, "
        "bandwidths (vLLM's --kv-offloading-size/--kv-offloading-backend; serving.kv_tiers)",
    )
    cpu_offload_gb: float = Field(
        default=0.0,
        ge=0,
        le=MAX_HOST_GIB,
        description="GiB of weights per GPU streamed from host memory (vLLM)",
    )
    offload: OffloadSpec | None = Field(
        default=None,
        description="weight streaming: resident_layers, source, transfer, host_memory_bytes",
    )
    expert_offload: ExpertOffloadSpec | None = Field(
        default=None, description="MoE experts in host memory behind a GPU expert cache"
    )
    lora: LoraSpec | None = Field(
        default=None,
        description="multi-LoRA serving (vLLM's --enable-lora): max_loras, max_lora_rank, "
        "max_cpu_loras, target_modules; slots preallocated out of the KV cache",
    )
    scheduler: SchedulerOverrides = Field(default_factory=SchedulerOverrides)
    power_cap_w: Watts | None = Field(
        default=None,
        gt=0,
        description="per-GPU power limit; lowers the clock (simulator.runs.energy)",
    )
    power_priority: int = Field(
        default=0,
        description="under a dynamic power_budget: groups of lower priority are capped first "
        "and released last (POLCA's low-priority workloads); equal: the later group first",
    )
    host_cpu: str | None = Field(
        default=None,
        description="the node's CPU where it is not the hardware's (an id of "
        "simulator/specs/host_cpus.yaml, e.g. epyc-9654): the engine's CPU costs scale to it",
    )
    usd_per_gpu_hour: float | None = Field(
        default=None, gt=0, description="price override (default: the hardware's price)"
    )
    speculative: SpeculativeSpec | None = Field(
        default=None, description="speculative decoding: vLLM's --speculative-config keys"
    )

    @field_validator("pd_partition")
    @classmethod
    def _pd_partition_known(cls, value: str | None) -> str | None:
        if value is not None:
            from simulator.specs.serving import parse_pd_partition

            try:
                return parse_pd_partition(value).text
            except SpecError as exc:
                raise ValueError(exc.reason) from None
        return value

    @model_validator(mode="after")
    def _pd_partition_applies(self) -> ReplicaGroupSpec:
        if self.pd_partition is not None and self.role != "both":
            raise ValueError("pd_partition: intra-GPU partitioning is a colocated replica's")
        return self

    @field_validator("host_cpu")
    @classmethod
    def _known_cpu(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                host_cpu(value)
            except SpecError as exc:
                raise ValueError(exc.reason) from None
        return value

    @model_validator(mode="after")
    def _kv_offload_applies(self) -> ReplicaGroupSpec:
        if self.kv_offload is not None:
            problem = kv_offload_problem(
                prefix_caching=self.prefix_caching,
                role=self.role,
                data_parallel_size=self.data_parallel_size,
                micro_batching=self.pipeline_micro_batching,
                preemption_mode=self.scheduler.preemption_mode,
            )
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _lora_applies(self) -> ReplicaGroupSpec:
        if self.lora is None:
            return self
        if self.role != "both":
            raise ValueError("lora: LoRA on a disaggregated pool is not modelled")
        if self.data_parallel_size > 1 or self.pipeline_micro_batching:
            raise ValueError(
                "lora: LoRA with DP attention or pipeline micro-batching is not modelled"
            )
        return self

    @property
    def prefix_caching(self) -> bool:
        """Prefix caching on: as set, else the engine's default (on for an engine id that is
        not found, whose error comes when the group is built); off under a kv_budget."""
        if self.enable_prefix_caching is not None:
            return self.enable_prefix_caching
        if self.kv_budget is not None:  # a cache of evicted prompts is not modelled
            return False
        if self.shadowkv is not None or self.swiftkv is not None:  # nor one of their caches
            return False
        try:
            return load_engine(self.engine).scheduler.prefix_caching
        except SpecError:
            return True

    @property
    def num_replicas(self) -> int:
        """Replica indices the group takes in a run (each of tp x pp GPUs): count, times
        data_parallel_size with DP attention (each attention rank is numbered as a replica)."""
        return self.count * self.data_parallel_size


class SLOSpec(Frozen):
    """Per-request latency targets in ms; goodput counts requests meeting all given ones."""

    ttft_ms: float | None = Field(default=None, ge=0)
    tpot_ms: float | None = Field(default=None, ge=0)
    e2el_ms: float | None = Field(default=None, ge=0)

    def goodput(self) -> dict[str, float]:
        targets = {"ttft": self.ttft_ms, "tpot": self.tpot_ms, "e2el": self.e2el_ms}
        return {k: v for k, v in targets.items() if v is not None}


# What `llmsim run --out` writes (`runs.runner.save_run`): each level adds to the one before.
RunOutputs = Literal["summary", "requests", "steps", "all", "stream"]
OutputFormat = Literal["csv", "parquet"]


class AutoscaleSpec(Frozen):
    """Scale one replica group between `min_replicas` and `max_replicas` (it starts with its
    `count`; a scenario's `autoscale:` holds one, or a list of them, one per group, each
    scaled on its own). Every `interval_s` the autoscaler wants ceil(load / target)
    replicas, where the load is the group's outstanding requests (`metric: outstanding`) or
    the sum of its replicas' KV usage (`kv_usage`), as Kubernetes' HPA sizes to a target per
    pod; it adds replicas at once and removes one only after the want stayed lower for
    `scale_down_delay_s` (the HPA's stabilization window). A new replica loads its weights
    (bytes per GPU / the bandwidth of `weights_from`: NVMe `storage`, or `host` memory over
    the host link) and serves nothing meanwhile; a removed one takes no new request and
    stops once its requests finish (serving.fleet)."""

    group: int = Field(default=0, ge=0, description="the replica group (index) it scales")
    min_replicas: int = Field(ge=1, le=MAX_GPUS)
    max_replicas: int = Field(ge=1, le=MAX_GPUS)
    metric: Literal["outstanding", "kv_usage"] = "outstanding"
    target: float = Field(
        gt=0, description="outstanding requests per replica, or KV usage (0-1) per replica"
    )
    interval_s: float = Field(default=10.0, gt=0, description="seconds between evaluations")
    scale_down_delay_s: float = Field(
        default=60.0, ge=0, description="seconds the want must stay lower before scaling down"
    )
    weights_from: Literal["storage", "host"] = Field(
        default="storage",
        description="where a new replica reads its weights: the node's NVMe (storage) or host "
        "memory over the host link (host)",
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas {self.min_replicas} is above max_replicas {self.max_replicas}"
            )
        if self.metric == "kv_usage" and self.target > 1:
            raise ValueError(f"a kv_usage target is a fraction (0-1], got {self.target}")
        return self


class PowerBudgetSpec(Frozen):
    """A power budget for the fleet's GPUs (serving.power). `policy: none` runs as without it;
    `static` caps every GPU at budget_w / the fleet's GPUs, so that all of them at full load
    fit; `dynamic` (POLCA, arXiv:2308.12908: cap when the cluster's draw crosses a threshold,
    low-priority servers first, uncap when it falls back) samples the fleet's estimated draw
    every `sample_s`, and when its mean over `window_s` exceeds cap_threshold x budget_w caps
    replicas at `cap_w` per GPU, lowest priority first (the groups' `power_priority`, then the
    last replica group's, highest index first), as many as it takes for the estimate to fit
    under the threshold; each cap takes effect `reaction_s` after the decision. Once the
    windowed draw is below release_threshold x budget_w it lifts one cap, highest priority
    first (after `reaction_s` too). Above `cap_all_threshold` x budget_w (POLCA's second
    threshold; None: off) a round caps every replica that is on, whatever its priority."""

    budget_w: Watts = Field(gt=0, description="the fleet's GPU power budget")
    policy: Literal["none", "static", "dynamic"] = "dynamic"
    cap_w: Watts | None = Field(
        default=None,
        gt=0,
        description="dynamic: the per-GPU cap on a capped replica (default: budget_w / GPUs)",
    )
    cap_threshold: float = Field(
        default=0.95, gt=0, le=1, description="dynamic: cap above this share of the budget"
    )
    cap_all_threshold: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="dynamic: POLCA's second threshold: above this share of the budget every "
        "replica is capped at once, whatever its priority (None: each round caps only as many "
        "as the estimate needs)",
    )
    release_threshold: float = Field(
        default=0.85, gt=0, le=1, description="dynamic: uncap below this share of the budget"
    )
    reaction_s: Seconds = Field(
        default=1.0, ge=0, description="dynamic: from a decision to the cap (or release) in place"
    )
    window_s: Seconds = Field(
        default=2.0, gt=0, description="dynamic: the draw is averaged over this window"
    )
    sample_s: Seconds = Field(
        default=0.25, gt=0, description="seconds between samples of the fleet's draw"
    )

    @model_validator(mode="after")
    def _thresholds(self) -> PowerBudgetSpec:
        if self.release_threshold >= self.cap_threshold:
            raise ValueError(
                f"release_threshold {self.release_threshold:g} must be below cap_threshold "
                f"{self.cap_threshold:g}"
            )
        if self.cap_all_threshold is not None and self.cap_all_threshold <= self.cap_threshold:
            raise ValueError(
                f"cap_all_threshold {self.cap_all_threshold:g} must be above cap_threshold "
                f"{self.cap_threshold:g}"
            )
        if self.window_s < self.sample_s:
            raise ValueError(
                f"window_s {self.window_s:g} is shorter than sample_s {self.sample_s:g}"
            )
        return self


class Scenario(Frozen):
    name: str
    model: str = Field(description="catalogue id or path to a Hugging Face config.json")
    replicas: list[ReplicaGroupSpec] = Field(min_length=1)
    router: RouterSpec = Field(default_factory=RouterSpec)
    decode_router: RouterSpec | None = Field(
        default=None, description="disaggregated: routes hand-offs over the decode pool (router)"
    )
    kv_transfer: KVTransferSpec | None = Field(
        default=None, description="disaggregated: the prefill -> decode link (default auto)"
    )
    workload: WorkloadSpec
    max_concurrency: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    slo: SLOSpec | None = None
    seed: int = Field(default=0, ge=0)
    outputs: RunOutputs = Field(
        default="all",
        description="the tables `llmsim run --out` writes beside summary.json: summary (none), "
        "requests (requests), steps (requests, steps, KV tiers) or all (those and the "
        "inter-token-latency sample, itl); stream runs without rows (running aggregates and "
        "quantile sketches, memory flat in the requests) and writes summary.json only",
    )
    output_format: OutputFormat = Field(
        default="csv", description="the tables' format: csv, or parquet (needs pyarrow)"
    )
    autoscale: tuple[AutoscaleSpec, ...] | None = Field(
        default=None,
        description="scale replica groups with their load (serving.fleet): one mapping, or a "
        "list of them, one per group",
    )
    kv_pool: KvPoolSpec | None = Field(
        default=None,
        description="the replicas' KV caches pooled: distributed lets a full replica borrow "
        "other replicas' free blocks (Infinite-LLM, serving.kv_pool)",
    )
    power_budget: PowerBudgetSpec | None = Field(
        default=None,
        description="a power budget for the fleet's GPUs, static or dynamic caps (serving.power)",
    )

    @field_validator("autoscale", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        """One autoscale mapping is a list of one."""
        if isinstance(value, Mapping | AutoscaleSpec):
            return (value,)
        if isinstance(value, list | tuple) and not value:
            raise ValueError("an empty list: leave autoscale out, or name a group to scale")
        return value

    def autoscaled(self, group: int) -> AutoscaleSpec | None:
        """The autoscale entry of replica group `group` (None: it has a fixed count)."""
        return next((s for s in self.autoscale or () if s.group == group), None)

    def most_replicas(self) -> list[int]:
        """Each group's replicas at most: its count, or its max_replicas when autoscaled (the
        run builds that many; they may all be on at once)."""
        return [
            scale.max_replicas if (scale := self.autoscaled(g)) is not None else spec.count
            for g, spec in enumerate(self.replicas)
        ]

    @field_validator("replicas")
    @classmethod
    def _roles(cls, groups: list[ReplicaGroupSpec]) -> list[ReplicaGroupSpec]:
        problem = role_problem([g.role for g in groups])
        if problem:
            raise ValueError(problem)
        return groups

    @model_validator(mode="after")
    def _disaggregated_fields(self) -> Scenario:
        if not self.disaggregated:
            given = [f for f in ("kv_transfer", "decode_router") if getattr(self, f) is not None]
            if given:
                raise ValueError(
                    f"{given[0]} applies to disaggregated scenarios only (replica groups with "
                    "role prefill and decode)"
                )
        return self

    @model_validator(mode="after")
    def _fleet_fields(self) -> Scenario:
        groups = len(self.replicas)
        if self.router.kind == "length":
            if self.disaggregated or groups < 2:
                raise ValueError(
                    "the length router needs two or more colocated replica groups (long "
                    "requests to one, the rest to the others)"
                )
            if self.router.long_group >= groups:
                raise ValueError(
                    f"long_group {self.router.long_group} is not a replica group "
                    f"(there are {groups})"
                )
        scaled: set[int] = set()
        for scale in self.autoscale or ():
            if scale.group >= groups:
                raise ValueError(f"group {scale.group} is not a replica group (there are {groups})")
            if scale.group in scaled:
                raise ValueError(f"replica group {scale.group} is autoscaled twice")
            scaled.add(scale.group)
            spec = self.replicas[scale.group]
            if not scale.min_replicas <= spec.count <= scale.max_replicas:
                raise ValueError(
                    f"replica group {scale.group} starts with count {spec.count}, outside "
                    f"min_replicas {scale.min_replicas} .. max_replicas {scale.max_replicas}"
                )
            if spec.data_parallel_size > 1 or spec.pipeline_micro_batching:
                raise ValueError(
                    "an autoscaled group is of plain replicas (no data_parallel_size > 1 or "
                    "pipeline_micro_batching)"
                )
        budget = self.power_budget
        capped = budget is not None and budget.policy != "none"
        if capped and any(
            g.data_parallel_size > 1 or g.pipeline_micro_batching for g in self.replicas
        ):
            raise ValueError(
                "power_budget: caps plain replicas (no data_parallel_size > 1 or "
                "pipeline_micro_batching)"
            )
        return self

    @field_validator("kv_pool")
    @classmethod
    def _pool(cls, pool: KvPoolSpec | None, info: ValidationInfo) -> KvPoolSpec | None:
        groups = info.data.get("replicas")
        if pool is None or pool.mode != "distributed" or groups is None:
            return pool
        split = is_disaggregated([g.role for g in groups])
        if split or info.data.get("autoscale") is not None:
            what = "a disaggregated" if split else "an autoscaled"
            raise ValueError(f"a distributed kv_pool is not built for {what} scenario")
        if sum(g.count for g in groups) < 2:
            raise ValueError("a distributed kv_pool needs two or more replicas (count)")
        return pool

    @property
    def disaggregated(self) -> bool:
        return is_disaggregated([g.role for g in self.replicas])


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML; the files it names are relative to it (see
    `paths_beside`)."""
    path = Path(path)
    return validate(Scenario, paths_beside(read_yaml(path), path.parent), source=str(path))


def paths_beside(data: Any, folder: Path) -> Any:
    """A scenario mapping as read from a file in `folder`, with the files it names made
    absolute: the trace path joined to `folder`, and so a model config, hardware spec, engine
    profile or draft model given as a relative path to a file there (ids, and paths to files
    not there, stay as they are), so the scenario means the same from any working directory
    and written anywhere. What is not shaped as a scenario is left for validation to report."""
    if not isinstance(data, dict):
        return data
    folder = folder.resolve()
    known = {"model": list_models(), "hardware": list_hardware(), "engine": list_engines()}
    out = dict(data)
    if isinstance(out.get("model"), str):
        out["model"] = beside(folder, out["model"], known["model"])
    if isinstance(out.get("replicas"), list):
        out["replicas"] = [_group_beside(g, folder, known) for g in out["replicas"]]
    workload = out.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("dataset"), dict):
        ds = workload["dataset"]
        if ds.get("name") in ("trace", "sharegpt") and isinstance(ds.get("path"), str):
            ds = {**ds, "path": str(folder / ds["path"])}  # an absolute path stays as it is
        if ds.get("name") == "sharegpt" and isinstance(ds.get("tokenizer"), str):
            ds = {**ds, "tokenizer": beside(folder, ds["tokenizer"], ())}
        out["workload"] = {**workload, "dataset": ds}
    return out


def _group_beside(group: Any, folder: Path, known: dict[str, list[str]]) -> Any:
    """One replica group of `paths_beside`; `known`: the catalogue ids by kind."""
    if not isinstance(group, dict):
        return group
    out = dict(group)
    for key in ("hardware", "engine"):
        if isinstance(out.get(key), str):
            out[key] = beside(folder, out[key], known[key])
    spec = out.get("speculative")
    if isinstance(spec, dict) and isinstance(spec.get("model"), str):
        out["speculative"] = {**spec, "model": beside(folder, spec["model"], known["model"])}
    return out


def dataset_beside(ds: DatasetSpec, folder: Path) -> DatasetSpec:
    """`ds` as read from a file in `folder`: a relative trace or ShareGPT path joined to it,
    and a ShareGPT tokenizer found there."""
    if isinstance(ds, ShareGPTDataset) and ds.tokenizer is not None:
        ds = ds.model_copy(update={"tokenizer": beside(folder, ds.tokenizer, ())})
    if not isinstance(ds, TraceDataset | ShareGPTDataset) or ds.path is None:
        return ds
    return ds if ds.path.is_absolute() else ds.model_copy(update={"path": folder / ds.path})


def role_problem(roles: Sequence[str]) -> str:
    """Why replica groups with these roles cannot be served together ('' when they can)."""
    split = [r for r in roles if r != "both"]
    if not split:
        return ""
    if len(split) < len(roles):
        return (
            f"group {roles.index('both')} has role 'both' (colocated) among prefill/decode "
            "groups: a deployment is colocated or disaggregated"
        )
    missing = [r for r in ("prefill", "decode") if r not in split]
    if missing:
        return f"a disaggregated deployment needs a {missing[0]} group (role: {missing[0]})"
    return ""


def is_disaggregated(roles: Sequence[str]) -> bool:
    return any(r != "both" for r in roles)
