"""The plan file of `llmsim plan`: what to serve, how much of it, under which SLOs, on what.

A plan names one model, a workload with a target request rate (or a trace whose own rate is
the target), latency SLOs as percentile targets plus an optional goodput share, and the
candidate deployments: hardware (with optional GPU limits and price overrides) x engines x
quantizations x KV-cache dtypes x TP x PP, with a range of replicas (DP) per layout. The JSON
schema is `PlanSpec.model_json_schema()` (`llmsim plan --schema`); `scenarios/plan_chat.yaml`
is an example. `mode` says what is planned: colocated serving (prefill and decode on the same
replicas), disaggregated units (a prefill pool and a decode pool of the candidate layouts,
`disaggregated:`), or any of both.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator

from simulator.errors import SpecError
from simulator.specs import load_engine, load_hardware, load_model
from simulator.specs._base import MAX_PLAN_RATE, MAX_REQUESTS, MAX_TIME_SCALE, MAX_TOKENS, Frozen
from simulator.specs.deployment import Quantization
from simulator.specs.loader import (
    beside,
    list_engines,
    list_hardware,
    list_models,
    read_yaml,
    validate,
)
from simulator.specs.scenario import SchedulerOverrides, dataset_beside
from simulator.specs.serving import KVTransferSpec, RouterSpec
from simulator.specs.workload import DatasetSpec, EosModel, SamplingSpec, WorkloadSpec

SLO_METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # what vLLM's --goodput accepts


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


def _bare_target(value: Any) -> Any:
    """`tpot_ms: 50` is short for `tpot_ms: {p: 99, max: 50}`."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"max": value}
    return value


class PercentileTarget(Frozen):
    """The p-th percentile of a latency, over the requests of a run, must not exceed `max` ms.
    `max` is also the per-request threshold when goodput is counted."""

    p: float = Field(default=99.0, gt=0, le=100)
    max: float = Field(gt=0, allow_inf_nan=False, description="ms")


Target = Annotated[PercentileTarget, BeforeValidator(_bare_target)]


class PlanSLO(Frozen):
    """Latency targets (ms) and the share of requests that must meet all per-request ones."""

    ttft_ms: Target | None = None
    tpot_ms: Target | None = None
    itl_ms: Target | None = None
    e2el_ms: Target | None = None
    goodput: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="share of requests meeting every per-request target (ttft, tpot, e2el), "
        "counted as vLLM's --goodput counts them",
    )

    @model_validator(mode="after")
    def _goodput_needs_thresholds(self) -> PlanSLO:
        if self.goodput is not None and not self.thresholds_ms():
            raise ValueError("goodput needs at least one of ttft_ms, tpot_ms, e2el_ms")
        return self

    def targets(self) -> dict[str, PercentileTarget]:
        """Metric -> its percentile target, in SLO_METRICS order, only those given."""
        given = {m: getattr(self, f"{m}_ms") for m in SLO_METRICS}
        return {m: t for m, t in given.items() if t is not None}

    def thresholds_ms(self) -> dict[str, float]:
        """Per-request thresholds for goodput: the `max` of ttft, tpot and e2el where given."""
        return {m: t.max for m, t in self.targets().items() if m in GOODPUT_METRICS}


def _hardware_entry(value: Any) -> Any:
    return {"id": value} if isinstance(value, str) else value


class HardwareCandidate(Frozen):
    """One device type: `id` (or a path to a spec YAML), how many GPUs of it can be had, and the
    price per GPU-hour when it differs from the spec's `price.usd_per_hour`."""

    id: str
    max_gpus: int | None = Field(default=None, ge=1)
    usd_per_hour: float | None = Field(default=None, gt=0, allow_inf_nan=False)


HardwareEntry = Annotated[HardwareCandidate, BeforeValidator(_hardware_entry)]


class ReplicaRange(Frozen):
    """How many replicas of one layout a fleet may hold, when it holds any (data parallelism)."""

    min: int = Field(default=1, ge=1)
    max: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaRange:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max {self.max} is below min {self.min}")
        return self


