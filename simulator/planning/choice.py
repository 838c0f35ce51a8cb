"""Choosing the fleet: the cheapest mix by integer programming, the rate of each layout in it
checked over the plan's seeds, and the fleet checked by simulation at the target rate behind
the plan's router, over the seeds too.

Seeds cost simulations, so they are spent where they decide the answer: a layout's search
runs on the plan's first seed; only a layout that a proposed fleet uses has its rate
simulated on the other seeds (and lowered, in steps of 2 x the search tolerance, until enough
of them hold), after which the fleet is proposed again with the rates that hold.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any

import pandas as pd

from simulator.errors import SpecError
from simulator.metrics import bands
from simulator.planning.fleet import Fleet, FleetOption, cheapest_fleet, single_layout_fleet
from simulator.planning.layouts import Candidate, Prepared, Searched, Traffic
from simulator.planning.margins import DISAGGREGATED_NOTE
from simulator.planning.spec import PlanSpec
from simulator.planning.tables import prepared_row, usd_per_million_tokens
from simulator.planning.trials import (
    SeedCheck,
    Trial,
    needed,
    over_seeds,
    seed_list,
    simulate,
    simulate_replica,
)
from simulator.planning.units import Unit
from simulator.specs.scenario import ReplicaGroupSpec

FLEET_ATTEMPTS = 3  # fleets simulated at the target rate before trying single-layout fleets
LOWER_STEPS = 3  # lower rates a layout's seed check tries before the layout is dropped


@dataclass(frozen=True)
class Choice:
    """The fleet chosen (one row per layout used; empty when none), its summary for the plan's
    JSON, and the seed checks of the layouts proposed fleets used."""

    frame: pd.DataFrame
    summary: dict[str, Any]
    seed_checks: dict[str, SeedCheck]
    simulations: int
    groups: list[ReplicaGroupSpec] = dataclasses.field(default_factory=list)


def choose_fleet(
    spec: PlanSpec, searched: list[Searched], flow: Traffic, *, mean_out: float
) -> Choice:
    """The cheapest fleet (a mix, or one layout with `single_layout`) whose layouts' rates hold
    over the seeds and that meets the SLOs when simulated. A fleet that misses them is
    excluded (with every mix that has no more replicas of any layout) and the program solved
    again, FLEET_ATTEMPTS times at most; if none passes, the cheapest fleet of a single layout
    that can be had is checked too. The last fleet tried is the answer."""
    by_key = {s.prepared.key: s for s in searched}
    options = {s.prepared.key: s.option for s in searched if s.outcome.max_rate > 0}
    target, verify = flow.target_rate, spec.search.verify_fleet
    checks: dict[str, SeedCheck] = {}
    tried: list[tuple[Fleet, dict[str, Any] | None]] = []
    sims = 0

    def next_fleet(single: bool) -> Fleet | None:
        """The cheapest fleet not tried, once its layouts' rates have held over the seeds."""
        nonlocal sims
        while True:
            fleet = _propose(spec, options, target, exclude=tried, single=single)
            new = [k for k in fleet.replicas if k not in checks] if fleet else []
            if fleet is None or not (verify and spec.seeds > 1 and new):
                return fleet
            for key in new:  # then propose again with the rates that hold
                checks[key] = check_seeds(spec, by_key[key], flow)
                sims += checks[key].simulations
                options[key] = dataclasses.replace(options[key], rate=checks[key].rate)

    def verified(fleet: Fleet) -> dict[str, Any] | None:
        nonlocal sims
        check = _verify(spec, fleet, by_key, flow) if verify else None
        sims += check["simulations"] if check else 0
        tried.append((fleet, check))
        return check

    for _ in range(FLEET_ATTEMPTS if verify else 1):
        fleet = next_fleet(spec.single_layout)
        if fleet is None:
            break
        check = verified(fleet)
        if check is None or check["meets_slos"]:
            break
    else:  # every fleet tried missed: a fleet of one layout is not at the router's mercy
        alone = None if spec.single_layout else next_fleet(True)
        if alone is not None:
            verified(alone)
    if not tried:
        why = "no layout met the SLOs" if not options else "not enough GPUs within the limits"
        if options and not any(o.rate > 0 for o in options.values()):
            why = "no layout's rate held in enough of the seeds"
        return Choice(pd.DataFrame(), {"found": False, "reason": why}, checks, sims)
    fleet, check = tried[-1]
    frame = pd.DataFrame(
        [
            prepared_row(by_key[key].prepared)
            | {
                "replicas": count,
                "gpus": count * by_key[key].prepared.gpus,
                "rate": count * options[key].rate,
                "usd_per_hour": count * options[key].usd_per_hour,
            }
            for key, count in fleet.replicas.items()
        ]
    )
    summary: dict[str, Any] = {
        "found": True,
        "gpus": fleet.gpus,
        "rate": fleet.rate,
        "usd_per_hour": fleet.usd_per_hour,
        "usd_per_million_output_tokens": usd_per_million_tokens(
            fleet.usd_per_hour, rate=target, tokens_per_request=mean_out
        ),
        "headroom": fleet.rate / target - 1.0,
        "margin": margin_json(_fleet_margin(fleet, by_key)),
    }
    if check is not None:
        summary |= {
            key: check[key]
            for key in ("slo_attainment", "binding_slo", "binding_slo_ratio")
            if key in check
        }
    summary |= {
        "verification": check,
        "rejected": [
            {"replicas": f.replicas, "usd_per_hour": f.usd_per_hour, "reason": c["reason"]}
            for f, c in tried[:-1]
            if c is not None
        ],
    }
    if verify:
        summary["prediction"] = _predict(spec, fleet, by_key, flow)
        sims += 1
    return Choice(frame, summary, checks, sims, _groups(fleet, by_key, spec))


