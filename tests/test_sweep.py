"""Sweeps: expansion (grid, zip, random; replica-wide paths; run ids), per-run errors, resuming
after a kill, the CLI, the process pool and Ray. Scenarios are tiny (20 requests of Llama-3.1-8B
on one H100), so each run takes a few milliseconds."""

from __future__ import annotations

import errno
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from clitools import run_cli
from factories import scenario_data, write_yaml

from simulator.errors import SpecError
from simulator.runs import runner, sweeps
from simulator.runs.sweeps import (
    SweepSpec,
    execute_sweep,
    expand,
    load_sweep,
    sweep,
)

REPO = Path(__file__).resolve().parents[1]

BASE = scenario_data(input_len=128, output_len=16, num_prompts=20, request_rate=10)


def make_sweep(folder: Path, *, base: dict[str, Any] | None = None, **sections: Any) -> Path:
    """A base scenario file and a sweep file naming it, in `folder`; returns the sweep file."""
    folder.mkdir(parents=True, exist_ok=True)
    write_yaml(folder / "base.yaml", base or BASE)
    return write_yaml(folder / "sweep.yaml", {"base": "base.yaml", **sections})


def count_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the scenarios `runner.run` gets from here on (workers=1 runs in this process)."""
    seen: list[str] = []
    real = runner.run

    def counting(scenario: Any) -> runner.RunResult:
        seen.append(scenario.name)
        return real(scenario)

    monkeypatch.setattr(runner, "run", counting)
    return seen


def metrics(table: pd.DataFrame) -> pd.DataFrame:
    """The deterministic part of a results table, in run-id order."""
    return table.drop(columns=["wall_time_s"]).sort_values("run_id").reset_index(drop=True)


# -- expansion ------------------------------------------------------------------------------------
def test_grid_is_the_cartesian_product(tmp_path: Path) -> None:
    grid = {"workload.request_rate": [1, 2, 4], "replicas.0.tensor_parallel_size": [1, 2]}
    runs = expand(load_sweep(make_sweep(tmp_path, grid=grid)))
    assert len(runs) == 6
    pairs = [tuple(r["values"].values()) for r in runs]
    assert pairs == [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2)]
    for run in runs:
        assert run["error"] is None
        scenario = run["scenario"]
        assert scenario["workload"]["request_rate"] == run["values"]["workload.request_rate"]
        tp = run["values"]["replicas.0.tensor_parallel_size"]
        assert scenario["replicas"][0]["tensor_parallel_size"] == tp


def test_zip_goes_in_lock_step_and_crosses_the_grid(tmp_path: Path) -> None:
    zipped = {"workload.num_prompts": [10, 20, 30], "seed": [7, 8, 9]}
    runs = expand(
        load_sweep(make_sweep(tmp_path, zip=zipped, grid={"workload.request_rate": [1, 2]}))
    )
    assert len(runs) == 2 * 3
    for run in runs:
        s = run["scenario"]
        assert s["seed"] == s["workload"]["num_prompts"] // 10 + 6


def test_random_draws_are_reproducible_and_in_range(tmp_path: Path) -> None:
    random = {
        "workload.request_rate": {"low": 0.5, "high": 8.0},
        "replicas.0.scheduler.max_num_seqs": {"low": 1, "high": 1000, "log": True, "integer": True},
        "router.kind": ["round_robin", "least_outstanding"],
    }
    path = make_sweep(tmp_path, random=random, samples=400, seed=3)
    runs = expand(load_sweep(path))
    assert len(runs) == 400
    rates = [r["values"]["workload.request_rate"] for r in runs]
    seqs = [r["values"]["replicas.0.scheduler.max_num_seqs"] for r in runs]
    assert all(0.5 <= x <= 8.0 for x in rates)
    assert all(isinstance(x, int) and 1 <= x <= 1000 for x in seqs)
    # log-uniform over [1, 1001): the median is near sqrt(1001) ~ 32, far below uniform's 500
    assert 15 < statistics.median(seqs) < 70
    assert {r["values"]["router.kind"] for r in runs} == {"round_robin", "least_outstanding"}
    assert [r["run_id"] for r in expand(load_sweep(path))] == [r["run_id"] for r in runs]
    other = expand(load_sweep(make_sweep(tmp_path / "b", random=random, samples=400, seed=4)))
    assert [r["values"] for r in other] != [r["values"] for r in runs]


def test_adding_a_random_path_keeps_the_others_values(tmp_path: Path) -> None:
    one = {"workload.request_rate": {"low": 1, "high": 9}}
    two = {"seed": {"low": 0, "high": 99, "integer": True}, **one}
    a = expand(load_sweep(make_sweep(tmp_path / "a", random=one, samples=5)))
    b = expand(load_sweep(make_sweep(tmp_path / "b", random=two, samples=5)))
    rate = "workload.request_rate"
    assert [r["values"][rate] for r in a] == [r["values"][rate] for r in b]


def test_a_top_level_replica_field_applies_to_every_group(tmp_path: Path) -> None:
    base = {**BASE, "replicas": [{"hardware": "h100_sxm"}, {"hardware": "a100_sxm_80gb"}]}
    grid = {"hardware": ["mi300x", "l40s"], "scheduler.max_num_seqs": [64]}
    runs = expand(load_sweep(make_sweep(tmp_path, base=base, grid=grid)))
    assert [g["hardware"] for g in runs[1]["scenario"]["replicas"]] == ["l40s", "l40s"]
    for run in runs:
        groups = run["scenario"]["replicas"]
        assert {g["hardware"] for g in groups} == {run["values"]["hardware"]}
        assert [g["scheduler"]["max_num_seqs"] for g in groups] == [64, 64]


def test_run_ids_are_stable_short_hashes_and_name_the_runs(tmp_path: Path) -> None:
    path = make_sweep(tmp_path, grid={"seed": [0, 1, 0]})  # the repeat is one run
    runs = expand(load_sweep(path))
    assert len(runs) == 2
    ids = [r["run_id"] for r in runs]
    assert all(len(i) == 12 and int(i, 16) >= 0 for i in ids)
    assert [r["scenario"]["name"] for r in runs] == [f"tiny-{i}" for i in ids]
    assert [r["run_id"] for r in expand(load_sweep(path))] == ids
    # the same scenario given inline, or with a default spelled out, has the same id
    inline = SweepSpec(base=BASE, grid={"seed": [0, 1]})
    assert [r["run_id"] for r in expand(inline)] == ids
    spelled = {"seed": [0, 1], "replicas.0.engine": ["vllm"]}
    assert [r["run_id"] for r in expand(SweepSpec(base=BASE, grid=spelled))] == ids


def test_a_trace_path_is_relative_to_the_base_file(tmp_path: Path) -> None:
    base = {**BASE, "workload": {"dataset": {"name": "trace", "path": "trace.csv"}}}
    path = make_sweep(tmp_path / "scenarios", base=base, grid={"seed": [0]})
    [run] = expand(load_sweep(path))
    assert run["scenario"]["workload"]["dataset"]["path"] == str(tmp_path / "scenarios/trace.csv")


def test_the_example_sweep_expands_to_valid_runs() -> None:
    runs = expand(load_sweep(REPO / "scenarios" / "sweep_rate.yaml"))
    assert len(runs) == 12
    assert all(r["error"] is None for r in runs)
    assert {r["scenario"]["replicas"][0]["hardware"] for r in runs} == {"h100_sxm", "mi300x"}


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ({"grid": {"seed": [1]}, "grdi": {}}, "unknown field"),
        ({"zip": {"seed": [1, 2], "workload.request_rate": [1]}}, "same length"),
        ({"grid": {}}, "empty"),
        ({"grid": {"seed": []}}, "at least 1"),
        ({"grid": {"seed": 3}}, "valid list"),
        ({}, "nothing to vary"),
        ({"random": {"seed": [1, 2]}}, "samples"),
        ({"grid": {"seed": [1]}, "samples": 3}, "no random section"),
        ({"grid": {"seed": [1]}, "zip": {"seed": [2]}}, "more than one section"),
        ({"random": {"seed": {"low": 5, "high": 1}}, "samples": 2}, "below low"),
        ({"random": {"seed": {"low": 0, "high": 1, "log": True}}, "samples": 2}, "low > 0"),
        ({"grid": {"workload..request_rate": [1]}}, "dotted path"),
    ],
)
def test_a_malformed_sweep_file_is_a_spec_error(
    tmp_path: Path, sweep: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError, match=message) as err:
        load_sweep(make_sweep(tmp_path, **sweep))
    assert str(tmp_path / "sweep.yaml") in str(err.value)


def test_a_missing_base_file_is_a_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text("base: nowhere.yaml\ngrid: {seed: [1]}\n", encoding="utf-8")
    with pytest.raises(SpecError, match=r"nowhere\.yaml: cannot read") as err:
        expand(load_sweep(path))
    assert (err.value.source, err.value.field) == (str(path), "base")


@pytest.mark.parametrize("bound", [float("nan"), float("inf")])
def test_a_random_range_needs_finite_bounds(tmp_path: Path, bound: float) -> None:
    random = {"workload.request_rate": {"low": 1, "high": bound}}
    with pytest.raises(SpecError, match=r"finite number|high: must be a number, not NaN") as err:
        load_sweep(make_sweep(tmp_path, random=random, samples=2))
    assert err.value.field.startswith("random.workload.request_rate.range")


@pytest.mark.parametrize(
    ("base", "field", "reason"),
    [
        ({**BASE, "foo": "bar"}, "base.foo", "unknown field"),
        ({**BASE, "workload": {**BASE["workload"], "rate": 3}}, "base.workload.rate", "unknown"),
        ({k: v for k, v in BASE.items() if k != "model"}, "base.model", "Field required"),
    ],
)
def test_a_base_no_value_can_mend_is_an_error_of_the_sweep_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    base: dict[str, Any],
    field: str,
    reason: str,
) -> None:
    # the base fails every run alike, whatever the varied values: exit 2 before anything runs
    sweep = make_sweep(tmp_path, base=base, grid={"seed": [0, 1]})
    with pytest.raises(SpecError, match=reason) as err:
        expand(load_sweep(sweep))
    assert (err.value.source, err.value.field) == (str(sweep), field)
    out = tmp_path / "out"
    code, _, stderr = run_cli(capsys, "sweep", str(sweep), "--out", str(out), "--quiet")
    assert (code, stderr.count("\n")) == (2, 1) and not out.exists()


def test_a_base_field_the_sweep_sets_is_not_the_base_s_error(tmp_path: Path) -> None:
    # the base lacks the model, the grid gives it: every run is whole
    base = {k: v for k, v in BASE.items() if k != "model"}
    runs = expand(load_sweep(make_sweep(tmp_path, base=base, grid={"model": ["llama-3.1-8b"]})))
    assert runs[0]["error"] is None


@pytest.mark.parametrize(
    ("sections", "field", "reason"),
    [
        ({"grid": {"workload.rate": [1, 2]}}, "grid.workload.rate", "unknown field"),
        ({"zip": {"workload.rate.x": [1]}}, "zip.workload.rate.x", "'workload.rate' on the way"),
        ({"grid": {"scheduler.max_seqs": [8]}}, "grid.scheduler.max_seqs", "unknown field"),
        ({"grid": {"replicas.3.hardware": ["h100_sxm"]}}, "grid.replicas.3.hardware", "index"),
        ({"grid": {"model.size": [1]}}, "grid.model.size", "'model' holds 'llama-3.1-8b'"),
    ],
)
def test_a_path_that_fails_every_run_is_an_error_of_the_sweep_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sections: dict[str, Any],
    field: str,
    reason: str,
) -> None:
    # whatever its value, the run cannot take it: the sweep file is wrong, not one run
    sweep = make_sweep(tmp_path, **sections)
    with pytest.raises(SpecError, match=reason) as err:
        expand(load_sweep(sweep))
    assert (err.value.source, err.value.field) == (str(sweep), field)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(capsys, "sweep", str(sweep), "--out", str(out), "--quiet")
    assert (code, stdout, stderr.count("\n")) == (2, "", 1)
    assert stderr.startswith(f"llmsim: error: {sweep}: {field}: ")
    assert not out.exists()  # nothing written


def test_a_bad_value_makes_an_error_run(tmp_path: Path) -> None:
    runs = expand(load_sweep(make_sweep(tmp_path, grid={"workload.request_rate": [-1, 10]})))
    assert "greater than 0" in (runs[0]["error"] or "")
    assert runs[1]["error"] is None
    # a mapping value with a misspelt key is that value's error, not the path's
    workload = {"dataset": {"name": "random"}, "request_rat": 1}
    runs = expand(load_sweep(make_sweep(tmp_path, grid={"workload": [workload]})))
    assert "workload.request_rat: unknown field" in (runs[0]["error"] or "")


# -- running --------------------------------------------------------------------------------------
def test_failing_runs_are_recorded_and_the_others_go_on(tmp_path: Path) -> None:
    # -1 fails validation; llama-3.1-405b does not fit one H100 (fails in the run)
    grid = {"workload.request_rate": [-1, 10], "model": ["llama-3.1-405b", "llama-3.1-8b"]}
    report = execute_sweep(make_sweep(tmp_path, grid=grid), tmp_path / "out", workers=1)
    assert (report.ok, report.error, report.skipped) == (1, 3, 0)
    table = pd.read_csv(tmp_path / "out" / "results.csv")
    assert table.equals(report.table)
    assert list(table.columns[:5]) == [
        "run_id",
        "workload.request_rate",
        "model",
        "status",
        "error",
    ]
    assert table["run_id"].is_unique and len(table) == 4
    ok = table[table["status"] == "ok"].iloc[0]
    assert (ok["workload.request_rate"], ok["model"], ok["completed"]) == (10, "llama-3.1-8b", 20)
    errors = table[table["status"] == "error"]
    assert errors["completed"].isna().all()
    assert errors["error"].str.contains("greater than 0").sum() == 2
    assert errors["error"].str.contains("405b").any()


def test_a_simulation_exception_is_an_error_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = runner.run

    def flaky(scenario: Any) -> runner.RunResult:
        if scenario.seed == 1:
            raise ZeroDivisionError("boom\nsecond line")
        return real(scenario)

    monkeypatch.setattr(runner, "run", flaky)
    table = sweep(make_sweep(tmp_path, grid={"seed": [0, 1, 2]}), tmp_path / "out", workers=1)
    assert list(table["status"]) == ["ok", "error", "ok"]
    assert table["error"].iloc[1] == "ZeroDivisionError: boom second line"


def test_a_killed_sweep_resumes_without_duplicates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_sweep(tmp_path, grid={"seed": [0, 1, 2, 3, 4], "workload.request_rate": [5]})
    out = tmp_path / "out"
    first = sweep(path, out, workers=1)
    assert len(first) == 5
    # a kill: two whole rows survive, then half of the third
    results = out / "results.csv"
    lines = results.read_text(encoding="utf-8").splitlines(keepends=True)
    results.write_text("".join(lines[:3]) + lines[3][:40], encoding="utf-8")

    seen = count_runs(monkeypatch)
    report = execute_sweep(path, out, workers=1)
    assert (report.ok, report.error, report.skipped) == (3, 0, 2)
    assert sorted(seen) == sorted(f"tiny-{i}" for i in first["run_id"][2:])
    assert report.table["run_id"].is_unique
    pd.testing.assert_frame_equal(metrics(report.table), metrics(first))

    again = execute_sweep(path, out, workers=1)
    assert (again.ok, again.error, again.skipped) == (0, 0, 5)
    assert len(seen) == 3 and len(again.table) == 5


def test_error_rows_are_not_rerun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_sweep(tmp_path, grid={"model": ["llama-3.1-405b", "llama-3.1-8b"]})
    execute_sweep(path, tmp_path / "out", workers=1)
    seen = count_runs(monkeypatch)
    report = execute_sweep(path, tmp_path / "out", workers=1)
    assert (seen, report.skipped, len(report.table)) == ([], 2, 2)


def test_sweep_yaml_records_the_sweep_with_the_base_inlined(tmp_path: Path) -> None:
    path = make_sweep(tmp_path, grid={"seed": [0, 1]})
    report = execute_sweep(path, tmp_path / "out", workers=1)
    recorded = load_sweep(tmp_path / "out" / "sweep.yaml")
    assert recorded.base == BASE and recorded.grid == {"seed": [0, 1]}
    assert sorted(r["run_id"] for r in expand(recorded)) == sorted(report.table["run_id"])


@pytest.mark.parametrize(
    "content",
    [b"a,b\n1,2\n", b"a,b\n1,2\n3,", b"run_id,x\n1,2\n", b"\xff\xfe\x00garbage"],
    ids=["csv", "cut-short", "no-status", "binary"],
)
def test_results_of_another_kind_are_left_untouched(tmp_path: Path, content: bytes) -> None:
    results = tmp_path / "out" / "results.csv"
    results.parent.mkdir()
    results.write_bytes(content)
    with pytest.raises(SpecError, match="not a sweep's results"):
        sweep(make_sweep(tmp_path, grid={"seed": [0]}), tmp_path / "out", workers=1)
    assert results.read_bytes() == content  # not even a cut-short last line dropped


def test_another_sweep_s_results_are_not_mixed_in(tmp_path: Path) -> None:
    out = tmp_path / "out"
    execute_sweep(make_sweep(tmp_path / "a", grid={"seed": [0]}), out, workers=1)
    before = (out / "results.csv").read_bytes()
    other = make_sweep(tmp_path / "b", grid={"workload.request_rate": [5]})
    with pytest.raises(SpecError, match=r"a sweep over seed, not workload\.request_rate"):
        execute_sweep(other, out, workers=1)
    assert (out / "results.csv").read_bytes() == before
    # the same paths with more values resume: the grid grows, the finished run is kept
    report = execute_sweep(make_sweep(tmp_path / "a", grid={"seed": [0, 1]}), out, workers=1)
    assert (report.ok, report.skipped) == (1, 1)


def test_the_process_pool_gives_the_same_results(tmp_path: Path) -> None:
    path = make_sweep(
        tmp_path, grid={"seed": [0, 1, 2], "model": ["llama-3.1-8b", "llama-3.1-405b"]}
    )
    pooled = execute_sweep(path, tmp_path / "pool", workers=2)
    serial = execute_sweep(path, tmp_path / "serial", workers=1)
    assert (pooled.ok, pooled.error) == (3, 3)
    pd.testing.assert_frame_equal(metrics(pooled.table), metrics(serial.table))


def test_bad_workers_or_executor_are_spec_errors(tmp_path: Path) -> None:
    path = make_sweep(tmp_path, grid={"seed": [0]})
    with pytest.raises(SpecError, match="at least 1"):
        sweep(path, tmp_path / "out", workers=0)
    with pytest.raises(SpecError, match="unknown executor"):
        sweep(path, tmp_path / "out", executor="dask")  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


# -- the command line -----------------------------------------------------------------------------


def test_cli_sweep_writes_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_sweep(tmp_path, grid={"seed": [0, 1]})
    out = tmp_path / "out"
    code, stdout, err = run_cli(capsys, "sweep", str(path), "--out", str(out), "--workers", "1")
    # stderr is not a terminal: progress comes as plain lines, not a bar
    assert code == 0
    assert [line.split(" (")[0] for line in err.splitlines()] == [
        "llmsim: sweep: 1/2 runs done",
        "llmsim: sweep: 2/2 runs done",
    ]
    assert stdout == f"sweep: 2 ok, 0 error, 0 skipped (done before); {out / 'results.csv'}\n"
    assert len(pd.read_csv(out / "results.csv")) == 2
    code, stdout, _ = run_cli(capsys, "sweep", str(path), "--out", str(out), "--quiet")
    assert (code, stdout.split(";")[0]) == (0, "sweep: 0 ok, 0 error, 2 skipped (done before)")


def test_cli_sweep_says_when_points_repeat_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Six draws from two choices: two distinct scenarios, each run once.
    random = {"router.kind": ["round_robin", "least_outstanding"]}
    path = make_sweep(tmp_path, random=random, samples=6)
    out = tmp_path / "out"
    code, stdout, _ = run_cli(capsys, "sweep", str(path), "--out", str(out), "--workers", "1")
    assert (code, stdout.split(";")[0]) == (
        0,
        "sweep: 2 ok, 0 error, 0 skipped (done before), 4 repeated points run once",
    )
    assert len(pd.read_csv(out / "results.csv")) == 2


def test_the_progress_bar_shows_on_a_terminal_unless_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich: treat stderr as a terminal
    path = make_sweep(tmp_path, grid={"seed": [0, 1, 2]})
    args = ("sweep", str(path), "--workers", "1", "--out")
    code, stdout, err = run_cli(capsys, *args, str(tmp_path / "a"))
    assert code == 0 and "3/3" in err and "ETA" in err
    assert stdout.startswith("sweep: 3 ok")
    code, _, err = run_cli(capsys, *args, str(tmp_path / "b"), "--quiet")
    assert (code, err) == (0, "")


@pytest.mark.parametrize(
    "args",
    [
        ["--workers", "1"],  # the sweep file below is malformed
        ["--executor", "spark"],
    ],
)
def test_cli_bad_sweep_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    path = make_sweep(tmp_path, zip={"seed": [1, 2], "workload.request_rate": [1]})
    code, _, err = run_cli(capsys, "sweep", str(path), "--out", str(tmp_path / "out"), *args)
    assert code == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_cli_ray_executor_without_ray_says_how_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    path = make_sweep(tmp_path, grid={"seed": [0]})
    code, _, err = run_cli(capsys, "sweep", str(path), "--out", str(tmp_path), "--executor", "ray")
    assert code == 2
    assert err == "llmsim: error: executor: the ray executor needs Ray: pip install 'llmsim[ray]'\n"


# -- Ray -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_ray_executor_matches_the_local_one(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    path = make_sweep(
        tmp_path, grid={"seed": [0, 1, 2], "model": ["llama-3.1-8b", "llama-3.1-405b"]}
    )
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        remote = execute_sweep(path, tmp_path / "ray", executor="ray")
    finally:
        ray.shutdown()
    local = execute_sweep(path, tmp_path / "local", workers=1)
    assert (remote.ok, remote.error) == (3, 3)
    pd.testing.assert_frame_equal(metrics(remote.table), metrics(local.table))


# -- one writer per folder, no links followed, nothing left running -------------------------------
HOLD_LOCK = """
import sys
from pathlib import Path
from simulator.outputs import folder_lock
with folder_lock(Path(sys.argv[1]), "llmsim sweep"):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_second_sweep_on_a_locked_folder_exits_2_naming_the_holder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_sweep(tmp_path, grid={"seed": [0, 1, 2]})
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        code, _, err = run_cli(capsys, "sweep", str(path), "--out", str(out), "--workers", "1")
        assert code == 2
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert f"another llmsim sweep is writing this folder (pid {holder.pid} on " in err
        assert not (out / "results.csv").exists()
    finally:
        holder.communicate(b"")  # let it go
    code, out_text, _ = run_cli(capsys, "sweep", str(path), "--out", str(out), "--workers", "1")
    assert code == 0 and "3 ok" in out_text
    assert len(pd.read_csv(out / "results.csv")) == 3