def _replica_range(value: Any) -> Any:
    """An int is the most replicas of one layout."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"max": value}
    return value


def _quantization(value: Any) -> Any:
    return [None if q in (None, "none") else q for q in _as_list(value)]


PositiveInt = Annotated[int, Field(ge=1)]


def _native_only() -> list[Quantization | None]:
    return [None]


class SchedulerSearch(Frozen):
    """Scheduler knobs searched as part of the layout (every combination of the lists given, with
    the other dimensions); one left out takes `candidates.scheduler`'s value or the engine's
    default. Where a plan's answer turns on them (the chunk size decides whether long prompts
    stall decodes), searching them compares each layout at its best setting."""

    max_num_batched_tokens: Annotated[list[PositiveInt], BeforeValidator(_as_list)] | None = Field(
        default=None, min_length=1, description="the chunked-prefill token budget per step"
    )
    max_num_seqs: Annotated[list[PositiveInt], BeforeValidator(_as_list)] | None = Field(
        default=None, min_length=1, description="most sequences running at once"
    )
    chunked_prefill: Annotated[list[bool], BeforeValidator(_as_list)] | None = Field(
        default=None, min_length=1, description="chunked prefill on, off or both"
    )

    def combinations(self) -> list[tuple[tuple[str, Any], ...]]:
        """Each setting to try, as (knob, value) pairs in field order; one empty setting when
        nothing is searched."""
        given = [(k, v) for k, v in self.model_dump().items() if v is not None]
        names = [k for k, _ in given]
        return [
            tuple(zip(names, values, strict=True))
            for values in itertools.product(*(v for _, v in given))
        ]


class Candidates(Frozen):
    """The layouts to consider: every combination of the lists (each key takes a value or a
    list of values). Knobs outside the lists apply to every layout."""

    hardware: Annotated[list[HardwareEntry], BeforeValidator(_as_list)] = Field(min_length=1)
    engine: Annotated[list[str], BeforeValidator(_as_list)] = Field(
        default_factory=lambda: ["vllm"], min_length=1
    )
    quantization: Annotated[list[Quantization | None], BeforeValidator(_quantization)] = Field(
        default_factory=_native_only, min_length=1, description="none (or null): native dtype"
    )
    kv_cache_dtype: Annotated[list[str], BeforeValidator(_as_list)] = Field(
        default_factory=lambda: ["auto"], min_length=1
    )
    tensor_parallel_size: Annotated[list[PositiveInt], BeforeValidator(_as_list)] = Field(
        default_factory=lambda: [1], min_length=1
    )
    pipeline_parallel_size: Annotated[list[PositiveInt], BeforeValidator(_as_list)] = Field(
        default_factory=lambda: [1], min_length=1
    )
    context_parallel_size: Annotated[list[PositiveInt], BeforeValidator(_as_list)] = Field(
        default_factory=lambda: [1],
        min_length=1,
        description="context-parallel ranks per replica to try (GPUs = tp x pp x cp)",
    )
    data_parallel_size: Annotated[ReplicaRange, BeforeValidator(_replica_range)] = Field(
        default_factory=ReplicaRange
    )
    dtype: str = "auto"
    enforce_eager: bool = False
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    scheduler: SchedulerOverrides = Field(default_factory=SchedulerOverrides)
    scheduler_search: SchedulerSearch = Field(default_factory=SchedulerSearch)

    @field_validator("hardware")
    @classmethod
    def _distinct_hardware(cls, entries: list[HardwareCandidate]) -> list[HardwareCandidate]:
        ids = [e.id for e in entries]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(f"hardware listed twice: {', '.join(repeated)}")
        return entries


class PlanWorkload(Frozen):
    """What arrives. `request_rate` is the target the fleet must sustain; with `arrival: trace`
    the target is the trace's own mean rate (its first `num_prompts` rows, all by default,
    replayed at `time_scale`). How many requests each simulation sends is the search's choice
    (`search.duration_s`), so `num_prompts` is for traces only."""

    dataset: DatasetSpec
    request_rate: float | None = Field(default=None, gt=0, le=MAX_PLAN_RATE)
    burstiness: float = Field(default=1.0, gt=0)
    arrival: Literal["poisson_gamma", "constant", "trace"] = "poisson_gamma"
    time_scale: float = Field(default=1.0, gt=0, le=MAX_TIME_SCALE)
    num_prompts: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    max_input_len: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    max_output_len: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)  # greedy unless set
    ignore_eos: bool | None = None  # as WorkloadSpec's: null, ShareGPT outputs stop at EOS
    eos_model: EosModel = "instruct"

    @model_validator(mode="after")
    def _consistent(self) -> PlanWorkload:
        if self.arrival == "trace":
            if self.request_rate is not None:
                raise ValueError(
                    "request_rate does not apply to arrival 'trace': the trace's own rate is "
                    "the target (use time_scale to replay it faster or slower)"
                )
        else:
            if self.request_rate is None:
                raise ValueError("request_rate (the target, requests/s) is required")
            if self.num_prompts is not None:
                raise ValueError(
                    "num_prompts applies to arrival 'trace' only; the search picks how many "
                    "requests to simulate (search.duration_s)"
                )
        try:  # WorkloadSpec's own checks (e.g. arrival 'trace' needs timestamps)
            self.sample(num_prompts=self.num_prompts or 1, request_rate=1.0)
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return self

    def sample(self, *, num_prompts: int | None, request_rate: float) -> WorkloadSpec:
        """The scenario workload of `num_prompts` requests at `request_rate` per second (for a
        trace replay: at the time scale that gives that rate, see `replay_scale`)."""
        trace = self.arrival == "trace"
        return WorkloadSpec(
            dataset=self.dataset,
            num_prompts=num_prompts,
            request_rate=math.inf if trace else request_rate,
            burstiness=self.burstiness,
            arrival=self.arrival,
            time_scale=self.time_scale if trace else 1.0,
            max_input_len=self.max_input_len,
            max_output_len=self.max_output_len,
            sampling=self.sampling,
            ignore_eos=self.ignore_eos,
            eos_model=self.eos_model,
        )


class SearchSpec(Frozen):
    """How hard the planner looks. Each layout's simulations send about `duration_s` seconds of
    arrivals at the rate its search starts from, half its capacity ceiling (at least
    `min_prompts`, at most `max_prompts` requests; the same requests at every rate tried,
    only their arrival times scaled). The fleet's check sends duration_s at the target (at
    most 2 x max_prompts)."""

    duration_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    min_prompts: int = Field(default=200, ge=10)
    max_prompts: int = Field(default=1200, ge=10)
    tolerance: float = Field(
        default=0.05, gt=0, le=1, description="stop when the bracket is within this fraction"
    )
    max_probes: int = Field(default=8, ge=1, description="simulations per layout, at most")
    max_queueing_ms: float = Field(
        default=2000.0,
        gt=0,
        description="a rate is sustained only if the last quarter of arrivals waits at most "
        "this long on average for its first step (a queue that keeps growing fails it)",
    )
    prescreen_margin: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="prune a layout on its analytical latency floor only when the floor misses "
        "a target by more than this fraction (room for the step-time tables' interpolation)",
    )
    prune_dominated: bool = Field(
        default=True,
        description="skip layouts that cannot be in the cheapest fleet (costlier than enough "
        "replicas of a layout already found that cover any rate they could reach); they "
        "are then missing from the Pareto frontier",
    )
    verify_fleet: bool = Field(
        default=True, description="simulate the chosen fleet at the target rate behind the router"
    )
    seed_check: Literal["fleet", "all"] = Field(
        default="fleet",
        description="whose rate is simulated on every seed: the layouts a proposed fleet uses "
        "(where the seeds decide the answer), or every layout searched (the table's rates all "
        "checked, at a few more simulations per layout)",
    )
    band_margin: bool = Field(
        default=True,
        description="judge every candidate at the pessimistic edge of its error band at the "
        "plan's confidence (false: at the point prediction, as the simulator predicts it)",
    )

    @model_validator(mode="after")
    def _ordered(self) -> SearchSpec:
        if self.max_prompts < self.min_prompts:
            raise ValueError(f"max_prompts {self.max_prompts} is below min_prompts")
        return self


class DisaggregatedCandidates(Frozen):
    """Disaggregated units: `prefill_replicas` replicas of one candidate layout as the prefill
    pool and `decode_replicas` of one (the same or another) as the decode pool, for every pair
    of layouts with the same KV-cache dtype and every count in the lists (ratios in lowest
    terms: 2 + 2 is two 1 + 1 units). A fleet is whole units."""

    prefill_replicas: Annotated[list[PositiveInt], BeforeValidator(_as_list)] = Field(
        default_factory=lambda: [1, 2], min_length=1
    )
    decode_replicas: Annotated[list[PositiveInt], BeforeValidator(_as_list)] = Field(
        default_factory=lambda: [1, 2], min_length=1
    )
    kv_transfer: KVTransferSpec = Field(default_factory=KVTransferSpec)
    decode_router: RouterSpec | None = Field(
        default=None, description="routes hand-offs over the decode pool (default: router)"
    )
    max_units: int = Field(
        default=24,
        ge=1,
        description="units searched at most, cheapest capacity ceiling per dollar first; the "
        "others are listed as pruned",
    )


class PlanSpec(Frozen):
    name: str = "plan"
    model: str = Field(description="catalogue id or path to a Hugging Face config.json")
    mode: Literal["colocated", "disaggregated", "any"] = Field(
        default="colocated",
        description="colocated replicas, disaggregated prefill/decode units, or any of both",
    )
    workload: PlanWorkload
    slo: PlanSLO = Field(default_factory=PlanSLO)
    candidates: Candidates
    router: RouterSpec = Field(
        default_factory=lambda: RouterSpec(kind="least_kv"),
        description="for the fleet's check; least_kv splits a mixed fleet by KV capacity",
    )
    search: SearchSpec = Field(default_factory=SearchSpec)
    disaggregated: DisaggregatedCandidates = Field(default_factory=DisaggregatedCandidates)
    pareto_metric: Literal["ttft", "tpot", "itl", "e2el"] | None = Field(
        default=None,
        description="latency of the cost/latency frontier (None: the first SLO among tpot, "
        "itl, ttft, e2el; its SLO percentile, else p99)",
    )
    seed: int = Field(default=0, ge=0)
    confidence: float = Field(
        default=0.9,
        gt=0.5,
        lt=1,
        description="the chosen fleet must meet the SLOs with the hardware as slow as the "
        "upper end of its error band at this one-sided confidence (docs/error-bands.md), and "
        "in this share of the seeds simulated",
    )
    seeds: int = Field(
        default=5,
        ge=1,
        le=100,
        description="workload seeds (plan.seed, seed + 1, ...) the fleet and the sustainable "
        "rate of each layout in it are simulated with",
    )
    single_layout: bool = Field(
        default=False, description="fleets of one replica shape only (no mix of layouts)"
    )


def load_plan(path: str | Path) -> PlanSpec:
    """Read and validate a plan YAML: its fields, then every id it names (model, hardware,
    engines). A trace path inside it is relative to the file, and so is a model config,
    hardware spec or engine profile given as a relative path to a file there."""
    path = Path(path)
    folder = path.resolve().parent  # so the plan means the same from any working directory
    spec = validate(PlanSpec, read_yaml(path), source=str(path))
    cands, known_hw, known_engines = spec.candidates, list_hardware(), list_engines()
    hardware = [h.model_copy(update={"id": beside(folder, h.id, known_hw)}) for h in cands.hardware]
    engines = [beside(folder, e, known_engines) for e in cands.engine]
    update = {
        "model": beside(folder, spec.model, list_models()),
        "workload": spec.workload.model_copy(
            update={"dataset": dataset_beside(spec.workload.dataset, folder)}
        ),
        "candidates": cands.model_copy(update={"hardware": hardware, "engine": engines}),
    }
    spec = spec.model_copy(update=update)
    check_ids(spec, source=str(path))
    return spec


def check_ids(spec: PlanSpec, *, source: str) -> None:
    """Raise SpecError naming the plan's field if an id does not resolve."""
    checks: list[tuple[str, Any, str]] = [("model", load_model, spec.model)]
    checks += [
        (f"candidates.hardware.{i}.id", load_hardware, h.id)
        for i, h in enumerate(spec.candidates.hardware)
    ]
    checks += [
        (f"candidates.engine.{i}", load_engine, e) for i, e in enumerate(spec.candidates.engine)
    ]
    for field, load, value in checks:
        try:
            load(value)
        except SpecError as exc:
            raise SpecError(exc.line(), source=source, field=field) from None


def with_overrides(spec: PlanSpec, **overrides: Any) -> PlanSpec:
    """`spec` with the given top-level fields replaced (None: keep the plan's), validated as
    the plan file's own would be; SpecError naming the command-line flag otherwise."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if not given:
        return spec
    try:
        return PlanSpec.model_validate(spec.model_dump() | given)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else next(iter(given))
        raise SpecError(
            error["msg"].removeprefix("Value error, "), field=f"--{name.replace('_', '-')}"
        ) from None