def _propose(
    spec: PlanSpec,
    options: dict[str, FleetOption],
    target: float,
    *,
    exclude: list[tuple[Fleet, dict[str, Any] | None]],
    single: bool,
) -> Fleet | None:
    replicas = spec.candidates.data_parallel_size
    usable = [o for o in options.values() if o.rate > 0]
    if single:
        return _cheapest_single(spec, usable, target, exclude=exclude)
    limits = {h.id: h.max_gpus for h in spec.candidates.hardware if h.max_gpus is not None}
    return cheapest_fleet(
        usable,
        target_rate=target,
        gpu_limits=limits,
        min_replicas=replicas.min,
        max_replicas=replicas.max,
        exclude=[f.replicas for f, _ in exclude],
    )


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


def check_seeds(spec: PlanSpec, s: Searched, flow: Traffic) -> SeedCheck:
    """The rate of one replica of `s` that holds in enough of the plan's seeds: its searched
    rate (which held on the first seed) tried on the others, then lower rates in steps of
    2 x the tolerance (taken to hold on the first seed too, as feasibility is monotone in the
    rate in practice), LOWER_STEPS at most."""
    p, rate = s.prepared, s.outcome.max_rate
    need, others = needed(spec.confidence, spec.seeds), seed_list(spec)[1:]
    step = 1.0 + 2.0 * spec.search.tolerance
    sims, met, reason = 0, 0, ""
    for _ in range(LOWER_STEPS + 1):

        def run_one(seed: int, rate: float = rate) -> Trial:
            return simulate_replica(spec, p, flow, rate=rate, seed=seed)

        trials, met = over_seeds(run_one, others, need=need, met=1)
        sims += len(trials)
        if met >= need:
            known = [t.verdict for t in trials]
            if rate == s.outcome.max_rate and s.verdict is not None:
                known.append(s.verdict)  # the first seed's, from the search
            worst = max(known, key=lambda v: v.binding[1] if v.ratios else 0.0, default=None)
            return SeedCheck(rate, spec.seeds, met, "", sims, worst)
        reason = next(t.verdict.reason for t in trials if not t.verdict.feasible)
        rate /= step
    return SeedCheck(0.0, spec.seeds, met, f"seed {reason}", sims)


def _fleet_margin(fleet: Fleet, by_key: dict[str, Searched]) -> bands.Margin:
    return bands.worst([by_key[key].prepared.margin for key in fleet.replicas])


def margin_json(margin: bands.Margin) -> dict[str, Any]:
    """A margin as the plan's JSON gives it."""
    out: dict[str, Any] = {
        "capacity_factor": margin.capacity,
        "latency_factors": margin.scale(),
        "bands": list(margin.groups),
        "source": list(margin.source),
    }
    if margin.note:
        out["note"] = margin.note
    return out


def _groups(fleet: Fleet, by_key: dict[str, Searched], spec: PlanSpec) -> list[ReplicaGroupSpec]:
    return [
        g for key, c in fleet.replicas.items() for g in by_key[key].prepared.groups(spec, count=c)
    ]


