"""Files a scenario, sweep or plan names (model config, hardware spec, engine profile, draft
model, trace) are found beside it, wherever the command runs from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from clitools import run_cli
from factories import plan_data, write_yaml

from simulator.planning.spec import load_plan
from simulator.specs.loader import MODELS_DIR, beside, list_hardware, load_hardware
from simulator.specs.scenario import load_scenario
from simulator.specs.sweep import expand, load_sweep, write_sweep

RANDOM = {"dataset": {"name": "random", "input_len": 128, "output_len": 16}, "num_prompts": 8}


def _spec_files(folder: Path) -> Path:
    """A derived GPU, a derived engine and a model config in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "my_gpu.yaml").write_text(
        "base: h100_sxm\nname: H100 at 3 TB/s\nmemory: {bandwidth_bytes_per_s: 3.0 TB/s}\n",
        encoding="utf-8",
    )
    (folder / "my_engine.yaml").write_text(
        "base: vllm\nname: vLLM, slower host\nversion: x\noverhead: {step_s: 2 ms}\n",
        encoding="utf-8",
    )
    (folder / "cfg").mkdir(exist_ok=True)
    shutil.copy(MODELS_DIR / "llama-3.1-8b.json", folder / "cfg" / "config.json")
    return folder


def _scenario(**over: object) -> dict[str, object]:
    return {
        "name": "beside",
        "model": "cfg",
        "replicas": [{"hardware": "my_gpu.yaml", "engine": "my_engine.yaml"}],
        "workload": RANDOM,
        **over,
    }


def test_a_scenario_finds_its_spec_files_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    here = Path("project/scenarios")
    _spec_files(tmp_path / here)
    write_yaml(tmp_path / here / "run.yaml", _scenario())
    monkeypatch.chdir(tmp_path)  # neither the scenario's folder nor the repository
    scenario = load_scenario(here / "run.yaml")
    group = scenario.replicas[0]
    beside_it = (tmp_path / here).resolve()  # absolute: the same from any working directory
    assert scenario.model == str(beside_it / "cfg")
    assert (group.hardware, group.engine) == (
        str(beside_it / "my_gpu.yaml"),
        str(beside_it / "my_engine.yaml"),
    )
    assert load_hardware(group.hardware).memory.bandwidth_bytes_per_s == 3.0e12
    code, out, err = run_cli(capsys, "run", str(here / "run.yaml"), "--json", "--out", "run")
    assert (code, err) == (0, "")
    assert json.loads(out)["completed"] == 8
    # The run folder names the files as found, so its report is written from anywhere.
    monkeypatch.chdir(tmp_path / here)
    code, _, err = run_cli(capsys, "report", str(tmp_path / "run"), "-o", "r.html")
    assert (code, err) == (0, "")
    assert (tmp_path / here / "r.html").stat().st_size > 0


def test_ids_absolute_paths_and_missing_files_stay_as_given(tmp_path: Path) -> None:
    folder = _spec_files(tmp_path)
    (folder / "h100_sxm").write_text("not a spec", encoding="utf-8")  # an id wins over a file
    absolute = str(folder / "my_gpu.yaml")
    assert beside(folder, "h100_sxm", list_hardware()) == "h100_sxm"
    assert beside(folder, absolute, list_hardware()) == absolute
    assert beside(folder, "elsewhere/gpu.yaml", list_hardware()) == "elsewhere/gpu.yaml"
    assert beside(folder, "", list_hardware()) == ""  # not the folder itself
    data = _scenario(model="llama-3.1-8b", replicas=[{"hardware": "h100_sxm"}])
    scenario = load_scenario(write_yaml(folder / "ids.yaml", data))
    assert (scenario.model, scenario.replicas[0].hardware) == ("llama-3.1-8b", "h100_sxm")
    assert scenario.replicas[0].engine == "vllm"


def test_a_draft_model_beside_the_scenario(tmp_path: Path) -> None:
    folder = _spec_files(tmp_path)
    shutil.copy(MODELS_DIR / "llama-3.1-8b.json", folder / "draft.json")
    spec = {"model": "draft.json", "num_speculative_tokens": 2, "acceptance_rate": 0.7}
    data = _scenario(replicas=[{"hardware": "h100_sxm", "speculative": spec}])
    scenario = load_scenario(write_yaml(folder / "spec.yaml", data))
    draft = scenario.replicas[0].speculative
    assert draft is not None and draft.model == str(folder / "draft.json")


def test_a_missing_spec_file_names_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_yaml(tmp_path / "run.yaml", _scenario(model="llama-3.1-8b"))
    code, _, err = run_cli(capsys, "run", str(path))
    assert code == 2
    assert err.count("\n") == 1 and "my_gpu.yaml" in err


def test_a_sweep_base_finds_its_spec_files_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _spec_files(tmp_path / "base")
    write_yaml(folder / "run.yaml", _scenario())
    sweep = {
        "base": "base/run.yaml",
        "grid": {"engine": ["vllm", "my_engine.yaml"]},  # set by the sweep: also beside the base
    }
    path = write_yaml(tmp_path / "sweep.yaml", sweep)
    monkeypatch.chdir(folder.parent.parent)
    runs = expand(load_sweep(path))
    assert [r["error"] for r in runs] == [None, None]
    engines = [r["scenario"]["replicas"][0]["engine"] for r in runs]
    assert engines == ["vllm", str(folder.resolve() / "my_engine.yaml")]
    hardware = {r["scenario"]["replicas"][0]["hardware"] for r in runs}
    assert hardware == {str(folder.resolve() / "my_gpu.yaml")}
    # DIR/sweep.yaml inlines the base with its files named absolutely: rerun from its own
    # folder, it finds them and makes the same runs.
    (tmp_path / "out").mkdir()
    write_sweep(load_sweep(path), tmp_path / "out" / "sweep.yaml")
    again = expand(load_sweep(tmp_path / "out" / "sweep.yaml"))
    assert [(r["run_id"], r["error"]) for r in again] == [(r["run_id"], None) for r in runs]


def test_a_plan_finds_its_spec_files_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _spec_files(tmp_path / "plans")
    data = plan_data(model="cfg")
    data["candidates"] = {
        "hardware": ["h100_sxm", {"id": "my_gpu.yaml"}],
        "engine": "my_engine.yaml",
    }
    write_yaml(folder / "plan.yaml", data)
    monkeypatch.chdir(tmp_path)
    spec = load_plan(Path("plans/plan.yaml"))
    plans = folder.resolve()
    assert spec.model == str(plans / "cfg")
    assert [h.id for h in spec.candidates.hardware] == ["h100_sxm", str(plans / "my_gpu.yaml")]
    assert spec.candidates.engine == [str(plans / "my_engine.yaml")]
