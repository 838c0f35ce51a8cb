"""The compiled engine (simulator/native.py): when its sources run instead, and
that the compiled build gives the sources' results, bit for bit."""

from __future__ import annotations

import importlib.machinery
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from simulator import native
from simulator.runs import runner

ROOT = Path(__file__).resolve().parents[1]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _build(
    folder: Path,
    *,
    compiled: tuple[str, ...] = (*native.MODULES, native.LIBRARY),
    age_s: float = 0.0,
) -> None:
    """Sources of every module in `folder`, and compiled files of `compiled` (modules and the
    build's library), written `age_s` seconds after the sources."""
    for name in native.MODULES:
        source = native.source(name, folder)
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text("")
        os.utime(source, (1_000_000.0, 1_000_000.0))
    for name in compiled:
        binary = native.source(name, folder).with_suffix(SUFFIX)
        binary.write_bytes(b"")
        os.utime(binary, (1_000_000.0 + age_s, 1_000_000.0 + age_s))


def test_a_fresh_complete_build_runs_compiled(tmp_path: Path) -> None:
    _build(tmp_path, age_s=1.0)
    assert native.sources_reason(tmp_path, pure=False) is None


def test_nothing_compiled_runs_the_sources_without_a_finder(tmp_path: Path) -> None:
    _build(tmp_path, compiled=())
    assert native.compiled_files(tmp_path) == {}
    assert native.sources_reason(tmp_path, pure=False) is None  # nothing to step around


def test_the_sources_run_when_asked_when_edited_or_when_the_build_is_partial(
    tmp_path: Path,
) -> None:
    _build(tmp_path, age_s=1.0)
    assert native.sources_reason(tmp_path, pure=True) == "LLMSIM_PURE_PYTHON is set"
    edited = native.source("serving.replica", tmp_path)
    os.utime(edited, (1_000_100.0, 1_000_100.0))  # edited after the build
    assert native.sources_reason(tmp_path, pure=False) == (
        "edited since the build: serving/replica.py"
    )
    partial = tmp_path / "partial"
    partial.mkdir()
    _build(partial, compiled=(*native.MODULES[1:], native.LIBRARY), age_s=1.0)
    assert native.sources_reason(partial, pure=False) == f"not compiled: {native.MODULES[0]}"
    native.source(native.LIBRARY, partial).with_suffix(SUFFIX).unlink()  # no library
    assert native.sources_reason(partial, pure=False) == (
        f"not compiled: {native.MODULES[0]}, {native.LIBRARY}"
    )


def test_every_compiled_module_is_a_source_of_the_package() -> None:
    for name in native.MODULES:
        assert native.source(name).is_file()


# Scenarios that go through every compiled class: the plain loop, prefix caching, disaggregated
# pools, a partitioned replica (its streams), a KV pool, the pipeline and DP-attention loops,
# speculative decoding.
SCENARIOS = (
    "quickstart",
    "prefix_chat",
    "disagg_h100",
    "nexus_h100",
    "long_context_kv_pool",
    "pp_two_nodes",
    "deepseek_v3_ep_h100",
    "speculative_eagle",
)
SUMMARY = """
import json, sys
from simulator.runs import runner
from simulator import native
from simulator.runs import runner
out = {"status": native.status()}
for name in sys.argv[1:]:
    summary = runner.run(f"scenarios/{name}.yaml").summary
    out[name] = {k: repr(v) for k, v in summary.items()}
print(json.dumps(out))
"""


def _summaries(*, pure: bool) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != native.ENV_PURE}
    if pure:
        env[native.ENV_PURE] = "1"
    done = subprocess.run(
        [sys.executable, "-c", SUMMARY, *SCENARIOS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.slow
def test_the_compiled_engine_gives_the_sources_results_bit_for_bit() -> None:
    compiled = _summaries(pure=False)
    if compiled["status"] != "compiled":
        pytest.skip(f"no compiled build here ({compiled['status']})")
    pure = _summaries(pure=True)
    assert pure.pop("status") == "sources (LLMSIM_PURE_PYTHON is set)"
    compiled.pop("status")
    assert compiled == pure


@pytest.mark.parametrize("outputs", ["all", "stream"])
def test_a_run_pickles_and_comes_back_whole(outputs: str) -> None:
    # users keep results with pickle (and Ray ships them): whichever build runs, the result
    # and its rows come back as they were
    result = runner.run("scenarios/quickstart.yaml", outputs=outputs)
    back = pickle.loads(pickle.dumps(result))
    assert back.summary == result.summary
    assert back.sim.requests.equals(result.sim.requests)
