"""Simulations of a plan judged at the edge of its margin, and over several workload seeds.

A trial runs one scenario at a credited rate r: the arrivals come at r x the margin's capacity
factor and the latencies are judged multiplied by their factors (`planning.margins`). Over
seeds, a rate or a fleet holds when at least `needed(confidence, n)` of n seeds meet the SLOs;
the seeds are run in order and the count stops as soon as the rest could not reach it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simulator.metrics.bands import Margin
from simulator.planning.layouts import Candidate, Traffic, scenario
from simulator.planning.search import Verdict, judge
from simulator.planning.spec import PlanSpec
from simulator.runs import runner
from simulator.specs.scenario import ReplicaGroupSpec


@dataclass(frozen=True)
class Trial:
    """One simulation: its seed, its verdict (latencies at the edge), energy per output token
    (None where the runner gives none), and the rate simulated for the credited one."""

    seed: int
    verdict: Verdict
    energy_j: float | None
    simulated_rate: float


@dataclass(frozen=True)
class SeedCheck:
    """A layout's rate over the plan's seeds: the credited rate that held in enough of them
    (0: none of the rates tried), the seeds that met the SLOs there (the first seed's search
    counts as one), why the last rate tried failed, and at the rate that held, the verdict
    closest to (or furthest past) an SLO among its seeds."""

    rate: float
    seeds: int
    met: int
    reason: str = ""
    simulations: int = 0
    worst: Verdict | None = None


def simulate(
    spec: PlanSpec,
    groups: list[ReplicaGroupSpec],
    flow: Traffic,
    *,
    num_prompts: int,
    rate: float,
    margin: Margin,
    seed: int,
    name: str,
) -> Trial:
    """`num_prompts` requests of the plan's workload at credited `rate`, drawn with `seed`,
    on `groups`, judged against the plan's SLOs at the edge of `margin`. SpecError where the
    groups cannot run together."""
    simulated = rate * margin.capacity
    run = scenario(spec, groups, flow.at(num_prompts, simulated), name=name)
    result = runner.run(run.model_copy(update={"seed": seed}))
    sim = result.sim
    verdict = judge(
        sim.requests,
        itl_s=sim.itl_s,
        itl_weight=sim.itl_weight,
        slo=spec.slo,
        max_queueing_ms=spec.search.max_queueing_ms,
        scale=margin.scale(),
        wait_scale=margin.capacity,
    )
    energy = result.as_json(interval_coverage=None).get("energy_per_output_token_j")
    return Trial(seed, verdict, energy, simulated)


def simulate_replica(
    spec: PlanSpec, p: Candidate, flow: Traffic, *, rate: float, seed: int
) -> Trial:
    """One replica (or unit) of candidate `p` on its requests at credited `rate`, drawn with
    `seed`, judged at the edge of its margin."""
    return simulate(
        spec,
        p.groups(spec),
        flow,
        num_prompts=p.num_prompts,
        rate=rate,
        margin=p.margin,
        seed=seed,
        name=p.key,
    )


def needed(confidence: float, seeds: int) -> int:
    """Seeds of `seeds` that must meet the SLOs for a share of at least `confidence`."""
    return math.ceil(confidence * seeds - 1e-9)


def seed_list(spec: PlanSpec) -> list[int]:
    """The plan's workload seeds: seed, seed + 1, ..., seed + seeds - 1."""
    return [spec.seed + k for k in range(spec.seeds)]


def over_seeds(
    run_one: Callable[[int], Trial], seeds: Sequence[int], *, need: int, met: int = 0
) -> tuple[list[Trial], int]:
    """Run `run_one` for each seed in turn until `need` successes (counting `met` already
    known) can no longer be reached; the trials run and the successes counted."""
    trials: list[Trial] = []
    left = len(seeds)
    for seed in seeds:
        if met + left < need:
            break
        trial = run_one(seed)
        trials.append(trial)
        met += trial.verdict.feasible
        left -= 1
    return trials, met
