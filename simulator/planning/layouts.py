"""The candidate layouts of a plan, the traffic each is tried with, and what is known of a
layout before any simulation (memory fit, latency floors, capacity ceiling)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Protocol

import numpy as np

from simulator.costmodel.deployment import Deployment
from simulator.costmodel.memory import MemoryPlan
from simulator.errors import SpecError
from simulator.metrics.bands import NO_MARGIN, Margin
from simulator.planning.bounds import LatencyFloors, capacity_ceiling, hopeless, latency_floors
from simulator.planning.fleet import FleetOption
from simulator.planning.margins import plan_margin
from simulator.planning.search import SearchOutcome, Verdict
from simulator.planning.spec import HardwareCandidate, PlanSpec, PlanWorkload
from simulator.runs.runner import build_group
from simulator.serving.steptime import StepTimer
from simulator.specs import ModelSpec, load_hardware
from simulator.specs.deployment import Quantization
from simulator.specs.scenario import ReplicaGroupSpec, Scenario, SLOSpec
from simulator.specs.serving import SchedulerSpec
from simulator.specs.workload import WorkloadSpec
from simulator.workload.requests import RequestTable, generate_requests


@dataclass(frozen=True)
class Layout:
    """One replica's shape: device type, engine, precision and parallelism."""

    hardware: str
    engine: str
    quantization: Quantization | None
    kv_cache_dtype: str
    tp: int
    pp: int
    knobs: tuple[tuple[str, Any], ...] = ()  # scheduler settings searched (spec.SchedulerSearch)
    cp: int = 1  # context-parallel ranks of tp x pp GPUs

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def key(self) -> str:
        parts = [self.hardware, self.engine, self.quantization or "none", f"tp{self.tp}"]
        parts += [f"pp{self.pp}"] if self.pp > 1 else []
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"kv-{self.kv_cache_dtype}"] if self.kv_cache_dtype != "auto" else []
        parts += [_knob_label(name, value) for name, value in self.knobs]
        return "/".join(parts)

    def replica_group(self, spec: PlanSpec, *, count: int = 1) -> ReplicaGroupSpec:
        c = spec.candidates
        price = next((h.usd_per_hour for h in c.hardware if h.id == self.hardware), None)
        return ReplicaGroupSpec(
            hardware=self.hardware,
            engine=self.engine,
            count=count,
            tensor_parallel_size=self.tp,
            pipeline_parallel_size=self.pp,
            context_parallel_size=self.cp,
            dtype=c.dtype,
            quantization=self.quantization,
            kv_cache_dtype=self.kv_cache_dtype,
            enforce_eager=c.enforce_eager,
            gpu_memory_utilization=c.gpu_memory_utilization,
            scheduler=c.scheduler.model_copy(update=dict(self.knobs)),
            usd_per_gpu_hour=price,
        )


_KNOB_LABELS = {"max_num_batched_tokens": "tokens{}", "max_num_seqs": "seqs{}"}


def _knob_label(name: str, value: Any) -> str:
    """A searched scheduler setting in a layout's key: tokens2048, seqs256, chunked/unchunked."""
    if name == "chunked_prefill":
        return "chunked" if value else "unchunked"
    return _KNOB_LABELS[name].format(value)


def enumerate_layouts(spec: PlanSpec) -> list[Layout]:
    """Every combination of the plan's candidate lists (and scheduler settings searched), in
    the plan's order."""
    c = spec.candidates
    return [
        Layout(hw.id, engine, quant, kv, tp, pp, knobs, cp)
        for hw, engine, quant, kv, tp, pp, cp, knobs in itertools.product(
            c.hardware,
            c.engine,
            c.quantization,
            c.kv_cache_dtype,
            c.tensor_parallel_size,
            c.pipeline_parallel_size,
            c.context_parallel_size,
            c.scheduler_search.combinations(),
        )
    ]


def price_per_gpu_hour(entry: HardwareCandidate) -> float:
    """The plan's override, else the hardware spec's on-demand price."""
    return entry.usd_per_hour or load_hardware(entry.id).price.usd_per_hour


