"""A scenario's fleet power budget (`power_budget:`), built for the serving loop
(`serving.power`), and the run summary's keys for it.

Capped replicas run on a timer built once per group on `with_power_cap(hardware, cap)` (the
group as the scenario gives it, with `power_cap_w` lowered to the cap); the draw of a step is
the energy model's (`runs.energy.step_power_w`) on the capped or uncapped hardware.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from simulator.costmodel.deployment import Deployment
from simulator.costmodel.memory import MemoryPlan
from simulator.errors import SpecError
from simulator.runs.energy import GroupAccount, step_power_w
from simulator.serving.group import ReplicaGroup
from simulator.serving.power import PowerBudget
from simulator.specs.hardware import with_power_cap
from simulator.specs.loader import validate
from simulator.specs.scenario import ReplicaGroupSpec, Scenario

POWER_KEYS = (
    "power_budget_w",
    "power_cap_w",
    "power_peak_draw_w",
    "power_peak_window_w",
    "power_mean_draw_w",
    "power_over_budget_share",
    "power_capped_share",
)


def with_power_budget(
    scenario: Scenario, budget_w: float | None, policy: str | None, *, source: str
) -> Scenario:
    """`scenario` with its power budget's `budget_w` and `policy` replaced (`llmsim run
    --power-budget W --power-policy P`): a scenario without the block gains one (policy
    dynamic unless given). Checked as the scenario's own block is (errors name `source`)."""
    if budget_w is None and policy is None:
        return scenario
    data = scenario.model_dump(mode="json", exclude_unset=True)
    block = dict(data.get("power_budget") or {})
    if budget_w is not None:
        block["budget_w"] = budget_w
    if policy is not None:
        block["policy"] = policy
    if "budget_w" not in block:
        raise SpecError("--power-policy needs a budget (--power-budget W)", field="power_budget")
    data["power_budget"] = block
    return validate(Scenario, data, source=source)


def fleet_gpus(scenario: Scenario, deps: Sequence[Deployment]) -> int:
    return sum(
        count * dep.layout.devices_per_replica
        for count, dep in zip(scenario.most_replicas(), deps, strict=True)
    )


def per_gpu_cap(scenario: Scenario, deps: Sequence[Deployment]) -> float:
    """The cap of a capped GPU: budget / the fleet's GPUs under `static` (all of them at full
    load fit), `cap_w` (default the same) under `dynamic`."""
    spec = scenario.power_budget
    assert spec is not None
    even = spec.budget_w / fleet_gpus(scenario, deps)
    if spec.policy == "dynamic" and spec.cap_w is not None:
        return spec.cap_w
    return even


def capped_deployments(scenario: Scenario, deps: Sequence[Deployment]) -> list[Deployment]:
    """Each group's deployment on the hardware its capped replicas ran on."""
    cap = per_gpu_cap(scenario, deps)
    out = []
    for group, dep in zip(scenario.replicas, deps, strict=True):
        limit = cap if group.power_cap_w is None else min(cap, group.power_cap_w)
        out.append(dataclasses.replace(dep, hardware=with_power_cap(dep.hardware, limit)))
    return out


def power_budget(
    scenario: Scenario,
    deps: Sequence[Deployment],
    plans: Sequence[MemoryPlan],
    build: Callable[[ReplicaGroupSpec], tuple[ReplicaGroup, MemoryPlan, Deployment]],
) -> PowerBudget | None:
    """The scenario's power budget as `serving.cluster.serve` takes it (None: no block);
    `build` builds a replica group for the run's requests (`runs.runner.build_group`)."""
    spec = scenario.power_budget
    if spec is None:
        return None
    cap = per_gpu_cap(scenario, deps)
    field = "power_budget.cap_w" if spec.cap_w is not None else "power_budget.budget_w"
    timers, capped_deps = [], []
    for i, (group, dep) in enumerate(zip(scenario.replicas, deps, strict=True)):
        hw = dep.hardware
        if spec.policy != "none" and not cap > hw.power.idle_w:
            raise SpecError(
                f"a cap of {cap:g} W per GPU is not above the idle draw of {hw.id or hw.name} "
                f"({hw.power.idle_w:g} W, replica group {i})",
                field=field,
            )
        if spec.policy == "none":
            capped_deps.append(dep)
            continue
        limit = cap if group.power_cap_w is None else min(cap, group.power_cap_w)
        built = build(group.model_copy(update={"power_cap_w": limit}))
        timers.append(built[0].step_timer)
        capped_deps.append(built[2])
    parked = sum(
        n * d.layout.devices_per_replica * d.hardware.power.between_steps_w
        for n, d in zip(scenario.most_replicas(), capped_deps, strict=True)
    )
    if not spec.budget_w > parked:
        raise SpecError(
            f"{spec.budget_w:g} W is not above what the fleet draws with no step running "
            f"({parked:g} W{' capped' if spec.policy != 'none' else ''})",
            field="power_budget.budget_w",
        )

    def accounts(ds: Sequence[Deployment]) -> list[GroupAccount]:
        return [
            GroupAccount(
                deployment=d,
                count=g.count,
                block_size=plan.block_size,
                usd_per_gpu_hour=1.0,  # unused: only the draw is asked
                sampling=scenario.workload.sampling,
            )
            for g, d, plan in zip(scenario.replicas, ds, plans, strict=True)
        ]

    by_cap = {False: accounts(deps), True: accounts(capped_deps)}

    def draw_w(group: int, capped: bool, steps: pd.DataFrame) -> np.ndarray:
        return step_power_w(steps, by_cap[capped][group])

    return PowerBudget(
        spec=spec,
        gpus=[d.layout.devices_per_replica for d in deps],
        parked_w=[
            (d.hardware.power.between_steps_w, c.hardware.power.between_steps_w)
            for d, c in zip(deps, capped_deps, strict=True)
        ],
        capped_timers=timers,
        cap_w=cap,
        draw_w=draw_w,
        priorities=[g.power_priority for g in scenario.replicas],
    )


def power_summary(
    scenario: Scenario, deps: Sequence[Deployment], frame: pd.DataFrame, capped_replica_s: float
) -> dict[str, Any]:
    """The run's power-budget keys (POWER_KEYS): the budget, the cap of a capped GPU, the peak
    of the sampled and windowed fleet draw and the mean draw, the share of samples whose
    windowed draw was over the budget, and the share of replica-time capped."""
    spec = scenario.power_budget
    assert spec is not None
    replicas = sum(scenario.most_replicas())
    span = float(frame["time_s"].iloc[-1]) if len(frame) else 0.0
    window = frame["window_w"].to_numpy(float)
    return {
        "power_budget_w": spec.budget_w,
        "power_cap_w": None if spec.policy == "none" else per_gpu_cap(scenario, deps),
        "power_peak_draw_w": float(frame["draw_w"].max()) if len(frame) else 0.0,
        "power_peak_window_w": float(window.max()) if len(frame) else 0.0,
        "power_mean_draw_w": float(frame["draw_w"].mean()) if len(frame) else 0.0,
        "power_over_budget_share": float(np.mean(window > spec.budget_w)) if len(frame) else 0.0,
        "power_capped_share": capped_replica_s / (replicas * span) if span > 0 else 0.0,
    }
