"""Run scenarios in memory: `run` (a whole what-if), and the bench flavours built on it.
Saving results is a separate step (`save_run`)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.api import Deployment, deployment
from simulator.costmodel.memory import MemoryPlan
from simulator.errors import SpecError
from simulator.metrics.summary import kv_tier_summary, serve_summary, throughput_summary
from simulator.power import energy_summary, with_power_cap
from simulator.scenario import ReplicaGroupSpec, Scenario, load_scenario
from simulator.serving.cluster import (
    ReplicaGroup,
    SimResult,
    default_scheduler,
    replica_group,
    serve,
)
from simulator.serving.disagg import pool_summary, prefill_view, serve_scenario
from simulator.serving.loops import engine_loop, expert_layout
from simulator.serving.speculative import SpeculativeSpec, parse_speculative_config
from simulator.serving.workload import (
    RandomDataset,
    RequestTable,
    SharedPrefix,
    WorkloadSpec,
    generate_requests,
)
from simulator.specs import ModelSpec, load_hardware, load_model
from simulator.specs.loader import validate
from simulator.specs.offload import OffloadLike, parse_offload


@dataclass(frozen=True)
class RunResult:
    """A scenario's outcome: the simulation's rows, the vLLM-style summary, memory plans, the
    resolved deployment of each replica group, and energy and cost (`power.energy_summary`)."""

    scenario: Scenario
    sim: SimResult
    summary: dict[str, Any]
    memory: list[MemoryPlan]
    deployments: list[Deployment] = field(default_factory=list)
    energy: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.name,
            **self.summary,
            "kv_cache_peak_fraction": self.sim.kv_peak_fraction,
            "num_replicas": self.sim.num_replicas,
            "simulated_steps": len(self.sim.steps),
            "wall_time_s": self.sim.wall_s,
            **self.energy,
        }


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
        **expert_layout(model, spec),  # data, expert parallel sizes; expert load imbalance
        dtype=spec.dtype,
        quantization=spec.quantization,
        kv_cache_dtype=spec.kv_cache_dtype,
        cpu_offload_gb=spec.cpu_offload_gb,
        offload=spec.offload,
        expert_offload=spec.expert_offload,
    )


def _group(
    model: ModelSpec, spec: ReplicaGroupSpec, requests: RequestTable
) -> tuple[ReplicaGroup, MemoryPlan, Deployment]:
    dep = group_deployment(model, spec)
    overrides = spec.scheduler.model_dump()
    scheduler = default_scheduler(dep.engine, **overrides)
    group, plan = replica_group(
        model=dep.model,
        hw=dep.hardware,
        layout=dep.layout,
        prec=dep.precision,
        engine=dep.engine,
        requests=requests,
        scheduler=scheduler,
        enforce_eager=spec.enforce_eager,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        swap_space_gib=spec.swap_space_gib,
        enable_prefix_caching=spec.enable_prefix_caching,
        speculative=spec.speculative,
        offload=dep.offload,
        kv_offload=spec.kv_offload,
    )
    return engine_loop(group, spec=spec, dep=dep), plan, dep


def run(scenario: Scenario | str | Path) -> RunResult:
    """Simulate a scenario (a Scenario or a path to its YAML)."""
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    model = load_model(scenario.model)
    requests = generate_requests(scenario.workload, rng=np.random.default_rng(scenario.seed))
    held = {"prefill": prefill_view(requests)}  # a prefill replica keeps prompt + 1 token
    built = [_group(model, spec, held.get(spec.role, requests)) for spec in scenario.replicas]
    if scenario.disaggregated:
        groups, deps = [g for g, _, _ in built], [dep for _, _, dep in built]
        sim = serve_scenario(scenario, requests, groups=groups, deployments=deps)
    else:
        sim = serve(
            requests,
            groups=[g for g, _, _ in built],
            router=scenario.router,
            max_concurrency=scenario.max_concurrency,
            seed=scenario.seed,
        )
    goodput = scenario.slo.goodput() if scenario.slo else None
    summary = serve_summary(
        sim.requests,
        itl_s=sim.itl_s,
        itl_weight=sim.itl_weight,
        goodput=goodput or None,
        prefix_caching=any(g.enable_prefix_caching for g in scenario.replicas),
    )
    if scenario.disaggregated:
        summary.update(pool_summary(scenario, sim))
    if sim.kv_tiers is not None:
        summary.update(kv_tier_summary(sim.kv_tiers))
    result = RunResult(
        scenario, sim, summary, [plan for _, plan, _ in built], [dep for _, _, dep in built]
    )
    return dataclasses.replace(result, energy=energy_summary(result))


def save_run(result: RunResult, out: str | Path) -> Path:
    """Write summary.json, requests.csv, steps.csv, itl.csv (the ITL sample: `itl_s`, and
    `weight`, the tokens that came that long after their previous one), scenario.json (the
    resolved scenario), memory.json (each replica group's memory plan) and, with KV tiers,
    kv_tiers.csv (their samples) under `out`; returns the folder. `llmsim report` reads it
    back."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(result.as_json(), indent=2, default=str))
    result.sim.requests.to_csv(folder / "requests.csv", index=False)
    result.sim.steps.to_csv(folder / "steps.csv", index=False)
    itl = {"itl_s": result.sim.itl_s, "weight": result.sim.itl_weight}
    pd.DataFrame(itl).to_csv(folder / "itl.csv", index=False)
    if result.sim.kv_tiers is not None:
        result.sim.kv_tiers.to_csv(folder / "kv_tiers.csv", index=False)
    scenario = result.scenario.model_dump(mode="json")
    (folder / "scenario.json").write_text(json.dumps(scenario, indent=2) + "\n")
    memory = [plan.as_dict() for plan in result.memory]
    (folder / "memory.json").write_text(json.dumps(memory, indent=2) + "\n")
    return folder


def bench_scenario(
    *,
    model: str,
    hardware: str,
    workload: WorkloadSpec,
    engine: str = "vllm",
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    data_parallel_size: int = 1,
    dtype: str = "auto",
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    enforce_eager: bool = False,
    gpu_memory_utilization: float | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    enable_chunked_prefill: bool | None = None,
    scheduling_policy: str | None = None,
    preemption_mode: str | None = None,
    swap_space: float = 4.0,
    enable_prefix_caching: bool = False,
    max_concurrency: int | None = None,
    goodput: dict[str, float] | None = None,
    router: str = "round_robin",
    seed: int = 0,
    speculative_config: SpeculativeSpec | Mapping[str, Any] | str | None = None,
    cpu_offload_gb: float = 0.0,
    offload_config: OffloadLike = None,
    enable_expert_parallel: bool = False,
    pipeline_micro_batching: bool = False,
    kv_offloading_size: float | None = None,
    kv_offloading_backend: str | None = None,
) -> Scenario:
    """The scenario `llmsim bench serve|throughput` flags describe (`speculative_config`:
    vLLM's --speculative-config, JSON text or a mapping; `cpu_offload_gb`, vLLM's flag, and
    `offload_config`, the rest of `simulator.specs.offload.OffloadSpec` as JSON or a mapping).
    With `enable_expert_parallel`, data_parallel_size > 1 is one replica of that many DP
    attention ranks (EP = tp x dp, as vLLM runs a MoE model); without, independent replicas.
    `kv_offloading_size` (GiB per replica) and `kv_offloading_backend`: vLLM's KV offloading
    flags, a CPU tier below HBM (`serving.kv_tiers`; needs prefix caching)."""
    dp_attention = enable_expert_parallel and data_parallel_size > 1
    if kv_offloading_backend is not None and kv_offloading_size is None:
        raise SpecError("needs --kv-offloading-size", field="kv_offloading_backend")
    if kv_offloading_size is not None and not enable_prefix_caching:
        raise SpecError(
            "needs --enable-prefix-caching (offloaded blocks are found by their prefix-cache keys)",
            field="kv_offloading_size",
        )
    kv_offload = None
    if kv_offloading_size is not None:
        kv_offload = {"cpu_gib": kv_offloading_size, "backend": kv_offloading_backend or "native"}
    speculative = parse_speculative_config(speculative_config, source="--speculative-config")
    offload = parse_offload(offload_config, source="--offload-config")
    group: dict[str, Any] = {
        "hardware": hardware,
        "engine": engine,
        "count": 1 if dp_attention else data_parallel_size,
        "data_parallel_size": data_parallel_size if dp_attention else 1,
        "enable_expert_parallel": enable_expert_parallel,
        "tensor_parallel_size": tensor_parallel_size,
        "pipeline_parallel_size": pipeline_parallel_size,
        "pipeline_micro_batching": pipeline_micro_batching,
        "dtype": dtype,
        "quantization": quantization,
        "kv_cache_dtype": kv_cache_dtype,
        "enforce_eager": enforce_eager,
        "gpu_memory_utilization": gpu_memory_utilization,
        "swap_space_gib": swap_space,
        "enable_prefix_caching": enable_prefix_caching,
        "scheduler": {
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "chunked_prefill": enable_chunked_prefill,
            "policy": scheduling_policy,
            "preemption_mode": preemption_mode,
        },
        "speculative": speculative.model_dump(exclude_none=True) if speculative else None,
        "cpu_offload_gb": cpu_offload_gb,
        "offload": offload.model_dump(exclude_defaults=True) or None,
        "kv_offload": kv_offload,
    }
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
    return validate(Scenario, data, source="bench")


def bench_throughput(
    *, input_len: int, output_len: int, num_prompts: int, prefix_len: int = 0, **flags: Any
) -> tuple[RunResult, dict[str, Any]]:
    """`vllm bench throughput`: every request at t=0; returns the run and its summary.
    `prefix_len`: vLLM's --prefix-len, a prefix shared by every prompt, before its input_len
    tokens."""
    workload = WorkloadSpec(
        dataset=RandomDataset(input_len=input_len, output_len=output_len),
        num_prompts=num_prompts,
        request_rate=math.inf,
        prefix=SharedPrefix(tokens=prefix_len) if prefix_len else None,
    )
    result = run(bench_scenario(workload=workload, **flags))
    return result, throughput_summary(result.sim.requests)