def scenario(
    spec: PlanSpec, groups: list[ReplicaGroupSpec], workload: WorkloadSpec, *, name: str
) -> Scenario:
    """The `llmsim run` scenario of one simulation of the plan (with prefill/decode groups:
    the plan's KV transfer and decode router)."""
    thresholds = spec.slo.thresholds_ms()
    split = any(g.role != "both" for g in groups)
    d = spec.disaggregated
    return Scenario(
        name=name,
        model=spec.model,
        replicas=groups,
        router=spec.router,
        decode_router=d.decode_router if split else None,
        kv_transfer=d.kv_transfer if split else None,
        workload=workload,
        slo=SLOSpec(**{f"{m}_ms": v for m, v in thresholds.items()}) if thresholds else None,
        seed=spec.seed,
    )


@dataclass(frozen=True)
class Traffic:
    """The plan's workload: its target rate, and the workload of n requests at any rate (the
    same requests at every rate; a trace replay is sped up or slowed down to the rate)."""

    workload: PlanWorkload
    seed: int
    max_rows: int | None  # a replay's rows (the first num_prompts, or all)

    @cached_property
    def target_rate(self) -> float:
        if self.max_rows is None:
            assert self.workload.request_rate is not None  # PlanWorkload guarantees it
            return self.workload.request_rate
        span = self._span(self.max_rows) * self.workload.time_scale
        return self.max_rows / span

    def requests(self, num_prompts: int) -> RequestTable:
        """The lengths of `num_prompts` requests (arrivals at one request per second)."""
        return generate_requests(self.at(num_prompts, 1.0), rng=np.random.default_rng(self.seed))

    def at(self, num_prompts: int, rate: float) -> WorkloadSpec:
        if self.max_rows is None:
            return self.workload.sample(num_prompts=num_prompts, request_rate=rate)
        scale = num_prompts / (self._span(num_prompts) * rate)
        base = self.workload.sample(num_prompts=num_prompts, request_rate=rate)
        return base.model_copy(update={"time_scale": scale})

    def clamp(self, num_prompts: int) -> int:
        return num_prompts if self.max_rows is None else min(num_prompts, self.max_rows)

    def _span(self, num_prompts: int) -> float:
        """Seconds from the first to the last of the first `num_prompts` rows, at scale 1."""
        base = self.workload.sample(num_prompts=num_prompts, request_rate=1.0)
        replay = base.model_copy(update={"time_scale": 1.0})
        arrival = generate_requests(replay, rng=np.random.default_rng(self.seed)).arrival_s
        if len(arrival) < 2 or arrival[-1] <= 0:
            raise SpecError(
                f"the first {num_prompts} rows of the trace span no time: no rate to replay at",
                field="workload",
            )
        return float(arrival[-1])


def traffic(spec: PlanSpec) -> Traffic:
    wl = spec.workload
    if wl.arrival != "trace":
        return Traffic(wl, spec.seed, None)
    all_rows = generate_requests(
        wl.sample(num_prompts=wl.num_prompts, request_rate=1.0),
        rng=np.random.default_rng(spec.seed),
    )
    return Traffic(wl, spec.seed, len(all_rows))


@dataclass(frozen=True)
class Prepared:
    """A layout that fits, with its analytical bounds on the requests it will be tried with
    (as one colocated replica), and its step timer and memory plan."""

    layout: Layout
    deployment: Deployment
    scheduler: SchedulerSpec
    usd_per_gpu_hour: float
    num_prompts: int
    ceiling: float
    floors: LatencyFloors
    precision: str
    timer: StepTimer
    memory: MemoryPlan
    margin: Margin = NO_MARGIN  # how much slower it is judged to run (planning.margins)

    @property
    def usd_per_hour(self) -> float:
        return self.usd_per_gpu_hour * self.layout.gpus

    @property
    def key(self) -> str:
        return self.layout.key

    @property
    def gpus(self) -> int:
        return self.layout.gpus

    @property
    def gpus_by_hardware(self) -> tuple[tuple[str, int], ...]:
        return ((self.layout.hardware, self.layout.gpus),)

    def groups(self, spec: PlanSpec, *, count: int = 1) -> list[ReplicaGroupSpec]:
        """The scenario's replica groups for `count` replicas."""
        return [self.layout.replica_group(spec, count=count)]

    def pool_ceiling(self, requests: RequestTable, *, phase: Literal["prefill", "decode"]) -> float:
        """Requests/s one replica cannot exceed doing only `phase` of `requests` (a replica of
        a disaggregated pool; `bounds.capacity_ceiling`)."""
        return capacity_ceiling(
            self.deployment,
            self.timer,
            self.memory,
            prompt_len=requests.prompt_len,
            output_len=requests.output_len,
            scheduler=self.scheduler,
            phase=phase,
        )


