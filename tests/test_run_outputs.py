"""What `llmsim run --out` writes: the tables `--outputs` / the scenario's `outputs` name, as CSV
or Parquet (`--output-format`), and `llmsim report` reads either back."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from clitools import one_line_error, run_cli
from factories import scenario_data, write_yaml

from simulator.outputs import MANIFEST, check_manifest
from simulator.report.load import RunFolder, load
from simulator.runs import runner
from simulator.specs.loader import validate
from simulator.specs.scenario import Scenario

TINY = scenario_data(input_len=128, output_len=16, num_prompts=20, request_rate=10)
SMALL = {"summary.json", "scenario.json", "memory.json", MANIFEST}
LEVELS = {
    "summary": SMALL,
    "requests": SMALL | {"requests.csv"},
    "steps": SMALL | {"requests.csv", "steps.csv"},
    "all": SMALL | {"requests.csv", "steps.csv", "itl.csv"},
}


@pytest.fixture(scope="module")
def result() -> runner.RunResult:
    return runner.run(validate(Scenario, TINY, source="test"))


def files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


@pytest.mark.parametrize("level", list(LEVELS))
def test_each_outputs_level_writes_its_tables_and_no_others(
    tmp_path: Path, result: runner.RunResult, level: runner.RunOutputs
) -> None:
    out = runner.save_run(result, tmp_path / "run", outputs=level)
    assert files(out) == LEVELS[level]
    check_manifest(out, "run", runner.RUN_FILES)


def test_the_default_writes_every_table(tmp_path: Path, result: runner.RunResult) -> None:
    assert files(runner.save_run(result, tmp_path / "run")) == LEVELS["all"]


def test_the_scenario_file_chooses_and_the_flag_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_yaml(tmp_path / "s.yaml", {**TINY, "outputs": "summary"})
    code, _, err = run_cli(capsys, "run", str(path), "--out", str(tmp_path / "a"))
    assert code == 0, err
    assert files(tmp_path / "a") == LEVELS["summary"]
    args = ("run", str(path), "--out", str(tmp_path / "b"), "--outputs", "requests")
    code, _, err = run_cli(capsys, *args)
    assert code == 0, err
    assert files(tmp_path / "b") == LEVELS["requests"]


def test_a_folder_written_with_fewer_tables_may_be_rewritten_with_more(
    tmp_path: Path, result: runner.RunResult
) -> None:
    out = tmp_path / "run"
    runner.save_run(result, out, outputs="summary")
    runner.save_run(result, out, outputs="all")
    assert files(out) == LEVELS["all"]


def test_parquet_tables_round_trip_through_the_report_loader(
    tmp_path: Path, result: runner.RunResult
) -> None:
    pytest.importorskip("pyarrow")
    out = runner.save_run(result, tmp_path / "run", output_format="parquet")
    assert files(out) == SMALL | {"requests.parquet", "steps.parquet", "itl.parquet"}
    run = load(out)
    assert isinstance(run, RunFolder)
    pd.testing.assert_frame_equal(run.requests, result.sim.requests)
    pd.testing.assert_frame_equal(run.steps, result.sim.steps)  # dtypes too (int32 counts)
    assert run.itl is not None
    np.testing.assert_array_equal(run.itl["itl_s"].to_numpy(), result.sim.itl_s)
    np.testing.assert_array_equal(run.itl["weight"].to_numpy(), result.sim.itl_weight)


def test_the_report_reads_a_parquet_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pyarrow")
    path = write_yaml(tmp_path / "s.yaml", TINY)
    out = tmp_path / "run"
    args = ("run", str(path), "--out", str(out), "--output-format", "parquet", "--report")
    code, _, err = run_cli(capsys, *args)
    assert code == 0, err
    assert (out / "report.html").stat().st_size > 0 and not (out / "steps.csv").exists()


def test_the_report_of_a_run_saved_without_steps_says_how_to_get_them(
    tmp_path: Path, result: runner.RunResult, capsys: pytest.CaptureFixture[str]
) -> None:
    out = runner.save_run(result, tmp_path / "run", outputs="requests")
    err = one_line_error(capsys, "report", str(out))
    assert "steps" in err and "--outputs steps or all" in err


def test_report_with_too_few_outputs_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_yaml(tmp_path / "s.yaml", TINY)
    args = ("run", str(path), "--out", str(tmp_path / "o"), "--outputs", "summary", "--report")
    err = one_line_error(capsys, *args)
    assert "outputs" in err and "steps" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("where", ["flag", "scenario"])
def test_parquet_without_pyarrow_is_one_line_naming_the_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError
    data = {**TINY, "output_format": "parquet"} if where == "scenario" else TINY
    path = write_yaml(tmp_path / "s.yaml", data)
    args = ["run", str(path), "--out", str(tmp_path / "o")]
    if where == "flag":
        args += ["--output-format", "parquet"]
    err = one_line_error(capsys, *args)
    assert "pyarrow" in err and "llmsim[parquet]" in err
    field = "--output-format" if where == "flag" else f"{path}: output_format"
    assert field in err
    assert not (tmp_path / "o").exists()


def test_an_unknown_outputs_value_in_a_scenario_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_yaml(tmp_path / "s.yaml", {**TINY, "outputs": "everything"})
    err = one_line_error(capsys, "run", str(path))
    assert str(path) in err and "outputs" in err
