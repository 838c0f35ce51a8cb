"""The report renders in a real browser: Debian's chromium, headless, loads the file offline,
logs nothing to the console, and plotly draws every figure with its traces.

Chromium writes every console message (log, warning, error, uncaught exception) to stderr with
`--enable-logging=stderr` as `...:CONSOLE...] "message", source: URL (line)`, without its
level; the report itself logs nothing, so any console message fails the test.
`test_the_console_check_can_fail` proves the check sees one. Without chromium the tests skip,
except in CI (`CI=true`), where `.ci/run` installs it and its absence is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from simulator.report import write_report

CONSOLE = re.compile(r'CONSOLE[^\]]*\] "(.*)", source: (.*)')
FIGURE = re.compile(r'id="(fig-\d+)"')
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # tests may run as root in a container
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=5000",  # let plotly's timers run before the DOM is dumped
    "--dump-dom",
)


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing in CI (.ci/run installs Debian's chromium)")
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    return path


def render(page: Path, profile: Path) -> tuple[str, list[str]]:
    """(the DOM after scripts ran, console messages) of `page` in headless chromium."""
    done = subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", page.resolve().as_uri()],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, [m.group(0) for m in CONSOLE.finditer(done.stderr)]


def test_the_console_check_can_fail(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text(
        "<html><body><p id='x'>x</p><script>console.error('bad thing');"
        "document.getElementById('x').className = 'ran'; missing();</script></body></html>"
    )
    dom, console = render(page, tmp_path / "profile")
    assert 'class="ran"' in dom
    assert any('"bad thing"' in m for m in console)
    assert any("Uncaught ReferenceError" in m for m in console)


@pytest.mark.slow  # about 2-5 s: a chromium start and plotly drawing six figures
def test_the_run_report_renders(run_folder: Path, tmp_path: Path) -> None:
    report = write_report(run_folder, tmp_path / "report.html")
    dom, console = render(report, tmp_path / "profile")
    assert console == []
    assert dom.rstrip().endswith("</html>")
    ids = FIGURE.findall(dom)
    assert ids == [f"fig-{i}" for i in range(6)]
    # Each figure's part of the DOM has plotly's SVG, its title and at least one drawn trace.
    starts = [dom.index(f'id="{i}"') for i in ids]
    for name, lo, hi in zip(ids, starts, [*starts[1:], len(dom)], strict=True):
        part = dom[lo:hi]
        assert 'class="main-svg"' in part, name
        assert 'class="gtitle"' in part, name
        assert re.search(r'class="trace (scatter|bars)', part), name
    assert dom.count('class="trace bars') >= 10  # the breakdown's ops, stacked