def prepare(spec: PlanSpec, layout: Layout, *, model: ModelSpec, flow: Traffic) -> Prepared | str:
    """The layout's bounds, or why it is pruned before any simulation (it does not fit, is
    not a valid layout for this model or engine, or its latency floors miss an SLO)."""
    got = measure(spec, layout, model=model, flow=flow)
    if isinstance(got, str):
        return got
    reason = hopeless(
        got.floors, spec.slo, margin=spec.search.prescreen_margin, scale=got.margin.scale()
    )
    return f"hopeless: {reason}" if reason else got


def measure(spec: PlanSpec, layout: Layout, *, model: ModelSpec, flow: Traffic) -> Prepared | str:
    """The layout's bounds as one colocated replica, or why it cannot run at all (it does not
    fit, or is not a valid layout for this model or engine)."""
    c, search = spec.candidates, spec.search
    try:
        one = layout.replica_group(spec)
        wide = flow.requests(flow.clamp(search.max_prompts))
        sampling = spec.workload.sampling
        group, memory, dep = build_group(model, one, wide, sampling=sampling)
        sched = group.scheduler
        ceiling = capacity_ceiling(
            dep,
            group.step_timer,
            memory,
            prompt_len=wide.prompt_len,
            output_len=wide.output_len,
            scheduler=sched,
        )
        # About duration_s of arrivals at half the ceiling, where the search starts.
        wanted = math.ceil(search.duration_s * ceiling / 2)
        n = flow.clamp(min(max(wanted, search.min_prompts), search.max_prompts))
        sample = flow.requests(n)
        # the timer the simulations will use
        group, _, _ = build_group(model, one, sample, sampling=sampling)
    except SpecError as exc:  # not a valid layout here, or it does not fit
        return exc.reason
    floors = latency_floors(
        group.step_timer,
        prompt_len=sample.prompt_len,
        output_len=sample.output_len,
        scheduler=sched,
    )
    entry = next(h for h in c.hardware if h.id == layout.hardware)
    prec = dep.precision
    label = f"{prec.weights} weight-only" if prec.weight_only else prec.weights
    price = price_per_gpu_hour(entry)
    margin = plan_margin(spec, [dep])
    return Prepared(
        layout, dep, sched, price, n, ceiling, floors, label, group.step_timer, memory, margin
    )


class Candidate(Protocol):
    """What the search and the fleet need of a candidate: a colocated layout (`Prepared`) or a
    disaggregated unit (`planning.units.Unit`), as one "replica" of a fleet."""

    @property
    def key(self) -> str: ...
    @property
    def gpus(self) -> int: ...
    @property
    def usd_per_hour(self) -> float: ...
    @property
    def usd_per_gpu_hour(self) -> float: ...
    @property
    def ceiling(self) -> float: ...
    @property
    def num_prompts(self) -> int: ...
    @property
    def precision(self) -> str: ...
    @property
    def gpus_by_hardware(self) -> tuple[tuple[str, int], ...]: ...
    @property
    def margin(self) -> Margin: ...
    def groups(self, spec: PlanSpec, *, count: int = 1) -> list[ReplicaGroupSpec]: ...


@dataclass(frozen=True)
class Searched:
    """A candidate after its rate search: the outcome, the verdict and energy per output token
    at the max rate (None when no rate passed), and one row per simulation."""

    prepared: Candidate
    outcome: SearchOutcome
    verdict: Verdict | None
    energy_j: float | None
    probes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def option(self) -> FleetOption:
        p = self.prepared
        return FleetOption(
            key=p.key,
            hardware=p.gpus_by_hardware[0][0],
            gpus_per_replica=p.gpus,
            rate=self.outcome.max_rate,
            usd_per_hour=p.usd_per_hour,
            gpus_by_hardware=p.gpus_by_hardware,
        )
