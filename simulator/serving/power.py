"""A power budget over a fleet's GPUs (a scenario's `power_budget:`, `PowerBudgetSpec`).

Every `sample_s` the controller estimates the fleet's draw: each replica in a step (or a run of
decode steps) draws, per GPU, the power of that step's shape (`draw_w`, the energy model's
`step_power_w` handed in by the run: serving does not import `runs`), each other one its parked
draw; times its GPUs. `window_w` is the mean of the samples of the last `window_s`.

`static` caps every replica from the start (the run builds its timers under budget / GPUs per
GPU). `dynamic` follows POLCA's control loop (arXiv:2308.12908; as its patent application US
2025/0377708 A1 words it: above a first threshold of the servers' draw cap low-priority
workloads' frequency, above a second cap all, uncap once the draw is a margin below): when
`window_w` exceeds cap_threshold x budget, it picks replicas, lowest priority first (the
groups' `power_priority`, then the last group's, highest index first), until their windowed
draw above `cap_w` per GPU, taken off, brings the estimate under the threshold, and caps them
`reaction_s` later (above `cap_all_threshold` x budget, POLCA's second threshold, every replica
that is on, whatever its priority); when `window_w` falls below release_threshold x budget it
lifts the cap of the highest-priority capped replica, `reaction_s` later (one at a time:
lifting all at once swings the fleet back over the threshold). Once an action is in place the
window restarts from the samples taken since: capping more needs one sample over the threshold
(safety first), lifting a cap a full window under the release threshold. Each round of caps
takes reaction_s + sample_s and caps at least one replica, so when capping every replica fits
the budget (GPUs x cap_w <= budget) the draw stays over the budget no longer than window_s +
replicas x (reaction_s + sample_s) per excursion: the overshoot the policy states.
A replica is capped by swapping its step timer for one built on `with_power_cap(hardware,
cap)` (built once per group), and woken, so a decode run in progress stops at its current
step and the next step is timed capped.

`policy: none` samples the draw and never caps: the run's requests and steps are those of a run
without the block (the sampler only reads).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import simpy

from simulator.serving.replica import Replica
from simulator.serving.steptime import StepTimer
from simulator.specs.scenario import PowerBudgetSpec

POWER_COLUMNS = ("time_s", "draw_w", "window_w", "capped_replicas")
CAP_COLUMNS = ("time_s", "replica", "capped")
# What the draw estimate reads of a replica's step: a steps table's columns (metrics.recorder)
STEP_COLUMNS = ("start_s", "end_s", "num_seqs", "prefill_tokens", "decode_tokens", "kv_used_blocks")

# watts of one busy GPU of group `g` (capped or not) during each row of a steps table
DrawFn = Callable[[int, bool, pd.DataFrame], np.ndarray]


@dataclass(frozen=True)
class PowerBudget:
    """A fleet power budget as the serving loop needs it: the policy, per replica group the
    GPUs of one replica, the parked draw of one GPU (uncapped, capped) and the step timer
    under the cap, the per-GPU cap, and the draw of a step (`DrawFn`)."""

    spec: PowerBudgetSpec
    gpus: Sequence[int]
    parked_w: Sequence[tuple[float, float]]
    capped_timers: Sequence[StepTimer]
    cap_w: float
    draw_w: DrawFn
    priorities: Sequence[int] = ()  # per group, lower capped first (empty: all equal)


class PowerController:
    def __init__(
        self,
        env: simpy.Environment,
        budget: PowerBudget,
        *,
        replicas: Sequence[Replica],
        group_of: dict[int, int],
        finished: Callable[[], bool],
        on: Callable[[int], bool] | None = None,
    ) -> None:
        """`on(index)`: whether replica `index` is on (an autoscaled fleet's off replicas draw
        nothing and are not capped); None: every replica is."""
        self.env, self.budget, self.spec = env, budget, budget.spec
        self.on = on
        self.replicas = list(replicas)
        self.groups = [group_of[r.index] for r in self.replicas]
        self.gpus = np.array([budget.gpus[g] for g in self.groups], dtype=float)
        self.finished = finished
        self.uncapped = [r.timer for r in self.replicas]
        self.capped = [False] * len(self.replicas)
        # lowest priority first: the groups' priorities, then the last group's replicas,
        # highest index first
        prio = budget.priorities or [0] * len(budget.gpus)
        self.order = sorted(
            range(len(self.replicas)), key=lambda i: (prio[self.groups[i]], -self.groups[i], -i)
        )
        self.pending = False  # an action decided, not yet in place
        self.rows: list[tuple[float, float, float, int]] = []
        self._draws: list[np.ndarray] = []  # per-replica watts of the samples in the window
        self.capped_replica_s = 0.0
        self.events: list[tuple[float, int, bool]] = []  # (time_s, replica index, capped)
        if self.spec.policy == "static":
            self._apply(range(len(self.replicas)), capped=True)

    def run(self) -> Generator[simpy.Event, Any, None]:
        spec = self.spec
        keep = max(round(spec.window_s / spec.sample_s), 1)
        while not self.finished():
            yield self.env.timeout(spec.sample_s)
            self.capped_replica_s += sum(self.capped) * spec.sample_s
            draws = self.sample()
            self._draws.append(draws)
            if len(self._draws) > keep:
                self._draws.pop(0)
            window = np.mean(self._draws, axis=0)
            self.rows.append(
                (self.env.now, float(draws.sum()), float(window.sum()), sum(self.capped))
            )
            if spec.policy == "dynamic" and not self.pending:
                self.decide(window, full=len(self._draws) >= keep)

    def sample(self) -> np.ndarray:
        """Each replica's draw now, in watts (all its GPUs)."""
        now = self.env.now
        watts = np.empty(len(self.replicas))
        busy: dict[tuple[int, bool], list[tuple[int, tuple[float, ...]]]] = {}
        for i, rep in enumerate(self.replicas):
            g, capped = self.groups[i], self.capped[i]
            if self.on is not None and not self.on(rep.index):
                watts[i] = 0.0
                continue
            act = rep.activity
            if act is None or not act[0] <= now < act[1]:
                watts[i] = self.budget.parked_w[g][capped]
                continue
            _, _, step_s, seqs, prefill, decodes = act
            row = (0.0, step_s, seqs, prefill, decodes, rep.kv.used)
            busy.setdefault((g, capped), []).append((i, row))
        for (g, capped), rows in busy.items():
            frame = pd.DataFrame([r for _, r in rows], columns=list(STEP_COLUMNS))
            per_gpu = self.budget.draw_w(g, capped, frame)
            watts[[i for i, _ in rows]] = per_gpu
        return watts * self.gpus

    def decide(self, window: np.ndarray, *, full: bool) -> None:
        """Cap or release by the windowed draw (`full`: the window holds only samples since
        the last action, as many as it keeps; a release waits for that, a cap does not)."""
        spec, budget_w = self.spec, self.spec.budget_w
        total = float(window.sum())
        if total > spec.cap_threshold * budget_w:
            every = spec.cap_all_threshold is not None and total > spec.cap_all_threshold * budget_w
            chosen = []
            estimate = total
            for i in self.order:
                if not every and estimate <= spec.cap_threshold * budget_w:
                    break
                if self.capped[i] or (self.on is not None and not self.on(self.replicas[i].index)):
                    continue
                chosen.append(i)
                estimate -= max(float(window[i]) - self.budget.cap_w * self.gpus[i], 0.0)
            if chosen:
                self.pending = True
                self.env.process(self._later(chosen, capped=True))
        elif full and total < spec.release_threshold * budget_w and any(self.capped):
            first = next(i for i in reversed(self.order) if self.capped[i])
            self.pending = True
            self.env.process(self._later([first], capped=False))

    def _later(self, which: Sequence[int], *, capped: bool) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(self.spec.reaction_s)
        self._apply(which, capped=capped)
        self.pending = False
        self._draws.clear()  # the next decisions read samples taken since

    def _apply(self, which: Sequence[int] | range, *, capped: bool) -> None:
        for i in which:
            rep = self.replicas[i]
            self.capped[i] = capped
            self.events.append((self.env.now, rep.index, capped))
            rep.timer = self.budget.capped_timers[self.groups[i]] if capped else self.uncapped[i]
            rep.wake()

    def frame(self) -> pd.DataFrame:
        """The samples: the fleet's draw, its windowed mean, the replicas capped (POWER_COLUMNS)."""
        return pd.DataFrame(self.rows, columns=list(POWER_COLUMNS))

    def caps(self) -> pd.DataFrame:
        """When each replica was capped or released (CAP_COLUMNS), in time order."""
        return pd.DataFrame(self.events, columns=list(CAP_COLUMNS))


def capped_steps(steps: pd.DataFrame, caps: pd.DataFrame) -> np.ndarray:
    """Which of `steps` (a steps table) started on a capped replica, by the cap events."""
    out = np.zeros(len(steps), dtype=bool)
    if not len(caps) or not len(steps):
        return out
    replica = steps["replica"].to_numpy()
    start = steps["start_s"].to_numpy(dtype=float)
    for r, events in caps.groupby("replica", sort=False):
        mine = np.flatnonzero(replica == r)
        times = events["time_s"].to_numpy(dtype=float)
        state = events["capped"].to_numpy(dtype=bool)
        last = np.searchsorted(times, start[mine], side="right") - 1  # the event in force
        out[mine] = np.where(last >= 0, state[np.maximum(last, 0)], False)
    return out
