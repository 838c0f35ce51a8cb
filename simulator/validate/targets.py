"""Goals and CI ceilings of the validation suites (`llmsim validate --check`).

`targets.yaml` gives, per suite and statistic, the documented goal (None: none documented)
and, per device, the ceiling above which CI fails. `check_targets` compares a summary (the
`llmsim validate --json` object) with them, device by device. A row fails when the error is
above its ceiling, when a suite or device has no ceiling, or when a device with a ceiling has
no rows; being above the goal is reported, not failed. Union suites (`iteration`) are
judged through their parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator
from rich.console import Console
from rich.table import Table

from simulator.specs._base import Frozen
from simulator.specs.loader import read_yaml, validate
from simulator.validate.summary import SUITE_NAMES, UNIONS

TARGETS_PATH = Path(__file__).with_name("targets.yaml")
StatName = Literal["mape_pct", "median_ape_pct", "p90_ape_pct", "worst_ape_pct"]
Verdict = Literal["meets goal", "above goal", "no goal", "ABOVE CEILING", "no ceiling", "no data"]
PASSING: tuple[Verdict, ...] = ("meets goal", "above goal", "no goal")
STAT_LABELS = {
    "mape_pct": "MAPE",
    "median_ape_pct": "median",
    "p90_ape_pct": "p90",
    "worst_ape_pct": "worst",
}


class StatTarget(Frozen):
    """One statistic of one suite: the documented goal (one for every device, or per device
    where it was set for some devices only) and the per-device CI ceiling, in %."""

    goal: float | dict[str, float] | None = None
    ceiling: dict[str, float] = Field(min_length=1)

    @field_validator("goal")
    @classmethod
    def _non_negative(cls, goal: float | dict[str, float] | None) -> Any:
        values = goal.values() if isinstance(goal, dict) else [] if goal is None else [goal]
        if any(v < 0 for v in values):
            raise ValueError("a goal must be >= 0")
        return goal

    def goal_for(self, device: str) -> float | None:
        """The goal on `device` (None: no goal documented there)."""
        return self.goal.get(device) if isinstance(self.goal, dict) else self.goal


class Targets(Frozen):
    suites: dict[str, dict[StatName, StatTarget]]

    @field_validator("suites")
    @classmethod
    def _known(cls, suites: dict[str, Any]) -> dict[str, Any]:
        for name in suites:
            if name not in SUITE_NAMES or name in UNIONS:
                raise ValueError(f"unknown suite {name!r} ({', '.join(SUITE_NAMES)}; not a union)")
        return suites


def load_targets(path: str | Path | None = None) -> Targets:
    """Read and validate a targets file (default: TARGETS_PATH); bad input raises SpecError
    naming file and field."""
    path = Path(path or TARGETS_PATH)
    return validate(Targets, read_yaml(path), source=str(path))


@dataclass(frozen=True)
class TargetRow:
    """One (suite, device, statistic) against its goal and ceiling."""

    suite: str
    device: str
    stat: str
    value: float | None
    goal: float | None
    ceiling: float | None
    verdict: Verdict

    @property
    def ok(self) -> bool:
        return self.verdict in PASSING

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("suite", "device", "stat", "value", "goal")} | {
            "ceiling": self.ceiling,
            "verdict": self.verdict,
            "ok": self.ok,
        }


def verdict(*, value: float | None, goal: float | None, ceiling: float | None) -> Verdict:
    """The verdict of one value; an error equal to a limit is within it."""
    if value is None or math.isnan(value):
        return "no data"
    if ceiling is None:
        return "no ceiling"
    if value > ceiling:
        return "ABOVE CEILING"
    if goal is None:
        return "no goal"
    return "meets goal" if value <= goal else "above goal"


@dataclass(frozen=True)
class CheckResult:
    rows: list[TargetRow]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def suites_by_standing(self) -> dict[str, list[str]]:
        """Suite names under "meets goal", "above goal", "no goal" and "failed"."""
        out: dict[str, list[str]] = {
            "meets goal": [],
            "above goal": [],
            "no goal": [],
            "failed": [],
        }
        for suite in dict.fromkeys(r.suite for r in self.rows):
            verdicts = {r.verdict for r in self.rows if r.suite == suite}
            if not verdicts <= set(PASSING):
                out["failed"].append(suite)
            elif "above goal" in verdicts:
                out["above goal"].append(suite)
            elif verdicts == {"no goal"}:
                out["no goal"].append(suite)
            else:
                out["meets goal"].append(suite)
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "suites": self.suites_by_standing(),
            "rows": [r.as_json() for r in self.rows],
        }


def _suite_rows(
    name: str, entry: dict[str, Any], stats: dict[StatName, StatTarget]
) -> list[TargetRow]:
    rows = []
    for stat, target in stats.items():
        for device in sorted(set(entry["by_device"]) | set(target.ceiling)):
            value = entry["by_device"].get(device, {}).get(stat)
            ceiling, goal = target.ceiling.get(device), target.goal_for(device)
            v = verdict(value=value, goal=goal, ceiling=ceiling)
            rows.append(TargetRow(name, device, stat, value, goal, ceiling, v))
    return rows


def check_targets(summary: dict[str, Any], targets: Targets) -> CheckResult:
    """Every suite of `summary` (but unions) against its targets, device by device."""
    rows: list[TargetRow] = []
    for name, entry in summary["suites"].items():
        if name in UNIONS:
            continue
        stats = targets.suites.get(name)
        if stats is None:
            rows.append(
                TargetRow(name, "all", "mape_pct", entry["mape_pct"], None, None, "no ceiling")
            )
            continue
        rows += _suite_rows(name, entry, stats)
    return CheckResult(rows)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}%"


def render_check(result: CheckResult, console: Console) -> None:
    """The table of every row, then which suites meet their goal and which failed."""
    table = Table(
        "suite",
        "device",
        "statistic",
        "error",
        "goal",
        "CI ceiling",
        "verdict",
        title=f"Validation against goals and CI ceilings ({TARGETS_PATH.name})",
    )
    for r in result.rows:
        style = "green" if r.verdict == "meets goal" else "yellow" if r.ok else "bold red"
        table.add_row(
            r.suite,
            r.device,
            STAT_LABELS.get(r.stat, r.stat),
            _pct(r.value),
            _pct(r.goal),
            _pct(r.ceiling),
            f"[{style}]{r.verdict}[/]",
        )
    console.print(table)
    labels = {
        "meets goal": "meet their goal",
        "above goal": "above their goal, within their CI ceiling",
        "no goal": "no documented goal, within their CI ceiling",
        "failed": "FAILED (above the CI ceiling, or no ceiling / no data)",
    }
    for standing, names in result.suites_by_standing().items():
        if names:
            console.print(f"{labels[standing]}: {', '.join(names)}", markup=False, highlight=False)