@pytest.mark.slow
def test_two_sweeps_at_once_leave_one_row_per_run(tmp_path: Path) -> None:
    path = make_sweep(tmp_path, grid={"seed": list(range(8))})
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "simulator", "sweep", str(path), "--out", str(out)]
    procs = [
        subprocess.Popen([*command, "--workers", "1", "--quiet"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    results = [proc.communicate() for proc in procs]
    codes = sorted(proc.returncode for proc in procs)
    # the second one is refused while the first writes, or finds every run done after it
    assert codes in ([0, 0], [0, 2]), results
    for proc, (stdout, stderr) in zip(procs, results, strict=True):
        if proc.returncode == 2:
            assert len(stderr.splitlines()) == 1 and "another llmsim sweep" in stderr
        else:
            assert stdout.startswith("sweep: ")
    table = pd.read_csv(out / "results.csv")
    assert len(table) == 8 and table["run_id"].is_unique


@pytest.mark.parametrize("name", ["sweep.yaml", "results.csv.tmp"])
def test_a_link_planted_in_the_folder_is_replaced_not_followed(tmp_path: Path, name: str) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(target)
    # two rows of different columns: results.csv is rewritten once under the wider header
    path = make_sweep(tmp_path / "s", grid={"model": ["llama-3.1-405b", "llama-3.1-8b"]})
    report = execute_sweep(path, out, workers=1, progress=False)
    assert (report.ok, report.error) == (1, 1)
    assert target.read_text() == "keep me"
    assert "base:" in (out / "sweep.yaml").read_text()


def test_a_link_planted_as_results_csv_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "precious.csv"
    target.write_text("run_id,status\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").symlink_to(target)
    path = make_sweep(tmp_path, grid={"seed": [0]})
    code, _, err = run_cli(capsys, "sweep", str(path), "--out", str(out), "--workers", "1")
    assert code == 2
    assert err == (
        f"llmsim: error: {out / 'results.csv'}: is a symbolic link; llmsim does not write "
        "through links in an output folder (remove it, or choose another --out)\n"
    )
    assert target.read_text() == "run_id,status\n"


def test_a_full_disk_mid_sweep_exits_2_and_the_sweep_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_sweep(tmp_path, grid={"seed": [0, 1, 2]})
    out = tmp_path / "out"
    real = sweeps.open_append

    class Filling:
        """The results file on a disk that fills up mid-way through the second row."""

        def __init__(self, path: Path) -> None:
            self.fh = real(path)

        def write(self, text: str) -> int:
            self.fh.write(text[: len(text) // 2])
            self.fh.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.fh, name)

    monkeypatch.setattr(sweeps, "open_append", Filling)
    args = ("sweep", str(path), "--out", str(out), "--workers", "1", "--quiet")
    code, _, err = run_cli(capsys, *args)
    assert code == 2
    assert err == f"llmsim: error: {out / 'results.csv'}: No space left on device\n"
    assert (out / "results.csv").read_text().count("\n") == 2  # header, a row, half a row
    monkeypatch.undo()
    code, text, _ = run_cli(capsys, *args)
    assert code == 0 and "2 ok, 0 error, 1 skipped" in text
    table = pd.read_csv(out / "results.csv")
    assert len(table) == 3 and table["run_id"].is_unique


def _children(pid: int) -> list[int]:
    """The pool workers (multiprocessing `spawn` children) of process `pid` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"spawn_main" in cmdline:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_pool_workers_die_with_a_killed_sweep(tmp_path: Path) -> None:
    # runs long enough (tens of seconds each) that workers would outlive their parent by far
    base = scenario_data(input_len=512, output_len=512, num_prompts=200_000, request_rate=1000)
    path = make_sweep(tmp_path, base=base, grid={"seed": [0, 1, 2, 3]})
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1"}
    parent = subprocess.Popen(
        [sys.executable, "-m", "simulator", "sweep", str(path), "--out", str(tmp_path / "out"),
         "--workers", "2", "--quiet"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        workers: list[int] = []
        for _ in range(1200):  # until both workers are up (bounded: 2 minutes at most)
            workers = _children(parent.pid)
            if len(workers) == 2 or parent.poll() is not None:
                break
            time.sleep(0.1)
        assert len(workers) == 2, "the pool did not start"
        time.sleep(1.0)  # into their first runs
    finally:
        parent.kill()
        parent.wait()
    for _ in range(600):  # a generous bound (60 s); they go within a second
        if not any(_alive(pid) for pid in workers):
            break
        time.sleep(0.1)
    left = [pid for pid in workers if _alive(pid)]
    for pid in left:  # do not leave them behind if the test fails
        os.kill(pid, signal.SIGKILL)
    assert left == []


def test_die_with_parent_exits_a_worker_whose_parent_is_gone() -> None:
    # spawned by this process but told its parent is another: it must exit at once
    code = (
        "from simulator.runs.sweeps import die_with_parent\n"
        "import time\n"
        "die_with_parent(1)\n"  # not our parent (unless run as pid 1's child)
        "time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, check=False, timeout=600)
    assert proc.returncode == 1


def test_an_unreachable_ray_address_exits_2_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray")
    with socket.socket() as sock:  # a local port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    path = make_sweep(tmp_path, grid={"seed": [0]})
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, "sweep", str(path), "--out", str(out), "--executor", "ray")
    assert code == 2
    assert err.startswith(
        f"llmsim: error: RAY_ADDRESS: cannot reach the Ray cluster at 127.0.0.1:{port} within "
    )
    assert len(err.splitlines()) == 1
    assert not out.exists()


class FakeRay:
    """`ray.init` that hangs (as Ray does at an address where no Ray head answers) or fails."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error
        self.release = threading.Event()

    def init(self, **_: Any) -> None:
        if self.error is not None:
            raise self.error
        self.release.wait()


def test_a_ray_cluster_that_does_not_answer_is_one_line_within_the_timeout() -> None:
    fake = FakeRay(None)
    try:
        with pytest.raises(SpecError, match=r"did not answer within 0\.2 s") as err:
            sweeps._connect_ray(fake, "10.0.0.1:6379", 0.2)  # type: ignore[arg-type]
    finally:
        fake.release.set()
    assert err.value.field == "RAY_ADDRESS"


def test_a_ray_authentication_error_is_one_line() -> None:
    error = ConnectionError("Authentication failed:\nthe token is invalid")
    with pytest.raises(SpecError) as err:
        sweeps._connect_ray(FakeRay(error), "10.0.0.1:6379", 5)  # type: ignore[arg-type]
    assert err.value.line() == (
        "RAY_ADDRESS: cannot connect to the Ray cluster at 10.0.0.1:6379: ConnectionError: "
        "Authentication failed: the token is invalid"
    )


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf"])
def test_a_bad_ray_connect_timeout_is_a_spec_error(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("LLMSIM_RAY_CONNECT_TIMEOUT_S", value)
    with pytest.raises(SpecError, match="LLMSIM_RAY_CONNECT_TIMEOUT_S: must be a positive"):
        sweeps.connect_timeout_s()


def test_the_report_of_a_sweep_replaces_a_link_planted_as_report_html(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "precious.html"
    target.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").symlink_to(target)
    path = make_sweep(tmp_path, grid={"seed": [0, 1]})
    code, _, err = run_cli(
        capsys, "sweep", str(path), "--out", str(out), "--workers", "1", "--quiet", "--report"
    )
    assert code == 0, err
    assert target.read_text() == "keep me"
    assert not (out / "report.html").is_symlink() and "<html" in (out / "report.html").read_text()