def _fleet_prompts(spec: PlanSpec, flow: Traffic) -> int:
    target, s = flow.target_rate, spec.search
    return flow.clamp(min(max(math.ceil(s.duration_s * target), s.min_prompts), 2 * s.max_prompts))


def _verify(
    spec: PlanSpec, fleet: Fleet, by_key: dict[str, Searched], flow: Traffic
) -> dict[str, Any]:
    """The whole fleet at the target rate behind the plan's router (units: their pools merged
    behind the plan's routers), at the edge of its margin, once per seed: it meets the SLOs
    when at least the plan's confidence of the seeds do. Latencies are the median over seeds;
    the binding SLO is the one closest to (or furthest past) its target there."""
    target, n = flow.target_rate, _fleet_prompts(spec, flow)
    margin = _fleet_margin(fleet, by_key)
    groups = _groups(fleet, by_key, spec)
    base = {"rate": target, "simulated_rate": target * margin.capacity, "num_prompts": n}

    def run_one(seed: int) -> Trial:
        return simulate(
            spec,
            groups,
            flow,
            num_prompts=n,
            rate=target,
            margin=margin,
            seed=seed,
            name=f"{spec.name}/fleet",
        )

    try:
        trials, met = over_seeds(run_one, seed_list(spec), need=0)
    except SpecError as exc:  # e.g. units whose KV blocks differ cannot share pools
        return base | {"meets_slos": False, "reason": exc.reason, "simulations": 1}
    verdicts = [t.verdict for t in trials]
    failed = [v.reason for v in verdicts if not v.feasible]
    ok = met >= needed(spec.confidence, spec.seeds)
    reason = "" if not failed else f"{len(failed)} of {len(trials)} seeds miss: {failed[0]}"
    ratios = {k: statistics.median(v.ratios[k] for v in verdicts) for k in verdicts[0].ratios}
    binding = max(ratios, key=lambda k: ratios[k]) if ratios else ""
    energies = [t.energy_j for t in trials if t.energy_j is not None]
    goodputs = [v.goodput_fraction for v in verdicts if v.goodput_fraction is not None]
    return base | {
        "seeds": len(trials),
        "seeds_met": met,
        "slo_attainment": met / len(trials),
        "meets_slos": ok,
        "reason": reason if not ok else (f"{reason} (within the confidence)" if failed else ""),
        **{k: statistics.median(v.latency_ms[k] for v in verdicts) for k in verdicts[0].latency_ms},
        "goodput_fraction": statistics.median(goodputs) if goodputs else None,
        "binding_slo": binding,
        "binding_slo_ratio": ratios.get(binding),
        "energy_per_output_token_j": statistics.median(energies) if energies else None,
        "simulations": len(trials),
    }


def _predict(
    spec: PlanSpec, fleet: Fleet, by_key: dict[str, Searched], flow: Traffic
) -> dict[str, Any]:
    """The fleet's point prediction at the target rate (no margin, the plan's first seed),
    with the error band of each latency (`K_interval`, `interval_coverage`,
    `interval_source`; `interval_note` where no validation data backs it)."""
    target, n = flow.target_rate, _fleet_prompts(spec, flow)
    parts = [by_key[key].prepared for key in fleet.replicas]
    try:
        trial = simulate(
            spec,
            _groups(fleet, by_key, spec),
            flow,
            num_prompts=n,
            rate=target,
            margin=bands.NO_MARGIN,
            seed=spec.seed,
            name=f"{spec.name}/prediction",
        )
    except SpecError as exc:
        return {"rate": target, "interval_note": exc.reason}
    latency = trial.verdict.latency_ms
    targets = [
        bands.deployment_target(x.deployment) for part in parts for x in _candidate_parts(part)
    ]
    split = any(not isinstance(part, Prepared) for part in parts)
    return (
        {"rate": target, "num_prompts": n}
        | latency
        | bands.intervals(
            latency,
            metrics=bands.serve_metrics(latency, all_at_once=False),
            targets=targets,
            regime="online",
            note=DISAGGREGATED_NOTE if split else None,
        )
    )


def _candidate_parts(p: Candidate) -> list[Prepared]:
    """The colocated layouts a candidate is made of (a unit: its prefill and decode ones)."""
    if isinstance(p, Unit):
        return [p.prefill, p.decode]
    assert isinstance(p, Prepared)
    return [p]
