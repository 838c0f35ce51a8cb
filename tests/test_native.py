"""The compiled engine (simulator/native.py): when its sources run instead, and
that the compiled build gives the sources' results, bit for bit."""

from __future__ import annotations

import copy
import importlib.machinery
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from factories import FixedTimer, fixed_group

from simulator import native
from simulator.costmodel.deployment import deployment
from simulator.runs import runner
from simulator.serving.request import FIELDS, Request
from simulator.serving.steptime import StepTimer

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


# What the compiled build asked of the code around it.
def test_a_request_copies_every_field_apart_from_its_cached_blocks_list() -> None:
    req = Request(id=7, arrival_s=1.5, prompt_len=100, output_len=20, priority=2, adapter=3)
    req.num_computed, req.num_output, req.blocks, req.cache_keys = 60, 4, 4, [(1, 2, 3, 4)]
    clone = copy.copy(req)
    assert clone is not req
    for name in FIELDS:  # NaN times compare unequal to themselves: compare their text
        assert repr(getattr(clone, name)) == repr(getattr(req, name)), name
    assert clone.cache_keys is req.cache_keys  # shallow, as copy.copy is


def test_a_group_gives_its_step_timer_and_refuses_a_stand_in_where_one_is_needed() -> None:
    group = fixed_group()
    with pytest.raises(TypeError, match="a StepTimer is needed here, not FixedTimer"):
        _ = group.step_timer
    assert isinstance(group.timer, FixedTimer)  # the plain loop takes it as it is
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    timer = StepTimer(dep, max_num_seqs=8, max_num_batched_tokens=512, max_context=1024)
    assert fixed_group(timer=timer).step_timer is timer
