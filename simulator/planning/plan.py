"""Capacity planning (`llmsim plan`): the cheapest deployments that meet the SLOs.

`plan(spec_or_path) -> PlanResult`. For each candidate (a layout: hardware x engine x
quantization x KV dtype x TP x PP, `simulator.planning.layouts`; with `mode: disaggregated` or
`any`, also units of prefill replicas of one layout and decode replicas of another,
`simulator.planning.units`, whose rate is that of the whole unit):

1. prune what cannot run (invalid layout, does not fit in memory; when no layout can run at all,
   the plan is bad input: SpecError) or cannot meet the SLOs at
   any rate (its latency floors, with each request alone, already miss them:
   `simulator.planning.bounds`), and layouts that cannot be part of the cheapest fleet
   (enough replicas of a layout already found cover any rate they could reach, for less);
2. find the highest request rate one replica sustains within the SLOs by simulation
   (`simulator.runs.runner.run` on a scenario built from the plan; bracket and bisect between the
   layout's capacity ceiling and zero, the same requests at every rate:
   `simulator.planning.search`);
3. size fleets for the target rate: each layout alone (ceil(target / max rate) replicas) and
   the cheapest mix of layouts by integer programming (`simulator.planning.fleet`), which one
   more simulation checks at the target rate behind the plan's router. Colocated replicas and
   disaggregated units do not mix in one fleet (a deployment is one or the other): with
   `mode: any` each kind gets its fleet and the cheaper that passes its check is the answer.

Costs: $/GPU-hour from the hardware spec or the plan's override. $ per million output tokens
= a deployment's $/hour / (the rate it serves x mean output tokens x 3600) x 1e6: for a fleet,
at the target rate; for one replica (`max_rate_usd_...`, the frontier), at the rate it runs.
Energy per output token comes from the run's `energy_per_output_token_j` where the runner
reports it.

Not modelled: load that varies over time (one steady target; no autoscaling), replicas
sharing nodes, reserved or spot pricing, the router's own latency.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import SpecError
from simulator.metrics import bands
from simulator.planning.bounds import hopeless
from simulator.planning.choice import Choice, check_seeds, choose_fleet
from simulator.planning.fleet import replacement
from simulator.planning.layouts import (
    Candidate,
    Prepared,
    Searched,
    Traffic,
    enumerate_layouts,
    measure,
    scenario,
    traffic,
)
from simulator.planning.search import Verdict, search_max_rate
from simulator.planning.spec import PlanSpec, check_ids, load_plan, with_overrides
from simulator.planning.tables import (
    candidate_row,
    layout_row,
    pareto_frontier,
    pareto_metric,
    prepared_row,
    rank,
    records,
    searched_row,
    usd_per_million_tokens,
)
from simulator.planning.trials import simulate_replica
from simulator.planning.units import build_units
from simulator.specs import ModelSpec, load_model
from simulator.specs.scenario import ReplicaGroupSpec, Scenario

MIN_RATE_FRACTION = 1e-3  # give up on a layout below this fraction of its capacity ceiling


@dataclass(frozen=True)
class PlanResult:
    """What `plan` found. `candidates`: one row per layout, ranked (feasible ones by the cost
    of serving the target with that layout alone, then infeasible, then pruned, with why);
    `probes`: every simulation of the search; `pareto`: feasible (layout, rate) points not
    beaten on both cost and the frontier latency; `fleet`: the cheapest mix, one row per
    layout used (empty when there is none), with totals and its check in `fleet_summary`."""

    spec: PlanSpec
    target_rate: float
    mean_output_tokens: float
    candidates: pd.DataFrame
    probes: pd.DataFrame
    pareto: pd.DataFrame
    pareto_metric: str
    fleet: pd.DataFrame
    fleet_summary: dict[str, Any]
    simulations: int
    wall_s: float
    fleet_groups: list[ReplicaGroupSpec] = field(default_factory=list)

    def fleet_scenario(
        self, *, rate: float | None = None, num_prompts: int | None = None, seed: int | None = None
    ) -> Scenario:
        """The chosen fleet as an `llmsim run` scenario: its replica groups behind the plan's
        router, `num_prompts` requests of the plan's workload (default: as the fleet's check)
        at `rate` (default: the target), drawn with `seed` (default: the plan's). ValueError
        when the plan found no fleet."""
        if not self.fleet_groups:
            raise ValueError("the plan found no fleet")
        flow = traffic(self.spec)
        check = self.fleet_summary.get("verification") or {}
        n = num_prompts or int(check.get("num_prompts") or self.spec.search.min_prompts)
        run = scenario(
            self.spec,
            self.fleet_groups,
            flow.at(flow.clamp(n), rate or self.target_rate),
            name=f"{self.spec.name}/fleet",
        )
        return run if seed is None else run.model_copy(update={"seed": seed})

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "model": self.spec.model,
            "mode": self.spec.mode,
            "confidence": self.spec.confidence if self.spec.search.band_margin else None,
            "seeds": self.spec.seeds,
            "single_layout": self.spec.single_layout,
            "target_rate": self.target_rate,
            "mean_output_tokens": self.mean_output_tokens,
            "slo": self.spec.slo.model_dump(exclude_none=True),
            "candidates": records(self.candidates),
            "fleet": {**self.fleet_summary, "replicas": records(self.fleet)},
            "backing": self.backing(),
            "pareto_metric": self.pareto_metric,
            "pareto": records(self.pareto),
            "simulations": self.simulations,
            "wall_time_s": self.wall_s,
        }

    def backing(self) -> list[dict[str, Any]]:
        """Per hardware and engine among the layouts judged: the margin it took, and the
        held-out validation rows that back it (their suites and count; none: its bands are
        pooled from every device, and `note` says so)."""
        frame = self.candidates
        if "margin_capacity" not in frame.columns:
            return []
        judged = frame[frame["margin_capacity"].notna() & frame["mode"].eq("colocated")]
        columns = ["hardware", "engine", "margin_capacity", "margin_ttft", "margin_tpot"]
        family = bands.model_family(load_model(self.spec.model))
        out = []
        for row in records(judged.drop_duplicates(["hardware", "engine"])):
            rows = bands.backing_rows(hardware=row["hardware"], engine=row["engine"], family=family)
            out.append(
                {k: row[k] for k in columns}
                | {
                    "backed": bool(rows),
                    "validation_rows": len(rows),
                    "suites": sorted({r.suite for r in rows}),
                    "note": row["band_note"] or None,
                }
            )
        return out


def plan(
    spec: PlanSpec | str | Path,
    *,
    confidence: float | None = None,
    seeds: int | None = None,
    single_layout: bool | None = None,
    progress: Callable[[str], None] | None = None,
) -> PlanResult:
    """Plan the cheapest deployments for a plan (a PlanSpec or a path to its YAML);
    `confidence`, `seeds` and `single_layout` replace the plan's own where given. `progress`
    receives a line per stage and per candidate searched, with counts, as the plan goes
    (nothing before the layouts are priced, so bad input fails with its line alone)."""
    wall = time.perf_counter()
    if isinstance(spec, PlanSpec):
        source = spec.name
        check_ids(spec, source=source)
    else:
        source = str(spec)
        spec = load_plan(spec)
    spec = with_overrides(spec, confidence=confidence, seeds=seeds, single_layout=single_layout)
    say = progress or (lambda _line: None)
    model = load_model(spec.model)
    flow = traffic(spec)
    target = flow.target_rate  # a trace that spans no time fails here, before any work
    mean_out = float(np.mean(flow.requests(flow.clamp(spec.search.max_prompts)).output_len))
    rows: list[dict[str, Any]] = []
    measured, colocated = _measure_all(spec, model, flow, rows=rows, say=say)
    if not measured:  # the model fits no candidate (or no layout is valid): bad input
        # (rows holds every layout: PlanSpec's candidate lists are never empty)
        widest = max(rows, key=lambda r: (r["gpus_per_replica"], r["quantization"] != "none"))
        raise SpecError(
            f"no candidate layout can run {spec.model}; the largest, {widest['layout']}: "
            f"{widest['reason']}",
            source=source,
            field="candidates",
        )
    units: list[Candidate] = []
    if spec.mode != "colocated":
        found, pruned = build_units(spec, measured, flow)
        units += found
        rows += pruned
    say(
        f"priced {sum(1 for _ in enumerate_layouts(spec))} layouts: {len(measured)} can run, "
        f"{len(colocated)} worth simulating colocated"
        + (f", {len(units)} prefill/decode units" if spec.mode != "colocated" else "")
    )
    kinds = [
        _search_all(spec, candidates, flow, mean_out=mean_out, rows=rows, say=say)
        for candidates in (colocated, units)
    ]
    choices = [
        choose_fleet(spec, searched, flow, mean_out=mean_out) for searched in kinds if searched
    ] or [choose_fleet(spec, [], flow, mean_out=mean_out)]
    chosen = _cheapest_of(choices)
    checks = {k: c for choice in choices for k, c in choice.seed_checks.items()}
    searched = [s for kind in kinds for s in kind]
    extra = 0
    if spec.search.seed_check == "all" and spec.seeds > 1:
        for s in searched:
            if s.prepared.key not in checks and s.outcome.max_rate > 0:
                checks[s.prepared.key] = check_seeds(spec, s, flow)
                extra += checks[s.prepared.key].simulations
    rows += [
        searched_row(spec, s, target=target, mean_out=mean_out, seeds=checks.get(s.prepared.key))
        for s in searched
    ]
    probes = pd.DataFrame([r for s in searched for r in s.probes])
    metric = pareto_metric(spec)
    return PlanResult(
        spec=spec,
        target_rate=target,
        mean_output_tokens=mean_out,
        candidates=rank(pd.DataFrame(rows)),
        probes=probes,
        pareto=pareto_frontier(probes, cost="usd_per_million_output_tokens", latency=metric),
        pareto_metric=metric,
        fleet=chosen.frame,
        fleet_summary=chosen.summary,
        simulations=len(probes) + sum(c.simulations for c in choices) + extra,
        wall_s=time.perf_counter() - wall,
        fleet_groups=chosen.groups,
    )


def _measure_all(
    spec: PlanSpec,
    model: ModelSpec,
    flow: Traffic,
    *,
    rows: list[dict[str, Any]],
    say: Callable[[str], None],
) -> tuple[list[Prepared], list[Candidate]]:
    """Every layout that can run (the pools units are made of), and those of them to search
    as colocated replicas (not hopeless; none when the mode is disaggregated). Rows for the
    layouts pruned go to `rows`."""
    measured: list[Prepared] = []
    colocated: list[Candidate] = []
    for layout in enumerate_layouts(spec):
        got = measure(spec, layout, model=model, flow=flow)
        if isinstance(got, str):
            reason = got
        else:
            measured.append(got)
            reason = ""
            if spec.mode != "disaggregated":
                hope = hopeless(
                    got.floors,
                    spec.slo,
                    margin=spec.search.prescreen_margin,
                    scale=got.margin.scale(),
                )
                reason = f"hopeless: {hope}" if hope else ""
                colocated += [] if hope else [got]
        if reason:
            rows.append(layout_row(layout) | {"status": "pruned", "reason": reason})
    return measured, colocated


def _search_all(
    spec: PlanSpec,
    candidates: list[Candidate],
    flow: Traffic,
    *,
    mean_out: float,
    rows: list[dict[str, Any]],
    say: Callable[[str], None],
) -> list[Searched]:
    """Search the candidates of one kind, cheapest conceivable $ per request first (so that
    dominance has something to go by); rows for those pruned as dominated go to `rows`."""
    searched: list[Searched] = []
    ordered = sorted(candidates, key=lambda p: p.usd_per_hour / p.ceiling)
    for i, p in enumerate(ordered, 1):
        dominated = _dominated_by(spec, p, searched)
        if dominated:
            rows.append(prepared_row(p) | {"status": "pruned", "reason": dominated})
            say(f"[{i}/{len(ordered)}] {p.key}: pruned ({dominated})")
            continue
        result = _search(spec, p, flow, mean_out=mean_out)
        searched.append(result)
        rate = result.outcome.max_rate
        say(f"[{i}/{len(ordered)}] {p.key}: simulated, {rate:.2f} req/s per replica")
    return searched


def _cheapest_of(choices: list[Choice]) -> Choice:
    """The fleet to report among one per kind: found ones that passed their check (or were
    not checked) first, then the cheapest."""

    def order(choice: Choice) -> tuple[bool, bool, float]:
        summary = choice.summary
        check: dict[str, Any] = summary.get("verification") or {}
        return (
            not summary.get("found"),
            not check.get("meets_slos", True),
            summary.get("usd_per_hour", math.inf),
        )

    return min(choices, key=order)


def _search(spec: PlanSpec, p: Candidate, flow: Traffic, *, mean_out: float) -> Searched:
    """The highest credited rate at which one replica of `p` meets the SLOs on the plan's
    first seed, judged at the edge of its margin (`planning.trials`)."""
    verdicts: dict[float, tuple[Verdict, float | None]] = {}
    probes: list[dict[str, Any]] = []

    def feasible(rate: float) -> bool:
        trial = simulate_replica(spec, p, flow, rate=rate, seed=spec.seed)
        verdict = trial.verdict
        verdicts[rate] = (verdict, trial.energy_j)
        cost = usd_per_million_tokens(p.usd_per_hour, rate=rate, tokens_per_request=mean_out)
        probes.append(
            candidate_row(p)
            | {
                "rate": rate,
                "simulated_rate": trial.simulated_rate,
                "feasible": verdict.feasible,
                "reason": verdict.reason,
                "usd_per_million_output_tokens": cost,
                "energy_per_output_token_j": trial.energy_j,
                **verdict.latency_ms,
                "goodput_fraction": verdict.goodput_fraction,
                "late_queueing_ms": verdict.late_queueing_ms,
            }
        )
        return verdict.feasible

    s = spec.search
    ceiling = p.ceiling / p.margin.capacity  # the credited rate the ceiling allows
    outcome = search_max_rate(
        feasible,
        ceiling=ceiling,
        start=ceiling / 2,
        tolerance=s.tolerance,
        max_probes=s.max_probes,
        min_rate=ceiling * MIN_RATE_FRACTION,
    )
    at_max = verdicts.get(outcome.max_rate)
    verdict, energy = at_max if at_max else (None, None)
    return Searched(p, outcome, verdict, energy, probes)


def _dominated_by(spec: PlanSpec, p: Candidate, searched: list[Searched]) -> str:
    """Why candidate `p` cannot be in the cheapest fleet, or ''. It cannot when replicas of a
    candidate of its kind already searched, on hardware without a GPU limit, replace any of its
    replicas at no extra cost (`fleet.replacement`; its search never reports more than its
    ceiling)."""
    replicas = spec.candidates.data_parallel_size
    if not spec.search.prune_dominated or replicas.min != 1 or replicas.max is not None:
        return ""
    limited = {h.id for h in spec.candidates.hardware if h.max_gpus is not None}
    for s in searched:
        k, rate = s.prepared, s.outcome.max_rate
        if rate <= 0 or any(h in limited for h in s.option.hardware_ids):
            continue
        ceiling = p.ceiling / p.margin.capacity  # as credited
        need = replacement(s.option, rate_ceiling=ceiling, usd_per_hour=p.usd_per_hour)
        if need:
            return (
                f"dominated by {k.key}: {need} of its replicas sustain "
                f"{need * rate:.2f} req/s for ${need * k.usd_per_hour:.2f}/h, this layout at "
                f"most {ceiling:.2f} req/s for ${p.usd_per_hour:.2f}/h"
            )
    return ""
