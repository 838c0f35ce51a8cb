"""The cheapest fleet for a target rate: how many replicas of each layout, as an integer program.

In the spirit of Mélange (Griggs et al., "Mélange: Cost Efficient Large Language Model
Serving by Exploiting GPU Heterogeneity", arXiv:2404.14527): one integer variable per layout
(its replica count x_l), each replica sustaining the rate its search found (r_l) at its price
(c_l $/hour); minimise sum c_l x_l subject to sum r_l x_l >= target, the GPUs of each hardware
type within what is available, and, for a layout that is used, between the replica range's
min and max. Ties in cost go to the fleet with the most capacity. Solved with
`scipy.optimize.milp` (HiGHS).

Assumed, not simulated here: a fleet sustains the sum of its replicas' rates (a router that
splits traffic by capacity; pooling replicas behind one router usually does better than that).
The planner checks the chosen fleet with one simulation at the target rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simulator.outputs import held_fd

if TYPE_CHECKING:
    from scipy.optimize import OptimizeResult

COST_TIE_TOLERANCE = 1e-9  # relative: fleets this close in cost count as equally cheap


@dataclass(frozen=True)
class FleetOption:
    """A layout as the fleet sees it: one replica's rate, GPUs and price per hour. A
    disaggregated unit (prefill and decode replicas, perhaps of two hardware types) is one
    "replica" here; `gpus_by_hardware` then splits its GPUs by hardware type."""

    key: str
    hardware: str
    gpus_per_replica: int
    rate: float
    usd_per_hour: float
    gpus_by_hardware: tuple[tuple[str, int], ...] = ()

    def gpus_on(self, hardware: str) -> int:
        """GPUs of `hardware` in one replica."""
        if self.gpus_by_hardware:
            return dict(self.gpus_by_hardware).get(hardware, 0)
        return self.gpus_per_replica if hardware == self.hardware else 0

    @property
    def hardware_ids(self) -> list[str]:
        return [h for h, _ in self.gpus_by_hardware] or [self.hardware]


@dataclass(frozen=True)
class Fleet:
    """Replicas per option key (only those used), and the totals."""

    replicas: dict[str, int]
    rate: float
    usd_per_hour: float
    gpus: int


def _make_fleet(options: Sequence[FleetOption], counts: Sequence[int]) -> Fleet:
    used = [(o, n) for o, n in zip(options, counts, strict=True) if n > 0]
    return Fleet(
        replicas={o.key: n for o, n in used},
        rate=sum(o.rate * n for o, n in used),
        usd_per_hour=sum(o.usd_per_hour * n for o, n in used),
        gpus=sum(o.gpus_per_replica * n for o, n in used),
    )


def replicas_needed(option: FleetOption, *, target_rate: float, min_replicas: int = 1) -> int:
    """Replicas of one layout alone that sustain `target_rate`."""
    return max(min_replicas, math.ceil(target_rate / option.rate - 1e-9))


def replacement(by: FleetOption, *, rate_ceiling: float, usd_per_hour: float) -> int:
    """How many replicas of `by` replace, in any fleet and at no extra cost, one replica of a
    layout that sustains at most `rate_ceiling` for `usd_per_hour`; 0 if they cost more.

    k = ceil(rate_ceiling / by.rate) replicas of `by` sustain at least as much; a fleet with x
    replicas of the other layout swaps them for ceil(x q) <= x k replicas of `by` (q = the
    rate ratio), costing at most x k by.usd_per_hour <= x usd_per_hour. So that layout is
    never needed for the cheapest fleet (with no limit on `by`'s GPUs or replica counts)."""
    need = math.ceil(rate_ceiling / by.rate - 1e-12)
    return need if need * by.usd_per_hour <= usd_per_hour else 0


def single_layout_fleet(
    option: FleetOption,
    *,
    target_rate: float,
    gpu_limit: int | None = None,
    gpu_limits: Mapping[str, int | None] | None = None,
    min_replicas: int = 1,
    max_replicas: int | None = None,
) -> tuple[Fleet, str]:
    """The fleet of one layout for the target, and why it cannot be had ('' when it can).
    `gpu_limit`: GPUs of the option's hardware available; `gpu_limits`: by hardware id."""
    n = replicas_needed(option, target_rate=target_rate, min_replicas=min_replicas)
    fleet = _make_fleet([option], [n])
    if max_replicas is not None and n > max_replicas:
        return fleet, f"needs {n} replicas, at most {max_replicas} allowed"
    limits = dict(gpu_limits or {})
    if gpu_limit is not None:
        limits[option.hardware] = gpu_limit
    for hardware in option.hardware_ids:
        limit, need = limits.get(hardware), n * option.gpus_on(hardware)
        if limit is not None and need > limit:
            return fleet, f"needs {need} {hardware} GPUs, {limit} available"
    return fleet, ""


def cheapest_fleet(
    options: Sequence[FleetOption],
    *,
    target_rate: float,
    gpu_limits: Mapping[str, int] | None = None,
    min_replicas: int = 1,
    max_replicas: int | None = None,
    exclude: Sequence[Mapping[str, int]] = (),
) -> Fleet | None:
    """The cheapest mix of replicas sustaining `target_rate`, or None if none exists within
    the limits. `gpu_limits`: hardware id -> GPUs available (absent: unlimited). `exclude`:
    fleets (option key -> replicas) known to fail, with every fleet that has no more replicas
    of any layout than one of them (it has less capacity everywhere)."""
    if target_rate <= 0:
        raise ValueError(f"target rate must be positive, got {target_rate}")
    options = [o for o in options if o.rate > 0]
    if not options:
        return None
    failed = [[fleet.get(o.key, 0) for o in options] for fleet in exclude]
    limits = dict(gpu_limits or {})
    program = _Program(options, target_rate, limits, min_replicas, max_replicas, failed)
    first = program.solve(program.objective(o.usd_per_hour for o in options))
    if first is None:
        return None
    best = float(first.fun)
    # Among the cheapest, the most capacity (the most headroom over the target).
    cap = best + COST_TIE_TOLERANCE * max(1.0, abs(best))
    program.add(program.objective(o.usd_per_hour for o in options), -np.inf, cap)
    second = program.solve(program.objective(-o.rate for o in options))
    chosen = second if second is not None else first
    return _make_fleet(options, [round(float(x)) for x in chosen.x[: len(options)]])


class _Program:
    """The integer program's variables and rows. Variables: x (replicas per option), then y
    (1 if an option is used; only when a used option needs min_replicas > 1), then one block
    of z per excluded fleet (1 where this fleet has more replicas than the excluded one)."""

    def __init__(
        self,
        options: Sequence[FleetOption],
        target: float,
        limits: dict[str, int],
        min_replicas: int,
        max_replicas: int | None,
        exclude: Sequence[Sequence[int]],
    ) -> None:
        n = len(options)
        self.n = n
        # An optimum never needs more replicas of one option than that option alone would,
        # or than one more than an excluded fleet had.
        upper = np.array(
            [replicas_needed(o, target_rate=target, min_replicas=min_replicas) for o in options],
            dtype=float,
        )
        for counts in exclude:
            upper = np.maximum(upper, np.asarray(counts, dtype=float) + 1.0)
        if max_replicas is not None:
            upper = np.minimum(upper, max_replicas)
        for i, o in enumerate(options):
            for hw in o.hardware_ids:
                if hw in limits:
                    upper[i] = min(upper[i], limits[hw] // o.gpus_on(hw))
        self.upper = list(upper)
        self.rows: list[dict[int, float]] = []
        self.lows: list[float] = []
        self.highs: list[float] = []
        self.add({i: o.rate for i, o in enumerate(options)}, target, np.inf)
        for hw, limit in sorted(limits.items()):
            gpus = {i: float(o.gpus_on(hw)) for i, o in enumerate(options) if o.gpus_on(hw)}
            if gpus:
                self.add(gpus, -np.inf, float(limit))
        if min_replicas > 1:
            for i in range(n):  # min * y_i <= x_i <= upper_i * y_i
                y = self._new_binary()
                self.add({i: 1.0, y: -float(min_replicas)}, 0.0, np.inf)
                self.add({i: 1.0, y: -float(upper[i])}, -np.inf, 0.0)
        for counts in exclude:
            self._exclude(counts)

    def _new_binary(self) -> int:
        self.upper.append(1.0)
        return len(self.upper) - 1

    def add(self, coefficients: dict[int, float], low: float, high: float) -> None:
        self.rows.append(coefficients)
        self.lows.append(low)
        self.highs.append(high)

    def objective(self, values: Iterable[float]) -> dict[int, float]:
        return dict(enumerate(values))

    def _exclude(self, counts: Sequence[int]) -> None:
        """No fleet with x_i <= counts_i for every i: some x_i >= counts_i + 1 (z_i = 1)."""
        z = [self._new_binary() for _ in range(self.n)]
        for i, zi in enumerate(z):
            self.add({i: 1.0, zi: -(counts[i] + 1.0)}, 0.0, np.inf)
        self.add(dict.fromkeys(z, 1.0), 1.0, np.inf)

    def solve(self, objective: dict[int, float]) -> OptimizeResult | None:
        from scipy.optimize import Bounds, LinearConstraint, milp  # 0.2 s to import: on use

        width = len(self.upper)
        matrix = np.zeros((len(self.rows), width))
        for r, row in enumerate(self.rows):
            for column, value in row.items():
                matrix[r, column] = value
        cost = np.zeros(width)
        for column, value in objective.items():
            cost[column] = value
        # HiGHS prints some MIP diagnostics from C++ to file descriptor 1 whatever `disp`
        # says, which would corrupt `llmsim plan --json`: held back and dropped
        with held_fd(1):
            result = milp(
                cost,
                constraints=LinearConstraint(matrix, self.lows, self.highs),
                integrality=np.ones(width),
                bounds=Bounds(np.zeros(width), np.array(self.upper)),
            )
        return result if result.success else None
