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

import pandas as pd
import pytest
import yaml

from simulator.report import write_report
from simulator.runs import sweeps

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"

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


@pytest.mark.slow  # about 5 s: the bundled autoscaled run, and a chromium start
def test_the_autoscaled_run_report_draws_its_replicas_over_time(tmp_path: Path) -> None:
    from simulator.runs import runner

    folder = runner.save_run(runner.run(SCENARIOS / "fleet_autoscale.yaml"), tmp_path / "run")
    dom, console = render(write_report(folder, tmp_path / "report.html"), tmp_path / "profile")
    assert console == []
    ids = FIGURE.findall(dom)
    assert ids == [f"fig-{i}" for i in range(7)]
    part = dom[dom.index('id="fig-4"') : dom.index('id="fig-5"')]  # after the load figures
    assert "Autoscaled replicas over time" in part
    assert len(re.findall(r'class="trace scatter', part)) == 4
    names = set(re.findall(r'class="legendtext"[^>]*>([^<]*)<', dom))
    assert {"serving", "loading weights", "draining", "wanted by the autoscaler"} <= names


LEGEND = re.compile(r'class="legendtext"[^>]*>([^<]*)<')
PLOT_AREA = re.compile(r'class="nsewdrag drag"[^>]*?width="([\d.]+)"')


def test_the_bundled_disaggregation_sweep_report_reads_well(tmp_path: Path) -> None:
    # the README's disaggregation sweep varies replicas, routers and the KV transfer together:
    # its legends are the replica groups in words, and every plot keeps a usable width in a
    # 1000-pixel window (long labels go under the plots, not beside them)
    sweep = yaml.safe_load((SCENARIOS / "sweep_disagg_vs_colocated.yaml").read_text())
    sweep["base"] = str(SCENARIOS / sweep["base"])
    sweep["grid"] = {"workload.request_rate": [2, 6]}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    out = tmp_path / "out"
    sweeps.sweep(path, out, workers=1, progress=False)
    report = write_report(out, tmp_path / "report.html")
    dom, console = render_at(report, tmp_path / "profile", width=1000)
    assert console == []
    legends = set(LEGEND.findall(dom))
    assert "2 x h100_sxm TP2 fp8 (prefill) + 1 x h100_sxm TP4 fp8 (decode)" in legends
    assert "4 x h100_sxm TP2 fp8" in legends
    assert not [t for t in legends if "nan" in t.lower() or "{" in t or "[" in t]
    widths = [float(w) for w in PLOT_AREA.findall(dom)]
    assert len(widths) == 3 and min(widths) >= 250, widths


def render_at(page: Path, profile: Path, *, width: int) -> tuple[str, list[str]]:
    """`render` in a window `width` pixels wide."""
    done = subprocess.run(
        [
            chromium(),
            *CHROMIUM_FLAGS,
            f"--window-size={width},2000",
            f"--user-data-dir={profile}",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, [m.group(0) for m in CONSOLE.finditer(done.stderr)]


@pytest.mark.parametrize("sweep_file", sorted(SCENARIOS.glob("sweep_*.yaml")), ids=lambda p: p.stem)
def test_every_bundled_sweep_report_labels_its_series_in_words(
    sweep_file: Path, tmp_path: Path
) -> None:
    # each bundled sweep's varied values, as its results file stores them, with made-up
    # metrics (the labels and the layout are what is checked, not the numbers)
    from simulator.runs.sweeps import _cell
    from simulator.specs.sweep import expand, load_sweep

    runs = expand(load_sweep(sweep_file))
    varied = list(runs[0]["values"])
    metrics = ("request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms")
    metrics += ("median_tpot_ms", "p99_tpot_ms", "mean_ttft_ms", "mean_tpot_ms")
    rows = [
        {
            "run_id": run["run_id"],
            **{k: _cell(v) for k, v in run["values"].items()},
            "status": "ok",
            "error": "",
            **{m: 10.0 * (i + 1) + j for j, m in enumerate(metrics)},
        }
        for i, run in enumerate(runs)
    ]
    out = tmp_path / "sweep"
    out.mkdir()
    pd.DataFrame(rows, columns=["run_id", *varied, "status", "error", *metrics]).to_csv(
        out / "results.csv", index=False
    )
    report = write_report(out, tmp_path / "report.html")
    dom, console = render_at(report, tmp_path / "profile", width=1000)
    assert console == []
    legends = set(LEGEND.findall(dom))
    assert not [t for t in legends if "nan" in t.lower() or "{" in t or "[" in t], legends
    widths = [float(w) for w in PLOT_AREA.findall(dom)]
    assert widths and min(widths) >= 250, widths


@pytest.mark.parametrize("plan_file", ["plan_chat.yaml", "plan_disagg.yaml"])
def test_the_bundled_plans_reports_read_well(plan_file: str, tmp_path: Path) -> None:
    # each bundled plan, its search cut short (the report's layout is checked, not the plan):
    # layouts labelled as their keys, no JSON or nan, a plot of usable width, a log cost axis
    from simulator.planning.plan import plan
    from simulator.planning.report import save_plan

    data = yaml.safe_load((SCENARIOS / plan_file).read_text())
    data["search"] = {
        **data.get("search", {}),
        "duration_s": 4,
        "min_prompts": 40,
        "max_prompts": 80,
        "max_probes": 3,
    }
    path = tmp_path / plan_file
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = save_plan(plan(path), tmp_path / "plan")
    report = write_report(out, tmp_path / "report.html")
    dom, console = render_at(report, tmp_path / "profile", width=1000)
    assert console == []
    legends = set(LEGEND.findall(dom))
    assert legends and not [t for t in legends if "nan" in t.lower() or "{" in t], legends
    widths = [float(w) for w in PLOT_AREA.findall(dom)]
    assert widths and min(widths) >= 250, widths
    assert "Dropped candidates" in dom or "pruned" not in dom
