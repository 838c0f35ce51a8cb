"""The readable diff of a regression report: a rich table, or the same as plain text."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.table import Table

from simulator.regress.check import Report, Row

STYLE = {"ok": "green", "FAIL": "bold red", "missing": "bold red", "new": "yellow"}


def _value(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x)


def _change(row: Row) -> str:
    pct = row.change_pct
    return "" if pct is None else f"{pct:+.3g}%"


def table(rows: list[Row], *, title: str) -> Table:
    """case, metric, golden, now, change %, band, result: one line per row."""
    t = Table("case", "metric", "golden", "now", "change", "band", "result", title=title)
    for r in rows:
        t.add_row(
            r.case,
            r.metric,
            _value(r.golden),
            _value(r.now),
            _change(r),
            r.band.label(),
            f"[{STYLE[r.status]}]{r.status}[/]",
        )
    return t


def summary_line(report: Report) -> str:
    """One line: how many metrics were checked and which left their band."""
    n, bad = len(report.rows), report.failures
    cases = len(dict.fromkeys(r.case for r in report.rows))
    if report.updated:
        moved = sum(r.status != "ok" for r in report.rows)
        return (
            f"regress: wrote {n} golden values of {cases} cases to {report.path} "
            f"({moved} were outside their band or new)"
        )
    if not bad:
        return f"regress: {n} metrics of {cases} cases within their bands ({report.path})"
    names = ", ".join(f"{r.case}/{r.metric} ({r.status})" for r in bad)
    hint = "; if the change is intended, rerun with --update"
    return f"regress: {len(bad)} of {n} metrics left their band: {names}{hint}"


def render(report: Report, console: Console) -> None:
    """The whole table, then the summary line."""
    verb = "updated" if report.updated else "checked"
    console.print(table(report.rows, title=f"{report.path} ({verb})"))
    console.print(summary_line(report), markup=False, highlight=False)


def diff_text(report: Report, *, footer: str | None = None, width: int = 120) -> str:
    """The rows that did not pass, then `footer` (default: the summary line), as plain text
    (for test failures)."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, no_color=True, highlight=False, emoji=False)
    console.print(table(report.failures, title=str(report.path)))
    console.print(summary_line(report) if footer is None else footer, markup=False)
    return buf.getvalue()
