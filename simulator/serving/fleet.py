"""Autoscaling replica groups over a run (a scenario's `autoscale:`, one `AutoscaleSpec` per
group). `Fleet` routes to every fixed group's replicas and to the serving replicas of each
autoscaled group; an `Autoscaler` scales one group, on its own metric and limits.

The group's replicas are built up to `max_replicas`; its first `count` serve from the start,
the others are off. Every `interval_s` the autoscaler wants ceil(load / target) replicas,
clamped to [min_replicas, max_replicas], where the load is the outstanding requests of the
group's replicas or the sum of their KV usage: Kubernetes' Horizontal Pod Autoscaler rule
(desired = ceil(current x metric / target), kubernetes.io/docs/tasks/run-application/
horizontal-pod-autoscale/). It scales up at once and down to the largest want of the last
`scale_down_delay_s` (the HPA's stabilization window, 300 s by default there). Each group is
one HPA of its own: its load is its own replicas'.

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
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import simpy

from simulator.serving.replica import Replica
from simulator.serving.router import Router
from simulator.specs.scenario import AutoscaleSpec

FLEET_COLUMNS = ("time_s", "serving", "loading", "draining", "wanted")
# A fleet frame also has a `group` column (the autoscaled group of each row); tables saved
# before it had one group and no such column.


@dataclass(frozen=True)
class FleetScaling:
    """An autoscaled group as the serving loop needs it: the policy, the seconds a new
    replica loads its weights, and the GPUs of one replica."""

    spec: AutoscaleSpec
    initial: int  # replicas serving at the start (the group's count)
    load_s: float
    gpus_per_replica: int


class Fleet:
    """Every autoscaled group of a run and the routers' view of them: each router (a
    colocated fleet's one; a disaggregated one's prefill and decode routers) routes to the
    fixed replicas of its groups and the serving ones of its autoscaled groups."""

    def __init__(
        self,
        env: simpy.Environment,
        scalings: Sequence[FleetScaling],
        *,
        routers: Sequence[Router],
        replicas: Sequence[Replica],
        group_of: Mapping[int, int] | Sequence[int],
        finished: Callable[[], bool],
    ) -> None:
        """`routers`: each routing over all the replicas of its groups, off ones included."""
        scaled = {s.spec.group for s in scalings}
        # per router: its fixed replicas, and the groups of it that are autoscaled
        self.routes = [
            (
                router,
                [r for r in router.replicas if group_of[r.index] not in scaled],
                {group_of[r.index] for r in router.replicas} & scaled,
            )
            for router in routers
        ]
        self.scalers: list[Autoscaler] = []  # routed to once all are built
        self.scalers = [
            Autoscaler(
                env,
                s,
                scaled=[r for r in replicas if group_of[r.index] == s.spec.group],
                finished=finished,
                on_change=self.route,
            )
            for s in scalings
        ]
        # each scaled replica's autoscaler and its position there
        self._slot = {r.index: (s, i) for s in self.scalers for i, r in enumerate(s.scaled)}
        self.route()
        for scaler in self.scalers:
            env.process(scaler.run())

    def route(self) -> None:
        """Route to the fixed replicas and every group's serving ones."""
        for router, fixed, groups in self.routes:
            serving = [r for s in self.scalers if s.spec.group in groups for r in s.serving()]
            router.replicas = sorted([*fixed, *serving], key=lambda r: r.index)

    def close(self, end_s: float) -> None:
        for scaler in self.scalers:
            scaler.close(end_s)

    def frame(self) -> pd.DataFrame:
        """Each group's replica counts over time (FLEET_COLUMNS and `group`), by group."""
        frames = [s.frame().assign(group=s.spec.group) for s in self.scalers]
        frame = pd.concat(frames, ignore_index=True)
        return frame[["time_s", "group", *FLEET_COLUMNS[1:]]]

    def is_on(self, index: int) -> bool:
        """Whether replica `index` is on (loading, serving or draining); a fixed one always."""
        slot = self._slot.get(index)
        return slot is None or slot[0].state[slot[1]] != "off"

    def gpu_seconds(self) -> dict[int, float]:
        """Each autoscaled group's GPU-seconds on (loading, serving or draining)."""
        return {s.spec.group: s.gpu_seconds for s in self.scalers}


class Autoscaler:
    def __init__(
        self,
        env: simpy.Environment,
        scaling: FleetScaling,
        *,
        scaled: Sequence[Replica],
        finished: Callable[[], bool],
        on_change: Callable[[], None],
    ) -> None:
        """`scaled`: the group's replicas, max_replicas of them; `finished`: whether every
        request is done; `on_change`: called when the serving replicas change (routing)."""
        self.env, self.scaling, self.spec = env, scaling, scaling.spec
        self.scaled = list(scaled)
        self.finished = finished
        self.on_change = on_change
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

    def serving(self) -> list[Replica]:
        return [r for r, s in zip(self.scaled, self.state, strict=True) if s == "serving"]

    def _update(self) -> None:
        """Route to the serving replicas; record the counts now."""
        self.on_change()
        row = (
            self.env.now,
            self.count("serving"),
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
