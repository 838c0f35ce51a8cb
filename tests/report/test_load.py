"""What `llmsim report DIR` accepts: a run, sweep or plan folder; anything else is a SpecError
naming the folder or file."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from simulator.errors import SpecError
from simulator.outputs import write_manifest
from simulator.report.load import PlanFolder, RunFolder, SweepFolder, load


def test_a_run_folder(run_folder: Path) -> None:
    run = load(run_folder)
    assert isinstance(run, RunFolder)
    assert run.summary["scenario"] == "tiny"
    assert len(run.requests) == 40
    assert run.itl is not None and (run.itl["weight"] > 0).all()
    assert run.scenario is not None and run.scenario.slo is not None
    assert run.scenario.slo.ttft_ms == 200
    assert run.memory is not None and run.memory[0]["kv_capacity_blocks"] > 0


def test_a_run_folder_without_the_extras_loads(run_folder: Path, tmp_path: Path) -> None:
    for name in ("summary.json", "requests.csv", "steps.csv"):
        shutil.copy(run_folder / name, tmp_path / name)
    write_manifest(tmp_path, "run")
    run = load(tmp_path)
    assert isinstance(run, RunFolder)
    assert run.itl is None and run.scenario is None and run.memory is None


def test_a_run_folder_without_its_manifest_is_refused(run_folder: Path, tmp_path: Path) -> None:
    # what a writer cut short before its last file leaves (or an llmsim before manifests)
    shutil.copytree(run_folder, tmp_path / "run")
    (tmp_path / "run" / "manifest.json").unlink()
    with pytest.raises(SpecError, match=r"no manifest\.json: not a whole run folder") as err:
        load(tmp_path / "run")
    assert err.value.source == str(tmp_path / "run")


def test_an_incomplete_run_folder(run_folder: Path, tmp_path: Path) -> None:
    shutil.copytree(run_folder, tmp_path / "run")
    (tmp_path / "run" / "requests.csv").unlink()
    with pytest.raises(SpecError, match=r"missing requests\.csv, which manifest\.json lists"):
        load(tmp_path / "run")


def test_a_torn_file_is_refused(run_folder: Path, tmp_path: Path) -> None:
    shutil.copytree(run_folder, tmp_path / "run")
    steps = tmp_path / "run" / "steps.csv"
    steps.write_bytes(steps.read_bytes()[:-100])
    with pytest.raises(SpecError, match="mixes two results or was cut short") as err:
        load(tmp_path / "run")
    assert err.value.source == str(steps)


def test_a_folder_mixing_two_runs_is_refused(run_folder: Path, tmp_path: Path) -> None:
    shutil.copytree(run_folder, tmp_path / "a")
    shutil.copytree(run_folder, tmp_path / "b")
    # another run's file of the same size: only its content tells
    memory = tmp_path / "b" / "memory.json"
    text = memory.read_text()
    memory.write_text(text.replace("1", "2", 1) if "1" in text else text.replace("0", "9", 1))
    assert memory.stat().st_size == (tmp_path / "a" / "memory.json").stat().st_size
    with pytest.raises(SpecError, match="mixes two results"):
        load(tmp_path / "b")
    # a file of another run that this one did not write
    shutil.copy(tmp_path / "a" / "steps.csv", tmp_path / "a" / "kv_tiers.csv")
    with pytest.raises(SpecError, match=r"holds kv_tiers\.csv, which manifest\.json does not"):
        load(tmp_path / "a")


def test_a_report_beside_the_run_is_no_stray(run_folder: Path, tmp_path: Path) -> None:
    shutil.copytree(run_folder, tmp_path / "run")
    (tmp_path / "run" / "report.html").write_text("<html></html>")
    assert isinstance(load(tmp_path / "run"), RunFolder)


def test_a_csv_without_its_columns(run_folder: Path, tmp_path: Path) -> None:
    shutil.copytree(run_folder, tmp_path / "run")
    steps = pd.read_csv(run_folder / "steps.csv").drop(columns="kv_used_blocks")
    steps.to_csv(tmp_path / "run" / "steps.csv", index=False)
    write_manifest(tmp_path / "run", "run")
    with pytest.raises(SpecError) as err:
        load(tmp_path / "run")
    assert "steps.csv" in err.value.source and err.value.field == "kv_used_blocks"


def test_broken_files_name_themselves(run_folder: Path, tmp_path: Path) -> None:
    shutil.copytree(run_folder, tmp_path / "run")
    (tmp_path / "run" / "summary.json").write_text("{not json")
    write_manifest(tmp_path / "run", "run")
    with pytest.raises(SpecError, match="not valid JSON") as err:
        load(tmp_path / "run")
    assert err.value.source.endswith("summary.json")
    (tmp_path / "run" / "summary.json").write_text('{"completed": 1}')
    (tmp_path / "run" / "requests.csv").write_text("")
    write_manifest(tmp_path / "run", "run")
    with pytest.raises(SpecError, match="empty"):
        load(tmp_path / "run")


def test_a_sweep_folder(tmp_path: Path) -> None:
    (tmp_path / "results.csv").write_text(
        "run_id,workload.request_rate,status,error,p99_ttft_ms\na,1,ok,,10\nb,2,error,boom,\n"
    )
    (tmp_path / "sweep.yaml").write_text(
        "base: {name: q, slo: {ttft_ms: 300}}\ngrid:\n  workload.request_rate: [1, 2]\n"
    )
    sweep = load(tmp_path)
    assert isinstance(sweep, SweepFolder)
    assert sweep.varied == ["workload.request_rate"]
    assert sweep.slo == {"ttft_ms": 300}
    (tmp_path / "sweep.yaml").unlink()
    sweep = load(tmp_path)  # without the sweep file: the columns before `status`
    assert isinstance(sweep, SweepFolder)
    assert sweep.varied == ["workload.request_rate"] and sweep.slo is None


def test_a_sweep_folder_two_sweeps_wrote_at_once_is_refused(tmp_path: Path) -> None:
    (tmp_path / "results.csv").write_text(
        "run_id,seed,status,error\na,1,ok,\nb,2,ok,\na,1,ok,\nb,2,ok,\n"
    )
    with pytest.raises(SpecError, match="holds run a 2 times: two sweeps wrote") as err:
        load(tmp_path)
    assert err.value.source == str(tmp_path / "results.csv")


def test_a_plan_folder(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(
        '{"name": "p", "model": "m", "fleet": {}, "pareto_metric": "p99_tpot_ms"}'
    )
    (tmp_path / "probes.csv").write_text("layout,feasible,p99_tpot_ms\na,True,10\n")
    write_manifest(tmp_path, "plan")
    plan = load(tmp_path)
    assert isinstance(plan, PlanFolder)
    assert plan.plan["name"] == "p" and len(plan.probes) == 1 and plan.pareto.empty


def test_what_is_not_a_result_folder(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such folder"):
        load(tmp_path / "nope")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(SpecError, match="is not a folder"):
        load(tmp_path / "file.txt")
    with pytest.raises(SpecError, match="not a run, sweep or plan folder") as err:
        load(tmp_path)
    assert err.value.source == str(tmp_path)


@pytest.mark.parametrize(
    ("name", "text", "reason"),
    [
        ("summary.json", "[1, 2]", "expected a JSON object"),
        ("summary.json", '{"duration": 1}', "not a run's summary (no completed)"),
        ("plan.json", '{"a": 1}', "not a plan's summary (no model, fleet)"),
    ],
)
def test_a_summary_that_is_not_ours_is_refused(
    tmp_path: Path, name: str, text: str, reason: str
) -> None:
    (tmp_path / name).write_text(text)
    write_manifest(tmp_path, "run" if name == "summary.json" else "plan")
    with pytest.raises(SpecError, match=re.escape(reason)) as err:
        load(tmp_path)
    assert err.value.source == str(tmp_path / name)


def test_the_plan_report_shows_the_binding_slo_and_why_candidates_were_dropped(
    tmp_path: Path,
) -> None:
    from simulator.report.build import build

    (tmp_path / "plan.json").write_text(
        '{"name": "p", "model": "m", "fleet": {}, "pareto_metric": "p99_tpot_ms"}'
    )
    (tmp_path / "probes.csv").write_text(
        "layout,feasible,p99_tpot_ms,usd_per_million_output_tokens\na,True,10,0.2\n"
    )
    (tmp_path / "candidates.csv").write_text(
        "rank,layout,status,reason,max_rate,binding_slo,slo_ratio\n"
        "1,a,feasible,,3.5,tpot,0.9\n"
        "2,b,pruned,dominated by a,,,\n"
    )
    write_manifest(tmp_path, "plan")
    _, _, sections = build(load(tmp_path))
    summary, dropped, frontier = sections
    assert "binding SLO" in summary.tables[0] and "tpot" in summary.tables[0]
    assert dropped.title == "Dropped candidates" and "dominated by a" in dropped.tables[0]
    assert frontier.figures[0].layout.yaxis.type == "log"
