"""Compare recomputed predictions with a golden file (`check`), or rewrite it (`update`).

A row is one metric of one case: `ok` inside its band, `FAIL` outside it (or a string /
boolean that differs), `missing` when the command's output no longer has the metric, `new`
when the golden file has no value for it yet. Only `ok` passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from simulator.errors import SpecError
from simulator.regress.cases import DEFAULT_METRICS, Runner, command, kind, lookup
from simulator.regress.golden import (
    BenchCase,
    Golden,
    MetricGolden,
    OpCase,
    ScenarioCase,
    Tolerance,
    dump_golden,
    load_golden,
)

Status = Literal["ok", "FAIL", "missing", "new"]
AnyCase = ScenarioCase | BenchCase | OpCase


@dataclass(frozen=True)
class Band:
    """`|now - golden| <= atol + rtol * |golden|`; rtol a fraction, atol in the metric's units."""

    rtol: float
    atol: float

    def width(self, golden: float) -> float:
        return self.atol + self.rtol * abs(golden)

    def contains(self, *, now: float, golden: float) -> bool:
        if math.isnan(golden) or math.isnan(now):
            return math.isnan(golden) and math.isnan(now)
        return abs(now - golden) <= self.width(golden)

    def label(self) -> str:
        parts = [f"{self.rtol * 100:g}%"] if self.rtol else []
        parts += [f"{self.atol:g}"] if self.atol or not parts else []
        return "±" + " + ".join(parts)


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def matches(*, now: Any, golden: Any, band: Band) -> bool:
    """Numbers: inside the band; anything else (strings, booleans, null): equal."""
    if _number(golden) and _number(now):
        return band.contains(now=float(now), golden=float(golden))
    return type(now) is type(golden) and now == golden


@dataclass(frozen=True)
class Row:
    """One metric of one case, its golden and recomputed values and the verdict."""

    case: str
    metric: str
    golden: Any
    now: Any
    band: Band
    status: Status

    @property
    def change_pct(self) -> float | None:
        """Relative change in percent; None where it is not a number."""
        if not (_number(self.golden) and _number(self.now)) or self.golden == 0:
            return None
        return (float(self.now) - float(self.golden)) / abs(float(self.golden)) * 100

    def as_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "metric": self.metric,
            "golden": self.golden,
            "now": self.now,
            "change_pct": self.change_pct,
            "rtol": self.band.rtol,
            "atol": self.band.atol,
            "status": self.status,
        }


@dataclass(frozen=True)
class Report:
    """Every row of a golden file, in file order; `updated` when the file was rewritten."""

    path: Path
    rows: list[Row]
    updated: bool = False

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if r.status != "ok"]

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_json(self) -> dict[str, Any]:
        return {
            "golden": str(self.path),
            "ok": self.ok,
            "updated": self.updated,
            "num_cases": len(dict.fromkeys(r.case for r in self.rows)),
            "num_metrics": len(self.rows),
            "num_failed": len(self.failures),
            "rows": [r.as_json() for r in self.rows],
        }


def band_of(*levels: Tolerance | Golden) -> Band:
    """rtol and atol, each from the first level (metric, case, file) that sets it."""
    rtol = next(lv.rtol for lv in levels if lv.rtol is not None)
    atol = next(lv.atol for lv in levels if lv.atol is not None)
    return Band(rtol=rtol, atol=atol)


def compare(*, case: str, metric: str, golden: Any, output: dict[str, Any], band: Band) -> Row:
    """The row of one metric: its golden value against the command's output."""
    found, now = lookup(output, metric)
    if not found:
        status: Status = "missing"
    elif golden is None:
        status = "new"
    else:
        status = "ok" if matches(now=now, golden=golden, band=band) else "FAIL"
    return Row(case, metric, golden, now, band, status)


def _case_output(golden_path: Path, index: int, case: AnyCase, run: Runner) -> dict[str, Any]:
    """The case's command output; its bad input names the golden file and the case."""
    try:
        return run(command(case, base_dir=golden_path.parent))
    except SpecError as exc:
        raise SpecError(
            f"case {case.name!r}: {exc.line()}", source=str(golden_path), field=f"cases.{index}"
        ) from None


def _case_rows(golden: Golden, case: AnyCase, output: dict[str, Any]) -> list[Row]:
    """One row per metric; a case with none is one `new` row (it checks nothing yet)."""
    if not case.metrics:
        return [Row(case.name, "(no metrics)", None, None, band_of(case, golden), "new")]
    return [
        compare(
            case=case.name,
            metric=name,
            golden=m.value,
            output=output,
            band=band_of(m, case, golden),
        )
        for name, m in case.metrics.items()
    ]


def check(path: str | Path, *, run: Runner) -> Report:
    """Recompute every case of the golden file at `path` with `run` (the CLI's
    `inprocess.run_command`) and compare (nothing is written)."""
    path = Path(path)
    golden = load_golden(path)
    rows = [
        row
        for i, case in enumerate(golden.cases)
        for row in _case_rows(golden, case, _case_output(path, i, case, run))
    ]
    return Report(path, rows)


def _updated_case(golden_path: Path, index: int, case: AnyCase, rows: list[Row]) -> AnyCase:
    """The case with every metric's value set to now. A metric the output lacks is bad input
    (remove it from the file)."""
    for row in rows:
        if row.status == "missing":
            raise SpecError(
                f"case {case.name!r}: the output has no metric {row.metric!r}",
                source=str(golden_path),
                field=f"cases.{index}.metrics",
            )
    now = {r.metric: r.now for r in rows}
    metrics = {name: m.model_copy(update={"value": now[name]}) for name, m in case.metrics.items()}
    return case.model_copy(update={"metrics": metrics})


def update(path: str | Path, *, run: Runner) -> Report:
    """Recompute every case and rewrite the golden values in place (bands and cases kept);
    returns the comparison with the values as they were before."""
    path = Path(path)
    golden = load_golden(path)
    rows: list[Row] = []
    cases: list[AnyCase] = []
    for i, case in enumerate(golden.cases):
        output = _case_output(path, i, case, run)
        if not case.metrics:
            names = [m for m in DEFAULT_METRICS[kind(case)] if lookup(output, m)[0]]
            case = case.model_copy(update={"metrics": {m: MetricGolden() for m in names}})
        case_rows = _case_rows(golden, case, output)
        cases.append(_updated_case(path, i, case, case_rows))
        rows += case_rows
    dump_golden(golden.model_copy(update={"cases": cases}), path)
    return Report(path, rows, updated=True)
