"""Choosing the fleet: the cheapest mix by integer programming, checked by one simulation of
the whole fleet at the target rate behind the plan's router."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from simulator.errors import SpecError
from simulator.planning.fleet import Fleet, FleetOption, cheapest_fleet, single_layout_fleet
from simulator.planning.layouts import Candidate, Searched, Traffic, scenario
from simulator.planning.search import judge
from simulator.planning.spec import PlanSpec
from simulator.planning.tables import prepared_row, usd_per_million_tokens
from simulator.runs import runner

FLEET_ATTEMPTS = 3  # mixes simulated at the target rate before trying single-layout fleets


def choose_fleet(
    spec: PlanSpec, searched: list[Searched], flow: Traffic, *, mean_out: float
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The cheapest mix and its check by simulation. A mix that misses the SLOs when simulated
    is excluded (with every mix that has no more replicas of any layout) and the program
    solved again, FLEET_ATTEMPTS times at most; if none passes, the cheapest fleet of a single
    layout that can be had is checked too. The last fleet tried is the answer."""
    options = {s.prepared.key: s.option for s in searched if s.outcome.max_rate > 0}
    target = flow.target_rate
    replicas = spec.candidates.data_parallel_size
    limits = {h.id: h.max_gpus for h in spec.candidates.hardware if h.max_gpus is not None}
    by_key = {s.prepared.key: s.prepared for s in searched}
    tried: list[tuple[Fleet, dict[str, Any] | None]] = []
    for _ in range(FLEET_ATTEMPTS if spec.search.verify_fleet else 1):
        fleet = cheapest_fleet(
            list(options.values()),
            target_rate=target,
            gpu_limits=limits,
            min_replicas=replicas.min,
            max_replicas=replicas.max,
            exclude=[f.replicas for f, _ in tried],
        )
        if fleet is None:
            break
        check = _verify(spec, fleet, by_key, flow) if spec.search.verify_fleet else None
        tried.append((fleet, check))
        if check is None or check["meets_slos"]:
            break
    else:  # every mix tried missed: a fleet of one layout is not at the router's mercy
        alone = _cheapest_single(spec, list(options.values()), target, exclude=tried)
        if alone is not None:
            tried.append((alone, _verify(spec, alone, by_key, flow)))
    if not tried:
        why = "no layout met the SLOs" if not options else "not enough GPUs within the limits"
        return pd.DataFrame(), {"found": False, "reason": why}
    fleet, check = tried[-1]
    frame = pd.DataFrame(
        [
            prepared_row(by_key[key])
            | {
                "replicas": count,
                "gpus": count * by_key[key].gpus,
                "rate": count * options[key].rate,
                "usd_per_hour": count * options[key].usd_per_hour,
            }
            for key, count in fleet.replicas.items()
        ]
    )
    summary = {
        "found": True,
        "gpus": fleet.gpus,
        "rate": fleet.rate,
        "usd_per_hour": fleet.usd_per_hour,
        "usd_per_million_output_tokens": usd_per_million_tokens(
            fleet.usd_per_hour, rate=target, tokens_per_request=mean_out
        ),
        "verification": check,
        "rejected": [
            {"replicas": f.replicas, "usd_per_hour": f.usd_per_hour, "reason": c["reason"]}
            for f, c in tried[:-1]
            if c is not None
        ],
    }
    return frame, summary


def _cheapest_single(
    spec: PlanSpec,
    options: list[FleetOption],
    target: float,
    *,
    exclude: list[tuple[Fleet, dict[str, Any] | None]],
) -> Fleet | None:
    """The cheapest single-layout fleet that can be had and was not tried yet."""
    replicas = spec.candidates.data_parallel_size
    limits = {h.id: h.max_gpus for h in spec.candidates.hardware}
    fleets = []
    for option in options:
        fleet, why_not = single_layout_fleet(
            option,
            target_rate=target,
            gpu_limits=limits,
            min_replicas=replicas.min,
            max_replicas=replicas.max,
        )
        if not why_not and all(fleet.replicas != f.replicas for f, _ in exclude):
            fleets.append(fleet)
    return min(fleets, key=lambda f: (f.usd_per_hour, -f.rate), default=None)


def _verify(
    spec: PlanSpec, fleet: Fleet, by_key: dict[str, Candidate], flow: Traffic
) -> dict[str, Any]:
    """One simulation of the whole fleet at the target rate behind the plan's router (units:
    their pools merged behind the plan's routers)."""
    target, s = flow.target_rate, spec.search
    wanted = min(max(math.ceil(s.duration_s * target), s.min_prompts), 2 * s.max_prompts)
    n = flow.clamp(wanted)
    groups = [g for key, c in fleet.replicas.items() for g in by_key[key].groups(spec, count=c)]
    try:
        result = runner.run(scenario(spec, groups, flow.at(n, target), name=f"{spec.name}/fleet"))
    except SpecError as exc:  # e.g. units whose KV blocks differ cannot share pools
        return {"rate": target, "num_prompts": n, "meets_slos": False, "reason": exc.reason}
    sim = result.sim
    verdict = judge(
        sim.requests,
        itl_s=sim.itl_s,
        itl_weight=sim.itl_weight,
        slo=spec.slo,
        max_queueing_ms=s.max_queueing_ms,
    )
    return {
        "rate": target,
        "num_prompts": n,
        "meets_slos": verdict.feasible,
        "reason": verdict.reason,
        **verdict.latency_ms,
        "goodput_fraction": verdict.goodput_fraction,
        "energy_per_output_token_j": result.as_json().get("energy_per_output_token_j"),
    }
