"""Golden-prediction regression checks (`llmsim regress`, and the pytest plugin).

A golden file lists cases (a scenario file, or an `llmsim bench` / `llmsim op` command line),
the metrics to check with their golden values, and tolerance bands (golden.py describes the
format). `check` recomputes every case and reports each metric as ok or not; `update`
rewrites the golden values on purpose. Nothing here judges whether a prediction is right: a
golden records what this version predicts, so a change is seen and accepted deliberately.
"""

from __future__ import annotations

from pathlib import Path

from simulator.errors import SpecError
from simulator.regress.check import Band, Report, Row, check, compare, matches, update
from simulator.regress.golden import Golden, dump_golden, load_golden
from simulator.regress.render import diff_text, render

# The project's own grid, in a source checkout.
PROJECT_GOLDEN = Path(__file__).resolve().parents[2] / "regress" / "golden.yaml"
DEFAULT_NAME = "regress.yaml"


def default_golden(cwd: Path | None = None) -> Path:
    """`regress.yaml` in `cwd` (default: the current directory), else the project's own
    `regress/golden.yaml`; SpecError when there is neither."""
    here = (cwd or Path.cwd()) / DEFAULT_NAME
    if here.is_file():
        return here
    if PROJECT_GOLDEN.is_file():
        return PROJECT_GOLDEN
    raise SpecError(f"no {DEFAULT_NAME} in {here.parent}; pass the golden file", field="golden")


__all__ = [
    "Band",
    "Golden",
    "Report",
    "Row",
    "check",
    "compare",
    "default_golden",
    "diff_text",
    "dump_golden",
    "load_golden",
    "matches",
    "render",
    "update",
]
