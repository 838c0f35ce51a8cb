"""The simulated suites kept between processes (LLMSIM_VALIDATE_CACHE), keyed by the package's
files, and computed in a pool of processes when several are wanted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from simulator.validate import store
from simulator.validate.moe import moe_suite
from simulator.validate.sampler import sampler_suite
from tests.clitools import run_cli

REPO = Path(__file__).resolve().parents[2]
NAME = "test_store_rows"  # held under a name no suite uses: the suites' rows stay held


def _rows() -> pd.DataFrame:
    df = pd.DataFrame({"case": ["a", "b"], "ape_pct": [1.5, 2.5]})
    df.attrs["skipped"] = ["one case: why"]
    return df


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(store.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("LLMSIM_HARDWARE_PATH", raising=False)
    store.forget(NAME)
    yield tmp_path / "cache"
    store.forget(NAME)


def _fails() -> pd.DataFrame:
    raise AssertionError("computed again")


def test_rows_are_written_once_and_read_back_with_their_attrs(folder: Path) -> None:
    calls = []
    rows = store.stored(NAME, lambda: calls.append(1) or _rows())
    assert calls == [1]
    assert store.stored(NAME, _fails) is rows  # held in the process
    (written,) = folder.glob(f"{NAME}-*.pkl")
    assert written.name == f"{NAME}-{store.fingerprint()}.pkl"
    store.forget(NAME)
    again = store.stored(NAME, _fails)  # another process: read from the folder
    pd.testing.assert_frame_equal(again, _rows())
    assert again.attrs == {"skipped": ["one case: why"]}


def test_without_the_folder_nothing_is_written(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(store.CACHE_ENV, "")
    store.stored(NAME, _rows)
    assert not folder.exists()
    assert store.held(NAME)
    store.forget(NAME)
    assert not store.held(NAME)


def test_spec_folders_outside_the_package_turn_the_folder_off(
    folder: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLMSIM_HARDWARE_PATH", str(tmp_path))
    assert store.cache_dir() is None
    store.stored(NAME, _rows)
    assert not folder.exists()


def test_a_changed_package_file_is_a_new_key_and_the_stale_file_goes(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "package"
    (package / "specs").mkdir(parents=True)
    spec = package / "specs" / "h100.yaml"
    spec.write_text("peak: 989\n")
    monkeypatch.setattr(store, "PACKAGE", package)
    first = store.fingerprint()
    store.stored(NAME, _rows)
    spec.write_text("peak: 990\n")  # a calibration rewrote a spec
    assert store.fingerprint() != first
    store.forget(NAME)
    assert not store.held(NAME)  # the file on disk belongs to the old package
    store.stored(NAME, lambda: _rows().assign(ape_pct=[9.0, 9.0]))
    (kept,) = folder.glob(f"{NAME}-*.pkl")
    assert kept.name == f"{NAME}-{store.fingerprint()}.pkl"


def test_a_rewritten_calibration_file_is_a_new_key(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    specs = tmp_path / "hardware_specs"
    (specs / "calibration").mkdir(parents=True)
    fitted = specs / "calibration" / "h200_sxm.yaml"
    fitted.write_text("efficiency: {}\n")
    monkeypatch.setattr(store, "hardware_dirs", lambda: [specs])
    first = store.fingerprint()
    fitted.write_text("efficiency: {gemm: {peak_fraction: 0.8}}\n")  # python -m simulator.calibrate
    assert store.fingerprint() != first


def test_an_unreadable_file_is_computed_again(folder: Path) -> None:
    folder.mkdir()
    (folder / f"{NAME}-{store.fingerprint()}.pkl").write_bytes(b"not a pickle")
    calls = []
    store.stored(NAME, lambda: calls.append(1) or _rows())
    assert calls == [1]


@pytest.mark.slow
def test_prefetch_computes_in_processes_what_the_process_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(store.CACHE_ENV, "")
    suites = {"pool_moe": moe_suite, "pool_sampler": sampler_suite}
    try:
        assert store.prefetch(suites, suites, jobs=1) == []  # one core: the caller computes
        assert store.prefetch(suites, suites, jobs=2) == ["pool_moe", "pool_sampler"]
        pd.testing.assert_frame_equal(store.stored("pool_moe", _fails), moe_suite())
        pd.testing.assert_frame_equal(store.stored("pool_sampler", _fails), sampler_suite())
        assert store.prefetch(suites, suites, jobs=2) == []  # held: nothing to compute
    finally:
        store.forget("pool_moe")
        store.forget("pool_sampler")


def test_the_cli_reads_a_suite_a_first_run_wrote(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store.forget("e2e_latency")  # as a new process starts
    code, first, _ = run_cli(capsys, "validate", "--suite", "e2e_latency", "--json")
    assert code == 0
    assert [p.name.rsplit("-", 1)[0] for p in folder.glob("*.pkl")] == ["e2e_latency"]
    store.forget("e2e_latency")
    monkeypatch.setattr("simulator.validate.e2e.latency_cases", _fails)
    code, second, _ = run_cli(capsys, "validate", "--suite", "e2e_latency", "--json")
    assert code == 0 and second == first


@pytest.mark.slow
def test_python_m_simulator_validate_runs_its_pool(tmp_path: Path) -> None:
    # two simulated suites and (on 2 cores or more) a pool of spawned processes, started from
    # `python -m simulator`, each keeping its suite in the folder
    env = {**os.environ, store.CACHE_ENV: str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("LLMSIM_HARDWARE_PATH", None)
    args = ["validate", "--suite", "e2e_latency", "--suite", "e2e_serving", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "simulator", *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert {"e2e_latency", "e2e_serving"} <= set(json.loads(done.stdout)["suites"])
    if store.cores() > 1:
        kept = sorted(p.name.rsplit("-", 1)[0] for p in tmp_path.glob("*.pkl"))
        assert kept == ["e2e_latency", "e2e_serving"]
