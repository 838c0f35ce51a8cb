"""Run scenarios in memory: `run` (a whole what-if), and the bench flavours built on it.
Saving results is a separate step (`save_run`)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.costmodel.bound import HardwareBound, hardware_bound
from simulator.costmodel.deployment import Deployment, deployment
from simulator.costmodel.memory import MemoryPlan
from simulator.errors import SpecError, naming
from simulator.metrics import bands
from simulator.metrics.stream import StreamRecorder, StreamSummary
from simulator.metrics.summary import (
    PERCENTILES,
    completed_requests,
    kv_tier_summary,
    serve_summary,
    slo_attainment,
    throughput_summary,
)
from simulator.outputs import atomic_folder
from simulator.runs import sizes
from simulator.runs.energy import EnergyAccumulator, GroupAccount, fleet_energy
from simulator.runs.power_budget import (
    capped_deployments,
    power_budget,
    power_summary,
    with_power_budget,
)
from simulator.serving.cluster import (
    ReplicaGroup,
    SimResult,
    default_scheduler,
    replica_group,
    serve,
)
from simulator.serving.disagg import pool_summary, prefill_view, serve_scenario
from simulator.serving.fleet import FleetScaling
from simulator.serving.kv_pool import pool_plan
from simulator.serving.loops import engine_loop, expert_layout
from simulator.serving.power import capped_steps
from simulator.specs import ModelSpec, load_hardware, load_model
from simulator.specs.engine import Entrypoint
from simulator.specs.engine_args import EngineArgs
from simulator.specs.hardware import with_power_cap
from simulator.specs.loader import validate
from simulator.specs.scenario import (
    OutputFormat,
    ReplicaGroupSpec,
    RunOutputs,
    Scenario,
    load_scenario,
)
from simulator.specs.workload import OFFLINE_BENCH_SAMPLING, SamplingSpec, WorkloadSpec
from simulator.workload.requests import RequestTable, generate_requests

# The tables `save_run` may write and the least `outputs` level that writes each (levels in
# order: each writes what the one before it does, and more); kv_tiers only with KV tiers,
# fleet (the replica counts over time) only with an autoscaled group.
OUTPUT_LEVELS: tuple[RunOutputs, ...] = ("summary", "requests", "steps", "all")
# "stream" runs without rows (`run`): it writes what "summary" does
TABLE_LEVEL: dict[str, RunOutputs] = {
    "requests": "requests", "steps": "steps", "kv_tiers": "steps", "itl": "all",
    "fleet": "requests", "power": "requests",
}  # fmt: skip
TABLE_SUFFIX: dict[OutputFormat, str] = {"csv": ".csv", "parquet": ".parquet"}
# What `save_run` writes, beside its manifest.json.
RUN_FILES = (
    "summary.json",
    *(table + suffix for table in TABLE_LEVEL for suffix in TABLE_SUFFIX.values()),
    "scenario.json",
    "memory.json",
)


@dataclass(frozen=True)
class RunResult:
    """A scenario's outcome: the simulation's rows, the vLLM-style summary, memory plans, the
    resolved deployment of each replica group, and energy and cost (`energy_summary`)."""

    scenario: Scenario
    sim: SimResult
    summary: dict[str, Any]
    memory: list[MemoryPlan]
    deployments: list[Deployment] = field(default_factory=list)
    energy: dict[str, float] = field(default_factory=dict)
    streamed_steps: int | None = None  # a streaming run's step count (it keeps no rows)

    @property
    def simulated_steps(self) -> int:
        """Engine steps simulated (a streaming run counts them; a full one has their rows)."""
        return len(self.sim.steps) if self.streamed_steps is None else self.streamed_steps

    def as_json(
        self, *, interval_coverage: float | None = bands.DEFAULT_COVERAGE
    ) -> dict[str, Any]:
        """The summary and the run's extras, then the error bands at `interval_coverage`
        (`intervals`; None: without them)."""
        data = {
            "scenario": self.scenario.name,
            **self.summary,
            "kv_cache_peak_fraction": self.sim.kv_peak_fraction,
            "num_replicas": self.sim.num_replicas,
            "simulated_steps": self.simulated_steps,
            "wall_time_s": self.sim.wall_s,
            **self.energy,
        }
        if interval_coverage is not None:
            data |= self.intervals(coverage=interval_coverage)
        return data

    def band_targets(self) -> list[bands.Target]:
        """The hardware and engine of each replica group, as the error bands look them up."""
        return [bands.deployment_target(d) for d in self.deployments]

    def intervals(self, *, coverage: float = bands.DEFAULT_COVERAGE) -> dict[str, Any]:
        """The error bands of the serve summary's latencies (mean, median, percentiles of
        TTFT, TPOT, ITL, E2EL) and, when every request arrives at t=0, throughputs
        (`K_interval`, `interval_coverage`, `interval_source`; metrics.bands.serve_intervals),
        or `interval_note` where no validation data backs every replica group's hardware and
        engine, or the run is disaggregated (no validation rows)."""
        note = None
        if self.scenario.disaggregated:
            note = "no end-to-end validation rows for disaggregated serving"
        workload = self.scenario.workload
        all_at_once = (
            math.isinf(workload.request_rate)
            and workload.arrival != "trace"
            and workload.ramp_up is None
            and workload.sessions is None
        )
        return bands.serve_intervals(
            self.summary,
            targets=self.band_targets(),
            all_at_once=all_at_once,
            coverage=coverage,
            note=note,
        )


def group_deployment(model: ModelSpec, spec: ReplicaGroupSpec) -> Deployment:
    """The resolved deployment of a replica group (its hardware under its power cap)."""
    hardware = load_hardware(spec.hardware)
    if spec.power_cap_w is not None:
        hardware = with_power_cap(hardware, spec.power_cap_w)
    return deployment(
        model=model,
        hardware=hardware,
        engine=spec.engine,
        tensor_parallel_size=spec.tensor_parallel_size,
        pipeline_parallel_size=spec.pipeline_parallel_size,
        context_parallel_size=spec.context_parallel_size,
        **expert_layout(model, spec),  # data, expert parallel sizes; expert load imbalance
        dtype=spec.dtype,
        quantization=spec.quantization,
        kv_cache_dtype=spec.kv_cache_dtype,
        kv_budget=spec.kv_budget,
        kv_eviction=spec.kv_eviction,
        shadowkv=spec.shadowkv,
        swiftkv=spec.swiftkv,
        cpu_offload_gb=spec.cpu_offload_gb,
        offload=spec.offload,
        expert_offload=spec.expert_offload,
        entrypoint=spec.entrypoint,
        async_scheduling=spec.async_scheduling,
        host_cpu=spec.host_cpu,
        overlap_tp_comm=spec.overlap_tp_comm,
        nano_batches=spec.nano_batches,
    )


def build_group(
    model: ModelSpec,
    spec: ReplicaGroupSpec,
    requests: RequestTable,
    *,
    sampling: SamplingSpec | None = None,
    pooled: bool = False,
) -> tuple[ReplicaGroup, MemoryPlan, Deployment]:
    """The replicas a scenario's group describes, sized for `requests`: their group (with its
    engine loop), memory plan and deployment. `sampling`: how the requests sample (greedy,
    no penalties by default): a top-p / top-k filter and penalties cost the engine.
    `pooled`: in a distributed KV pool (a request may outgrow one replica's cache)."""
    dep = group_deployment(model, spec)
    overrides = spec.scheduler.model_dump()
    max_model_len = dep.model.served_length(spec.max_model_len)
    scheduler = default_scheduler(
        dep.engine, max_model_len=max_model_len, model=dep.model, **overrides
    )
    group, plan = replica_group(
        dep,
        requests=requests,
        scheduler=scheduler,
        enforce_eager=spec.enforce_eager,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        swap_space_gib=spec.swap_space_gib,
        enable_prefix_caching=spec.prefix_caching,
        speculative=spec.speculative,
        kv_offload=spec.kv_offload,
        sampling=sampling,
        max_model_len=spec.max_model_len,
        lora=spec.lora,
        pooled=pooled,
    )
    group = engine_loop(group, spec=spec, dep=dep)
    if spec.pd_partition is not None:
        from simulator.serving.pd_partition import with_pd_partition
        from simulator.specs.serving import parse_pd_partition

        longest = int((requests.prompt_len + requests.output_len).max()) if len(requests) else 1
        group = with_pd_partition(
            group,
            dep,
            parse_pd_partition(spec.pd_partition),
            max_context=longest,
            enforce_eager=spec.enforce_eager,
            sampling=sampling,
            offload=plan.offload,
        )
    return group, plan, dep


def partitioned(scenario: Scenario, pd_partition: str | None) -> Scenario:
    """`scenario` with every colocated (`role: both`) group split into prefill and decode
    streams as `pd_partition` says (None: unchanged); SpecError for a bad split or a
    scenario without a colocated group."""
    if pd_partition is None:
        return scenario
    from simulator.specs.serving import parse_pd_partition

    text = parse_pd_partition(pd_partition).text
    if not any(g.role == "both" for g in scenario.replicas):
        raise SpecError("needs a colocated replica group (role: both)", field="pd_partition")
    groups = [
        g.model_copy(update={"pd_partition": text}) if g.role == "both" else g
        for g in scenario.replicas
    ]
    return scenario.model_copy(update={"replicas": groups})


def run(
    scenario: Scenario | str | Path,
    *,
    percentiles: Sequence[float] = PERCENTILES,
    requests: RequestTable | None = None,
    outputs: RunOutputs | None = None,
    pd_partition: str | None = None,
    power_budget_w: float | None = None,
    power_policy: str | None = None,
) -> RunResult:
    """Simulate a scenario (a Scenario, or a path to its YAML: bad input then names the file
    and, for a replica group's impossible layout, the group). `pd_partition`: every
    colocated group runs with this intra-GPU prefill/decode split (`llmsim run
    --pd-partition`; `partitioned`). `percentiles`: those the
    summary reports for each latency (vLLM's --metric-percentiles; p50, p90, p99 always).
    `requests`: serve these instead of the ones the scenario's workload generates (lengths
    and arrivals from elsewhere, e.g. a published run's histogram). `outputs`: "stream" (or
    the scenario's `outputs: stream` when None) keeps running aggregates instead of rows
    (`metrics.stream`): the result's tables are empty and the summary lacks
    `metrics.stream.STREAM_ABSENT`; other levels only choose what `save_run` writes.
    `power_budget_w`, `power_policy`: replace the scenario's power budget's (`power_budget:`,
    `runs.power_budget.with_power_budget`)."""
    percentiles = tuple(sorted({*PERCENTILES, *percentiles}))
    if isinstance(scenario, Scenario):
        scenario = with_power_budget(scenario, power_budget_w, power_policy, source="scenario")
        return _simulate(
            partitioned(scenario, pd_partition),
            percentiles=percentiles,
            requests=requests,
            outputs=outputs,
        )
    with naming(str(scenario)):
        loaded = with_power_budget(
            load_scenario(scenario), power_budget_w, power_policy, source=str(scenario)
        )
        return _simulate(
            partitioned(loaded, pd_partition),
            name_groups=True,
            percentiles=percentiles,
            requests=requests,
            outputs=outputs,
        )


def _simulate(
    scenario: Scenario,
    *,
    name_groups: bool = False,
    percentiles: Sequence[float] = PERCENTILES,
    requests: RequestTable | None = None,
    outputs: RunOutputs | None = None,
) -> RunResult:
    stream = (outputs or scenario.outputs) == "stream"
    if stream and (
        scenario.disaggregated or scenario.autoscale is not None or scenario.power_budget
    ):
        what = (
            "a disaggregated"
            if scenario.disaggregated
            else "an autoscaled"
            if scenario.autoscale is not None
            else "a power-budgeted"
        )
        raise SpecError(f"stream is not built for {what} run (use summary)", field="outputs")
    budget = scenario.power_budget
    capped = budget is not None and budget.policy != "none"
    if capped and any(g.pd_partition is not None for g in scenario.replicas):
        # a cap swaps a replica's step timer; a partitioned replica runs two of its own
        raise SpecError(
            "caps plain replicas, not intra-GPU prefill/decode partitions (pd_partition)",
            field="power_budget",
        )
    pooled = scenario.kv_pool is not None and scenario.kv_pool.mode == "distributed"
    if stream and pooled:
        raise SpecError(
            "stream is not built for a distributed kv_pool (use summary)", field="outputs"
        )
    if pooled:  # a pool lends unshared blocks: prefix caching off unless a group sets it
        groups_off = [
            g
            if g.enable_prefix_caching is not None
            else g.model_copy(update={"enable_prefix_caching": False})
            for g in scenario.replicas
        ]
        scenario = scenario.model_copy(update={"replicas": groups_off})
    model = load_model(scenario.model)
    if requests is None:
        if scenario.workload.num_prompts is not None:  # before drawing them
            sizes.check_fits(scenario.workload.num_prompts, stream=stream)
        requests = generate_requests(scenario.workload, rng=np.random.default_rng(scenario.seed))
    sizes.check_fits(len(requests), field="workload", stream=stream)  # a trace's rows, given
    if len(requests):
        mean_output = float(np.mean(requests.output_len))
        sizes.announce_long_run(len(requests), mean_output, stream=stream)
    held = {"prefill": prefill_view(requests)}  # a prefill replica keeps prompt + 1 token
    built = []
    for i, spec in enumerate(scenario.replicas):
        with naming(field=f"replicas.{i}") if name_groups else nullcontext():
            built.append(
                build_group(
                    model,
                    spec,
                    held.get(spec.role, requests),
                    sampling=scenario.workload.sampling,
                    pooled=pooled,
                )
            )
    groups = [g for g, _, _ in built]
    plans = [plan for _, plan, _ in built]
    deps = [dep for _, _, dep in built]
    power = power_budget(
        scenario,
        deps,
        plans,
        lambda spec: build_group(
            model, spec, held.get(spec.role, requests), sampling=scenario.workload.sampling
        ),
    )
    if scenario.disaggregated:
        sim = serve_scenario(
            scenario,
            requests,
            groups=groups,
            deployments=deps,
            autoscale=fleet_scaling(scenario, plans, deps),
            power=power,
        )
    elif stream:
        return _stream(scenario, requests, groups, plans, deps, percentiles)
    else:
        sim = serve(
            requests,
            groups=groups,
            router=scenario.router,
            max_concurrency=scenario.max_concurrency,
            seed=scenario.seed,
            autoscale=fleet_scaling(scenario, plans, deps),
            kv_pool=pool_plan(
                scenario.kv_pool,
                [(dep, g.count) for dep, g in zip(deps, scenario.replicas, strict=True)],
            ),
            power=power,
        )
    goodput = scenario.slo.goodput() if scenario.slo else None
    # tokens after the first: one per decode at its step's end (a speculative step's decodes
    # emit 1 + accepted tokens each, which the step rows do not keep: no peak then)
    speculating = any(g.speculative is not None for g in scenario.replicas)
    steps = sim.steps
    later = None if speculating else (steps["end_s"], steps["decode_tokens"])
    summary: dict[str, Any] = serve_summary(
        sim.requests,
        itl_s=sim.itl_s,
        itl_weight=sim.itl_weight,
        goodput=goodput or None,
        prefix_caching=any(g.prefix_caching for g in scenario.replicas),
        start_s=0.0,  # the simulation starts with the benchmark
        percentiles=percentiles,
        later_tokens=later,
    )
    if scenario.disaggregated:
        summary.update(pool_summary(scenario, sim))
    summary.update(_extras(sim))
    if scenario.autoscale is not None:
        summary.update(fleet_summary(scenario, sim, plans, deps, goodput or {}))
    if sim.power is not None:
        summary.update(power_summary(scenario, deps, sim.power, sim.power_capped_replica_s or 0.0))
        if goodput and "slo_attainment" not in summary:
            summary["slo_attainment"] = slo_attainment(sim.requests, goodput)
    summary.update(
        bound_summary(
            scenario, plans, deps, sim.requests, tokens_per_s=summary.get("total_token_throughput")
        )
    )
    result = RunResult(scenario, sim, summary, plans, deps)
    return dataclasses.replace(result, energy=energy_summary(result))


def _extras(sim: SimResult) -> dict[str, Any]:
    """The summary keys of what a run had beside its requests and steps, whether its rows
    were kept or streamed: the KV tiers' figures, the LoRA adapters' loads, the KV pool's
    lending and the intra-GPU split's choices."""
    extras: dict[str, Any] = {}
    if sim.kv_tiers is not None:
        extras.update(kv_tier_summary(sim.kv_tiers))
    if sim.lora is not None:
        extras["lora"] = sim.lora
    if sim.kv_pool is not None:
        extras["kv_pool"] = sim.kv_pool
    if sim.pd_partition is not None:
        extras["pd_partition"] = sim.pd_partition
    return extras


def _stream(
    scenario: Scenario,
    requests: RequestTable,
    groups: list[ReplicaGroup],
    plans: list[MemoryPlan],
    deps: list[Deployment],
    percentiles: Sequence[float],
) -> RunResult:
    """`_simulate` with a `StreamRecorder`: the summary and the energy folded as rows come,
    none kept."""
    goodput = scenario.slo.goodput() if scenario.slo else None
    folded = StreamSummary(
        goodput=goodput or None, prefix_caching=any(g.prefix_caching for g in scenario.replicas)
    )
    account = EnergyAccumulator(group_accounts(scenario, deps, plans))
    recorder = StreamRecorder(folded, on_steps=account.add)
    sim = serve(
        requests,
        groups=groups,
        router=scenario.router,
        max_concurrency=scenario.max_concurrency,
        seed=scenario.seed,
        recorder=recorder,
    )
    summary: dict[str, Any] = folded.summary(percentiles)
    summary.update(_extras(sim))
    bound = _bound(scenario, plans, deps, folded.mean_lengths())
    if bound is not None:
        summary.update(_bound_keys(bound, summary.get("total_token_throughput")))
    energy = account.figures(
        last_finish=folded.last_finish if folded.completed else math.nan,
        completed=folded.completed,
        output_tokens=float(folded.output_tokens),
        prompt_tokens=float(folded.prompt_tokens),
    )
    steps = recorder.steps_seen
    return RunResult(scenario, sim, summary, plans, deps, energy, streamed_steps=steps)


def built_replicas(scenario: Scenario, group: int) -> int:
    """Replica indices group `group` takes in the run: its num_replicas, or max_replicas when
    autoscaled (the replicas that are off count in energy and cost as parked)."""
    scale = scenario.autoscaled(group)
    if scale is not None:
        return scale.max_replicas
    return scenario.replicas[group].num_replicas


def scaled_on_s(result: RunResult, group: int) -> float | None:
    """Replica-seconds group `group` was on, when it was autoscaled (else None)."""
    seconds = result.sim.fleet_gpu_seconds or {}
    if group not in seconds:
        return None
    return seconds[group] / result.deployments[group].layout.devices_per_replica


def load_seconds(dep: Deployment, plan: MemoryPlan, source: str) -> float:
    """Seconds a new replica takes to load its weights: the busiest GPU's weight bytes over
    the bandwidth one GPU reads them at: the node's NVMe (`storage`, the hardware spec's
    host.nvme_bw_bytes_per_s), or host memory over the host link (`host`: min(host DRAM
    bandwidth, PCIe x host_link_fraction), as weight offload streams them)."""
    host = dep.hardware.host
    if source == "storage":
        bw = host.nvme_bw_bytes_per_s
    else:
        pcie = host.pcie_bw_bytes_per_s * dep.hardware.efficiency.host_link_fraction
        bw = min(host.memory_bw_bytes_per_s, pcie)
    return float(plan.weights_bytes + plan.offloaded_bytes) / bw


def fleet_scaling(
    scenario: Scenario, plans: Sequence[MemoryPlan], deps: Sequence[Deployment]
) -> list[FleetScaling]:
    """The scenario's autoscaled groups as the serving loop takes them (none: no autoscale)."""
    return [
        FleetScaling(
            spec=scale,
            initial=scenario.replicas[scale.group].count,
            load_s=load_seconds(deps[scale.group], plans[scale.group], scale.weights_from),
            gpus_per_replica=deps[scale.group].layout.devices_per_replica,
        )
        for scale in scenario.autoscale or ()
    ]


def fleet_summary(
    scenario: Scenario,
    sim: SimResult,
    plans: Sequence[MemoryPlan],
    deps: Sequence[Deployment],
    slos: Mapping[str, float],
) -> dict[str, Any]:
    """An autoscaled run's fleet figures: GPU-hours (the autoscaled groups' replicas while
    loading, serving or draining, the other groups' for the whole run, all until the last
    request ends), the autoscaled groups' replicas serving together (time-weighted mean and
    peak), the scale-ups, the load time of one replica (the longest of the groups'), and the
    share of requests meeting every SLO. With more than one autoscaled group,
    `fleet_by_group` has each group's figures."""
    assert scenario.autoscale is not None and sim.fleet is not None
    end = float(sim.requests["finish_s"].max()) if len(sim.requests) else 0.0
    seconds = sim.fleet_gpu_seconds or {}
    gpu_s = float(sum(seconds.values()))
    for i, (spec, dep) in enumerate(zip(scenario.replicas, deps, strict=True)):
        if scenario.autoscaled(i) is None:
            gpu_s += spec.num_replicas * dep.layout.devices_per_replica * end
    frame = sim.fleet
    by_group, steps = [], []  # each group's figures, and its serving replicas over time
    for scale in scenario.autoscale:
        rows = frame[frame["group"] == scale.group] if "group" in frame else frame
        times = rows["time_s"].to_numpy(float)
        serving = rows["serving"].to_numpy(float)
        spans = np.diff(times)
        mean = float(np.sum(serving[:-1] * spans) / times[-1]) if times[-1] > 0 else serving[0]
        ups = np.diff(rows["serving"].to_numpy() + rows["loading"].to_numpy())
        by_group.append(
            {
                "group": scale.group,
                "gpu_hours": seconds.get(scale.group, 0.0) / 3600.0,
                "replicas_mean": mean,
                "replicas_peak": float(serving.max()),
                "scale_ups": float(np.sum(ups[ups > 0])),
                "load_s": load_seconds(deps[scale.group], plans[scale.group], scale.weights_from),
            }
        )
        steps.append((times, serving))
    # the groups' serving replicas together: each a step function, summed at every change
    at = np.unique(np.concatenate([times for times, _ in steps]))
    together = sum(
        serving[np.maximum(np.searchsorted(times, at, side="right") - 1, 0)]
        for times, serving in steps
    )
    summary: dict[str, Any] = {
        "fleet_gpu_hours": gpu_s / 3600.0,
        "fleet_replicas_mean": float(sum(g["replicas_mean"] for g in by_group)),
        "fleet_replicas_peak": float(np.max(together)),
        "fleet_scale_ups": float(sum(g["scale_ups"] for g in by_group)),
        "fleet_load_s": max(g["load_s"] for g in by_group),
        "slo_attainment": slo_attainment(sim.requests, slos) if slos else None,
    }
    if len(by_group) > 1:
        summary["fleet_by_group"] = by_group
    return summary


def fleet_bound(
    scenario: Scenario,
    plans: Sequence[MemoryPlan],
    deps: Sequence[Deployment],
    requests: pd.DataFrame,
) -> HardwareBound | None:
    """The hardware-limit bound (`costmodel.bound`) of every replica of the scenario's groups
    together, for the completed requests' mean prompt and output lengths; None without a
    completed request or a group whose KV cache holds nothing."""
    done = completed_requests(requests)
    if not len(done):
        return None
    lengths = float(done["prompt_tokens"].mean()), float(done["output_tokens"].mean())
    return _bound(scenario, plans, deps, lengths)


def _bound(
    scenario: Scenario,
    plans: Sequence[MemoryPlan],
    deps: Sequence[Deployment],
    lengths: tuple[float, float] | None,
) -> HardwareBound | None:
    """`fleet_bound` for mean prompt and output lengths (None: no completed request)."""
    if lengths is None:
        return None
    prompt, output = lengths
    if prompt < 1 or output < 1:
        return None
    total: HardwareBound | None = None
    for spec, plan, dep in zip(scenario.replicas, plans, deps, strict=True):
        if plan.kv_capacity_tokens <= 0:
            return None
        one = hardware_bound(
            dep,
            prompt_len=prompt,
            output_len=output,
            weight_bytes=plan.weights_bytes + plan.offloaded_bytes,
            kv_capacity_tokens=plan.kv_capacity_tokens,
        ).scaled(spec.num_replicas)
        total = one if total is None else total.plus(one)
    return total


def bound_summary(
    scenario: Scenario,
    plans: Sequence[MemoryPlan],
    deps: Sequence[Deployment],
    requests: pd.DataFrame,
    *,
    tokens_per_s: float | None,
) -> dict[str, Any]:
    """The run's hardware-limit bound and its share of it (`fleet_bound`): keys
    `hardware_bound_tok_s` (prompt + output tokens/s), `hardware_bound_output_tok_s`,
    `hardware_bound_resource` (compute, memory or network: the tightest) and `bound_share`
    (`tokens_per_s` over the bound); empty where there is no bound."""
    bound = fleet_bound(scenario, plans, deps, requests)
    if bound is None:
        return {}
    return _bound_keys(bound, tokens_per_s)


def _bound_keys(bound: HardwareBound, tokens_per_s: float | None) -> dict[str, Any]:
    share = None if tokens_per_s is None else float(tokens_per_s) / bound.tokens_per_s
    return {
        "hardware_bound_tok_s": bound.tokens_per_s,
        "hardware_bound_output_tok_s": bound.output_tokens_per_s,
        "hardware_bound_resource": bound.resource,
        "bound_share": share,
    }


def save_run(
    result: RunResult,
    out: str | Path,
    *,
    interval_coverage: float | None = bands.DEFAULT_COVERAGE,
    outputs: RunOutputs | None = None,
    output_format: OutputFormat | None = None,
) -> Path:
    """Write summary.json (`RunResult.as_json`, error bands at `interval_coverage`),
    scenario.json (the resolved scenario), memory.json (each replica group's memory plan) and
    the tables `outputs` asks for (None: the scenario's `outputs`, by default all of them):
    requests, steps, KV tier samples (with KV tiers) and the ITL sample (`itl_s`, and
    `weight`, the tokens that came that long after their previous one), each a .csv or, with
    `output_format` "parquet" (None: the scenario's), a .parquet file; then manifest.json, as
    the folder `out`; returns it. The folder is written beside `out` and renamed into place
    (`simulator.outputs.atomic_folder`): a kill or a full disk leaves the previous folder or
    this one, whole. `llmsim report` reads it back (it needs the requests and steps)."""
    asked = outputs or result.scenario.outputs
    level = OUTPUT_LEVELS.index("summary" if asked == "stream" else asked)
    fmt = output_format or result.scenario.output_format
    if fmt == "parquet":
        require_parquet()
    summary = result.as_json(interval_coverage=interval_coverage)
    sim = result.sim
    tables = {
        "requests": lambda: sim.requests,
        "steps": lambda: sim.steps,
        "kv_tiers": lambda: sim.kv_tiers,
        "fleet": lambda: sim.fleet,
        "power": lambda: sim.power,
        "itl": lambda: pd.DataFrame({"itl_s": sim.itl_s, "weight": sim.itl_weight}, copy=False),
    }
    with atomic_folder(out, "run", RUN_FILES) as folder:
        (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        for name, table in tables.items():
            frame = table() if OUTPUT_LEVELS.index(TABLE_LEVEL[name]) <= level else None
            if frame is not None:
                write_table(frame, folder / (name + TABLE_SUFFIX[fmt]))
        scenario = result.scenario.model_dump(mode="json")
        (folder / "scenario.json").write_text(json.dumps(scenario, indent=2) + "\n")
        memory = [plan.as_dict() for plan in result.memory]
        (folder / "memory.json").write_text(json.dumps(memory, indent=2) + "\n")
    return Path(out)


def write_table(frame: pd.DataFrame, path: Path) -> None:
    """`frame` as CSV, or as Parquet where `path` ends in .parquet (pyarrow, `require_parquet`)."""
    if path.suffix == ".parquet":
        frame.to_parquet(path, engine="pyarrow", index=False)
    else:
        frame.to_csv(path, index=False)


def require_parquet(field: str = "output_format") -> None:
    """A SpecError on `field` unless pyarrow, which writes and reads Parquet, is installed."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise SpecError(
            "parquet needs pyarrow, which is not installed: pip install 'llmsim[parquet]' "
            "(or use csv)",
            field=field,
        ) from None


def bench_scenario(
    *,
    model: str,
    hardware: str,
    workload: WorkloadSpec,
    engine_args: EngineArgs | None = None,
    max_concurrency: int | None = None,
    goodput: dict[str, float] | None = None,
    router: str = "round_robin",
    seed: int = 0,
    entrypoint: Entrypoint = "server",
) -> Scenario:
    """The scenario `llmsim bench serve|throughput` flags describe: one replica group on
    `hardware` from `engine_args` (vLLM's engine flags; `EngineArgs()`, vLLM's defaults, when
    None) run as an API server or `offline` (the engine's batch defaults differ), the
    workload, and the client's `max_concurrency`, `goodput` SLOs (ms) and `router`."""
    group = (engine_args or EngineArgs()).replica_group(hardware=hardware, entrypoint=entrypoint)
    data = {
        "name": "bench",
        "model": model,
        "replicas": [group],
        "router": {"kind": router},
        "workload": workload.model_dump(),
        "max_concurrency": max_concurrency,
        "slo": {f"{k}_ms": v for k, v in goodput.items()} if goodput else None,
        "seed": seed,
    }
    pool = (engine_args or EngineArgs()).kv_pool
    if pool != "off":
        data["kv_pool"] = {"mode": pool}
    return validate(Scenario, data, source="bench")


def bench_throughput(
    *,
    model: str,
    hardware: str,
    input_len: int | None = None,
    output_len: int | None = None,
    num_prompts: int,
    prefix_len: int = 0,
    engine_args: EngineArgs | None = None,
    seed: int = 0,
    dataset: dict[str, Any] | None = None,
    adapters: dict[str, Any] | None = None,
) -> tuple[RunResult, dict[str, Any]]:
    """`vllm bench throughput`: every request at t=0, sampled at temperature 1.0 as vLLM's
    benchmark does (OFFLINE_BENCH_SAMPLING); returns the run and its summary. The prompts are
    random ones of `input_len` and `output_len` tokens (None: RandomDataset's defaults, vLLM's),
    or `dataset` (a workload dataset mapping, e.g. `{"name": "sharegpt", "path": ...}`), as
    vLLM's --dataset-name picks. Every request generates its full output length (vLLM's
    benchmark sets ignore_eos).
    `prefix_len`: vLLM's --prefix-len, a prefix shared by every prompt, before its input_len
    tokens. `engine_args`: as in `bench_scenario`. `adapters`: the workload's LoRA adapter
    mix (`specs.lora.AdapterMix` fields; needs `engine_args.enable_lora`)."""
    random = {"name": "random", "input_len": input_len, "output_len": output_len}
    data = {
        "dataset": dataset or {k: v for k, v in random.items() if v is not None},
        "num_prompts": num_prompts,
        "request_rate": math.inf,
        "prefix": {"tokens": prefix_len} if prefix_len else None,
        "sampling": OFFLINE_BENCH_SAMPLING,  # as vLLM's benchmark samples
        # vllm/benchmarks/throughput.py: SamplingParams(..., ignore_eos=True), every dataset
        "ignore_eos": True,
        "adapters": adapters,
    }
    workload = validate(WorkloadSpec, data, source="bench")
    scenario = bench_scenario(
        model=model,
        hardware=hardware,
        workload=workload,
        engine_args=engine_args,
        seed=seed,
        entrypoint="offline",  # vllm bench throughput runs the LLM class
    )
    result = run(scenario)
    summary: dict[str, Any] = throughput_summary(result.sim.requests)
    extras = _extras(result.sim)  # the sections format_throughput_summary prints of them
    summary.update({key: extras[key] for key in ("lora", "pd_partition") if key in extras})
    summary.update(
        bound_summary(
            scenario,
            result.memory,
            result.deployments,
            result.sim.requests,
            tokens_per_s=summary["tokens_per_second"],
        )
    )
    return result, summary


def throughput_intervals(
    result: RunResult, summary: dict[str, Any], *, coverage: float = bands.DEFAULT_COVERAGE
) -> dict[str, Any]:
    """The error bands of `bench_throughput`'s summary (requests_per_second,
    tokens_per_second, output_tokens_per_second, elapsed_time; offline regime), or
    `interval_note` where no validation data backs the hardware and engine."""
    return bands.intervals(
        summary,
        metrics=bands.THROUGHPUT_METRICS,
        targets=result.band_targets(),
        regime="offline",
        coverage=coverage,
    )


def energy_summary(result: RunResult) -> dict[str, float]:
    """Energy, power and cost of a run (keys: ENERGY_KEYS): every GPU of every replica group
    (count x tp x pp, each group its own hardware and price) from the run's start to the last
    finish. A group's price is its `usd_per_gpu_hour` or its hardware's `price.usd_per_hour`."""
    if len(result.deployments) != len(result.scenario.replicas):
        raise ValueError("the run result carries no deployments (build it with runner.run)")
    on_s = [scaled_on_s(result, i) for i in range(len(result.scenario.replicas))]
    groups = group_accounts(result.scenario, result.deployments, result.memory, on_s)
    sim, capped = result.sim, None
    if sim.power_caps is not None and len(sim.power_caps):  # a power budget capped replicas
        groups = [
            dataclasses.replace(g, capped=d)
            for g, d in zip(
                groups, capped_deployments(result.scenario, result.deployments), strict=True
            )
        ]
        capped = capped_steps(sim.steps, sim.power_caps)
    return fleet_energy(steps=sim.steps, requests=sim.requests, groups=groups, capped=capped)


def group_accounts(
    scenario: Scenario,
    deps: Sequence[Deployment],
    plans: Sequence[MemoryPlan],
    on_s: Sequence[float | None] | None = None,
) -> list[GroupAccount]:
    """Each replica group's energy account (`on_s`: its replica-seconds on when autoscaled)."""
    on = list(on_s) if on_s is not None else [None] * len(scenario.replicas)
    return [
        GroupAccount(
            deployment=dep,
            count=built_replicas(scenario, i),
            block_size=plan.block_size,
            usd_per_gpu_hour=spec.usd_per_gpu_hour or dep.hardware.price.usd_per_hour,
            sampling=scenario.workload.sampling,
            on_s=on[i],
            streams_overlap=spec.pd_partition is not None,
        )
        for i, (spec, dep, plan) in enumerate(zip(scenario.replicas, deps, plans, strict=True))
    ]
