"""pytest plugin (registered as `llmsim` through the `pytest11` entry point): keep a user's
predictions inside their tolerance bands from a test.

```python
def test_predictions(llmsim_regress):
    llmsim_regress.check("goldens/regress.yaml")          # relative to this test file
    ttft = simulator.estimate(model="llama-3.1-8b", hardware="h100_sxm").ttft_s
    llmsim_regress.assert_within(ttft, 0.0233, rtol=0.05, name="ttft_s")
```

A prediction outside its band fails the test with the same diff table `llmsim regress`
prints; a bad golden file fails it with the one-line error. `pytest --llmsim-update` rewrites
the golden files the tests check instead (as `llmsim regress --update`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from simulator.cli.inprocess import run_command
from simulator.errors import SpecError
from simulator.regress import Band, Report, Row, check, diff_text, matches, update


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmsim")
    group.addoption(
        "--llmsim-update",
        action="store_true",
        default=False,
        help="llmsim_regress.check() rewrites its golden file instead of checking it",
    )


class RegressChecker:
    """What the `llmsim_regress` fixture gives a test; paths are relative to `base_dir`."""

    def __init__(self, *, base_dir: Path, update: bool) -> None:
        self.base_dir = base_dir
        self.update = update

    def check(self, golden: str | Path) -> Report:
        """Recompute the golden file's cases; fail the test when a metric leaves its band
        (with --llmsim-update: rewrite the file and pass). Returns the report."""
        path = self.base_dir / golden
        try:
            run = run_command
            report = update(path, run=run) if self.update else check(path, run=run)
        except SpecError as exc:
            pytest.fail(f"llmsim: error: {exc.line()}", pytrace=False)
        if not report.ok and not report.updated:
            pytest.fail(diff_text(report), pytrace=False)
        return report

    def assert_within(
        self,
        value: Any,
        golden: Any,
        *,
        rtol: float = 0.01,
        atol: float = 0.0,
        name: str = "value",
    ) -> None:
        """Fail the test unless |value - golden| <= atol + rtol * |golden| (strings and
        booleans: equal)."""
        band = Band(rtol=rtol, atol=atol)
        ok = matches(now=value, golden=golden, band=band)
        if not ok:
            row = Row("assert_within", name, golden, value, band, "FAIL")
            footer = f"{name} = {value!r} is outside {golden!r} {band.label()}"
            pytest.fail(diff_text(Report(Path(name), [row]), footer=footer), pytrace=False)


@pytest.fixture
def llmsim_regress(request: pytest.FixtureRequest) -> RegressChecker:
    """Check predictions against golden files or values; see `RegressChecker`."""
    return RegressChecker(
        base_dir=request.path.parent, update=bool(request.config.getoption("llmsim_update"))
    )
