"""Autoscaling one replica group over a run (a scenario's `autoscale:`, `AutoscaleSpec`).

The group's replicas are built up to `max_replicas`; its first `count` serve from the start,
the others are off. Every `interval_s` the autoscaler wants ceil(load / target) replicas,
clamped to [min_replicas, max_replicas], where the load is the outstanding requests of the
group's replicas or the sum of their KV usage: Kubernetes' Horizontal Pod Autoscaler rule
(desired = ceil(current x metric / target), kubernetes.io/docs/tasks/run-application/
horizontal-pod-autoscale/). It scales up at once and down to the largest want of the last
`scale_down_delay_s` (the HPA's stabilization window, 300 s by default there).

Scaling up revives a draining replica first (its weights are still loaded); otherwise an off
replica loads its weights for `load_s` (bytes per GPU / the source's bandwidth, from the run)
and is routed nothing until that is over. Scaling down stops routing to the idlest serving
replica; it drains its requests and is off (no GPU time) once it holds none, checked at each
evaluation. GPU time counts from the start of a load to the end of a drain. `rows` holds the
replica counts at each evaluation and change, `gpu_seconds` the group's GPU time at the run's end.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import simpy

from simulator.serving.replica import Replica
from simulator.serving.router import Router
from simulator.specs.scenario import AutoscaleSpec

FLEET_COLUMNS = ("time_s", "serving", "loading", "draining", "wanted")


@dataclass(frozen=True)
class FleetScaling:
    """An autoscaled group as the serving loop needs it: the policy, the seconds a new
    replica loads its weights, and the GPUs of one replica."""

    spec: AutoscaleSpec
    initial: int  # replicas serving at the start (the group's count)
    load_s: float
    gpus_per_replica: int


class Autoscaler:
    def __init__(
        self,
        env: simpy.Environment,
        scaling: FleetScaling,
        *,
        router: Router,
        fixed: Sequence[Replica],
        scaled: Sequence[Replica],
        finished: Callable[[], bool],
    ) -> None:
        """`fixed`: the replicas of the other groups (always routed to); `scaled`: the
        group's, max_replicas of them; `finished`: whether every request is done."""
        self.env, self.scaling, self.spec = env, scaling, scaling.spec
        self.router, self.fixed, self.scaled = router, list(fixed), list(scaled)
        self.finished = finished
        self.state = ["serving" if i < scaling.initial else "off" for i in range(len(scaled))]
        self.on_since: list[float | None] = [
            0.0 if i < scaling.initial else None for i in range(len(scaled))
        ]
        self.gpu_seconds = 0.0
        self.wanted = scaling.initial
        self._wants: deque[tuple[float, int]] = deque()
        self.rows: list[tuple[float, int, int, int, int]] = []
        self._update()

    def count(self, state: str) -> int:
        return self.state.count(state)

    def _update(self) -> None:
        """Route to the fixed replicas and the serving ones; record the counts now."""
        serving = [r for r, s in zip(self.scaled, self.state, strict=True) if s == "serving"]
        self.router.replicas = sorted([*self.fixed, *serving], key=lambda r: r.index)
        row = (
            self.env.now,
            len(serving),
            self.count("loading"),
            self.count("draining"),
            self.wanted,
        )
        if self.rows and self.rows[-1][0] == row[0]:
            self.rows[-1] = row
        else:
            self.rows.append(row)

    def _off(self, i: int, now: float) -> None:
        since = self.on_since[i]
        assert since is not None
        self.gpu_seconds += (now - since) * self.scaling.gpus_per_replica
        self.state[i], self.on_since[i] = "off", None

    def run(self) -> Generator[simpy.Event, Any, None]:
        spec = self.spec
        while True:
            yield self.env.timeout(spec.interval_s)
            if self.finished():
                return
            self.evaluate()

    def close(self, end_s: float) -> None:
        """The run ended at `end_s`: every replica still on stops there."""
        last = (end_s, self.count("serving"), self.count("loading"), self.count("draining"))
        for i, since in enumerate(self.on_since):
            if since is not None:
                self._off(i, max(end_s, since))
        if not self.rows or self.rows[-1][0] < end_s:
            self.rows.append((*last, self.wanted))

    def evaluate(self) -> None:
        spec, now = self.spec, self.env.now
        for i, rep in enumerate(self.scaled):  # drained replicas stop
            if self.state[i] == "draining" and rep.outstanding == 0:
                self._off(i, now)
        active = [r for r, s in zip(self.scaled, self.state, strict=True) if s != "off"]
        if spec.metric == "outstanding":
            load = float(sum(r.outstanding for r in active))
        else:
            load = sum(r.kv.usage for r in active)
        want = min(max(math.ceil(load / spec.target - 1e-9), spec.min_replicas), spec.max_replicas)
        self._wants.append((now, want))
        while self._wants and self._wants[0][0] < now - spec.scale_down_delay_s:
            self._wants.popleft()
        current = self.count("serving") + self.count("loading")
        if want > current:
            self.wanted = want
            for _ in range(want - current):
                self._scale_up()
        else:
            self.wanted = max(w for _, w in self._wants)
            for _ in range(current - self.wanted):
                if not self._scale_down():
                    break
        self._update()

    def _scale_up(self) -> None:
        draining = [i for i, s in enumerate(self.state) if s == "draining"]
        if draining:  # still loaded: serves again at once
            self.state[draining[0]] = "serving"
            return
        i = self.state.index("off")
        self.state[i], self.on_since[i] = "loading", self.env.now
        self.env.process(self._load(i))

    def _load(self, i: int) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(self.scaling.load_s)
        self.state[i] = "serving"
        self._update()

    def _scale_down(self) -> bool:
        """Drain the idlest serving replica (ties: the highest index); False when none is
        left to drain above min_replicas."""
        serving = [i for i, s in enumerate(self.state) if s == "serving"]
        if len(serving) <= self.spec.min_replicas:
            return False
        i = min(serving, key=lambda j: (self.scaled[j].outstanding, -j))
        if self.scaled[i].outstanding == 0:
            self._off(i, self.env.now)
        else:
            self.state[i] = "draining"
        return True

    def frame(self) -> pd.DataFrame:
        """The replica counts over time: a row per evaluation and change (FLEET_COLUMNS)."""
        return pd.DataFrame(self.rows, columns=list(FLEET_COLUMNS))
