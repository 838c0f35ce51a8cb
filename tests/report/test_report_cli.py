"""`llmsim report DIR [-o FILE]`, and `--report` on `llmsim run` and `llmsim sweep`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clitools import run_cli
from factories import scenario_data, write_yaml

from simulator.outputs import write_manifest
from simulator.report.html import PLOT_CONFIG

FIGURE_DIV = re.compile(r'<div id="(fig-\d+)" class="plotly-graph-div"')


def figures(html: str) -> list[str]:
    return FIGURE_DIV.findall(html)


def test_run_with_report_writes_a_self_contained_page(
    capsys: pytest.CaptureFixture[str], tiny_scenario: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    code, stdout, stderr = run_cli(
        capsys, "run", str(tiny_scenario), "--out", str(out), "--report", "--json"
    )
    assert code == 0, stderr
    assert json.loads(stdout)["completed"] == 40  # stdout stays JSON; the report line is on stderr
    assert f"report: {out / 'report.html'}" in stderr
    html = (out / "report.html").read_text()
    # latency CDFs, KV usage, batch size, queue length, roofline, breakdown
    assert figures(html) == [f"fig-{i}" for i in range(6)]
    assert html.count("Plotly.newPlot(") == 6
    assert re.search(r"<script[^>]*\bsrc=", html) is None  # no external script: works offline
    assert "Operator roofline on NVIDIA H100" in html
    assert json.dumps(PLOT_CONFIG["displaylogo"]) in html


def test_report_of_a_run_folder(
    capsys: pytest.CaptureFixture[str], run_folder: Path, tmp_path: Path
) -> None:
    target = tmp_path / "sub" / "r.html"
    code, stdout, stderr = run_cli(capsys, "report", str(run_folder), "-o", str(target))
    assert code == 0, stderr
    assert stdout.startswith(f"report: {target} (") and stdout.rstrip().endswith("MB)")
    size_mb = target.stat().st_size / 1e6
    assert 4 < size_mb < 10  # plotly.js (~4.8 MB) once, and the run's reduced data
    assert len(figures(target.read_text())) == 6


def test_report_of_a_sweep(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base = scenario_data(
        name="s",
        input_len=128,
        output_len=16,
        num_prompts=12,
        request_rate=4,
        slo={"ttft_ms": 300, "tpot_ms": 40},
    )
    # the unknown engine makes three error rows
    spec = {"base": base, "grid": {"workload.request_rate": [2, 8, 1000], "engine": ["vllm", "x"]}}
    path = write_yaml(tmp_path / "sweep.yaml", spec)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(
        capsys, "sweep", str(path), "--out", str(out), "--workers", "1", "--report"
    )
    assert code == 0, stderr
    assert "3 ok, 3 error" in stdout and f"report: {out / 'report.html'}" in stdout
    html = (out / "report.html").read_text()
    assert len(figures(html)) == 2  # rate-latency and the throughput-latency frontier
    assert "3 finished run(s), 3 error(s)" in html
    assert "SLO 300 ms" in html and "engine: vllm" in html


def test_report_of_a_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(
        json.dumps(
            {
                "name": "p",
                "model": "m",
                "target_rate": 5,
                "slo": {"tpot_ms": {"p": 99, "max": 50}},
                "pareto_metric": "p99_tpot_ms",
                "fleet": {"found": False, "reason": "nothing fits"},
            }
        )
    )
    (tmp_path / "probes.csv").write_text(
        "layout,rate,feasible,usd_per_million_output_tokens,p99_tpot_ms\n"
        "a,1,True,2.0,20\na,2,False,1.0,70\n"
    )
    write_manifest(tmp_path, "plan")
    code, _, stderr = run_cli(capsys, "report", str(tmp_path))
    assert code == 0, stderr
    html = (tmp_path / "report.html").read_text()
    assert len(figures(html)) == 1 and "SLO 50 ms" in html
    assert "Cheapest fleet: none (nothing fits)." in html


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["report", "{tmp}/nope"], "nope: no such folder"),
        (["report", "{tmp}"], "not a run, sweep or plan folder"),
        (["run", "{scenario}", "--report"], "report: --report needs --out DIR"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    tiny_scenario: Path,
    args: list[str],
    message: str,
) -> None:
    argv = [a.format(tmp=tmp_path, scenario=tiny_scenario) for a in args]
    code, _, stderr = run_cli(capsys, *argv)
    assert code == 2
    assert stderr.count("\n") == 1 and message in stderr
    assert "Traceback" not in stderr


def test_report_of_an_autoscaled_run_shows_its_replicas_over_time(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = scenario_data(
        name="scaled",
        input_len=512,
        output_len=128,
        num_prompts=300,
        request_rate=30,
        router={"kind": "least_outstanding"},
        autoscale={"min_replicas": 1, "max_replicas": 3, "target": 8, "interval_s": 1},
    )
    out = tmp_path / "run"
    code, _, stderr = run_cli(
        capsys, "run", str(write_yaml(tmp_path / "s.yaml", data)), "--out", str(out), "--report"
    )
    assert code == 0, stderr
    html = (out / "report.html").read_text()
    assert "Autoscaled replicas over time" in html and "replicas added" in html
    assert len(figures(html)) == 7  # the six of a run, and the replicas over time


def test_report_of_a_power_budgeted_run_shows_its_draw_over_time(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = scenario_data(
        name="budgeted",
        input_len=1024,
        output_len=64,
        num_prompts=200,
        request_rate=40,
        power_budget={"budget_w": 600, "policy": "dynamic"},
    )
    out = tmp_path / "run"
    code, _, stderr = run_cli(
        capsys, "run", str(write_yaml(tmp_path / "s.yaml", data)), "--out", str(out), "--report"
    )
    assert code == 0, stderr
    html = (out / "report.html").read_text()
    assert "Fleet power draw over time" in html and "replica-time capped" in html
    assert len(figures(html)) == 7  # the six of a run, and the power trace
