"""A plan's margin: how much slower than simulated each candidate is taken to run, from the error
bands of `llmsim validate` at the plan's confidence (`metrics.bands.margin`).

A candidate is judged as if its hardware ran `capacity` times slower throughout, and each
latency were `latency_factor` times the simulated one. The first needs no extra simulation:
a run whose every duration is stretched by F, with arrivals at rate r, is the run at rate F r
with every time stretched by F (the simulator has no clock of its own besides step times and
arrivals). So a rate r is credited when the simulation at F r meets the SLOs with its
latencies multiplied by their factors and its queueing delay by F.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from simulator.costmodel.deployment import Deployment
from simulator.metrics import bands
from simulator.planning.spec import PlanSpec

DISAGGREGATED_NOTE = "no validation row measures a disaggregated deployment"


def plan_margin(
    spec: PlanSpec, deployments: Sequence[Deployment], *, disaggregated: bool = False
) -> bands.Margin:
    """The margin of a candidate made of `deployments` (NO_MARGIN when the plan turns margins
    off): backed setups take their groups' bands, others the pooled ones, with a note."""
    if not spec.search.band_margin:
        return bands.NO_MARGIN
    targets = tuple(bands.deployment_target(d) for d in deployments)
    return _margin(targets, spec.confidence, DISAGGREGATED_NOTE if disaggregated else None)


@cache
def _margin(targets: tuple[bands.Target, ...], confidence: float, note: str | None) -> bands.Margin:
    return bands.margin(targets, confidence=confidence, note=note)
