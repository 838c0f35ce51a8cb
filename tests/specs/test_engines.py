"""The shipped engine profiles (`simulator/specs/engines/*.yaml`): every file loads, the ids other
parts of the simulator use are there, the numbers are mutually sane, and unknown ids fail as
SpecError."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.errors import SpecError
from simulator.serving.group import default_scheduler
from simulator.specs import EngineSpec, list_engines, load_engine

ENGINE_DIR = Path(__file__).resolve().parents[2] / "simulator" / "specs" / "engines"
ENGINE_IDS = sorted(p.stem for p in ENGINE_DIR.glob("*.yaml"))

# Ids the CLI, scenarios and docs refer to; they must always exist.
INTERFACE_IDS = ["llamacpp", "sglang", "trtllm", "vllm"]

# A step replayed from a graph must be cheaper to launch than even a tiny eager step.
TYPICAL_KERNELS = 10


@pytest.fixture(scope="module")
def engines() -> dict[str, EngineSpec]:
    return {engine_id: load_engine(engine_id) for engine_id in ENGINE_IDS}


def test_interface_ids_are_listed() -> None:
    listed = list_engines()
    assert listed == sorted(listed)
    for engine_id in INTERFACE_IDS:
        assert engine_id in listed


def test_every_file_is_listed() -> None:
    assert list_engines() == ENGINE_IDS


@pytest.mark.parametrize("engine_id", ENGINE_IDS)
def test_profile_loads(engine_id: str, engines: dict[str, EngineSpec]) -> None:
    spec = engines[engine_id]
    assert spec.id == engine_id
    assert spec.name
    assert spec.version


@pytest.mark.parametrize("engine_id", ENGINE_IDS)
def test_loads_by_path_too(engine_id: str, engines: dict[str, EngineSpec]) -> None:
    by_path = load_engine(str(ENGINE_DIR / f"{engine_id}.yaml"))
    assert by_path == engines[engine_id]


@pytest.mark.parametrize("engine_id", ENGINE_IDS)
def test_gpu_memory_utilization_in_range(engine_id: str, engines: dict[str, EngineSpec]) -> None:
    assert 0 < engines[engine_id].scheduler.gpu_memory_utilization <= 1


@pytest.mark.parametrize("engine_id", ENGINE_IDS)
def test_graph_replay_cheaper_than_eager_launches(
    engine_id: str, engines: dict[str, EngineSpec]
) -> None:
    ov = engines[engine_id].overhead
    assert ov.graph_launch_s < ov.launch_eager_s * TYPICAL_KERNELS


@pytest.mark.parametrize("engine_id", ENGINE_IDS)
def test_overheads_are_plausible(engine_id: str, engines: dict[str, EngineSpec]) -> None:
    """Units parsed as seconds: per-step CPU work below 50 ms (the late-2023 engine, Ray workers
    and Python scheduling, is fitted at ~14 ms), per-kernel launch below 50 us."""
    ov = engines[engine_id].overhead
    assert 0 <= ov.step_s < 50e-3
    assert 0 <= ov.per_seq_s < ov.step_s + 1e-3
    assert 0 < ov.launch_eager_s < 50e-6
    assert 0 < ov.graph_launch_s < 1e-3


@pytest.mark.parametrize("engine_id", ENGINE_IDS)
def test_scheduler_is_consistent(engine_id: str, engines: dict[str, EngineSpec]) -> None:
    spec = engines[engine_id]
    sched = spec.scheduler
    # A step must hold at least one decode token per running sequence or one full block.
    assert sched.max_num_batched_tokens >= min(sched.max_num_seqs, sched.block_size)
    assert spec.memory_reserve_bytes < 16 * 2**30
    if spec.cuda_graphs:
        assert spec.cuda_graph_max_tokens >= 1
    assert len(set(spec.quantized_kernels)) == len(spec.quantized_kernels)


def test_engines_differ_where_expected(engines: dict[str, EngineSpec]) -> None:
    """The overlap schedulers of SGLang and TensorRT-LLM leave less CPU time per step than vLLM;
    llama.cpp serves a few slots, captures graphs only for single-token steps and has no FP8."""
    vllm = engines["vllm"]
    assert engines["sglang"].overhead.step_s < vllm.overhead.step_s
    assert engines["trtllm"].overhead.step_s < vllm.overhead.step_s
    llamacpp = engines["llamacpp"]
    assert llamacpp.scheduler.max_num_seqs < vllm.scheduler.max_num_seqs
    assert llamacpp.cuda_graph_max_tokens == 1
    assert "fp8" not in llamacpp.quantized_kernels


def test_sglang_runs_prefill_steps_apart_from_decodes(engines: dict[str, EngineSpec]) -> None:
    """SGLang (no --enable-mixed-chunk) prefills first in steps of their own, still chunked;
    vLLM mixes chunks into decode steps; turning chunking off gives vLLM V0's whole prompts."""
    sglang = default_scheduler(engines["sglang"])
    assert (sglang.kind, sglang.chunked_prefill) == ("prefill_first", True)
    assert default_scheduler(engines["vllm"]).kind == "continuous"
    assert default_scheduler(engines["vllm"], chunked_prefill=False).kind == "prefill_first"
    assert default_scheduler(engines["sglang"], kind="continuous").kind == "continuous"


@pytest.mark.parametrize("bad_id", ["no-such-engine", "VLLM", "tgi"])
def test_unknown_engine_raises_spec_error(bad_id: str) -> None:
    with pytest.raises(SpecError) as info:
        load_engine(bad_id)
    assert info.value.field == "engine"
    assert "vllm" in info.value.reason  # the message lists the known ids


def test_missing_engine_file_raises_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError):
        load_engine(str(tmp_path / "missing.yaml"))


def test_bad_engine_file_names_the_field(tmp_path: Path) -> None:
    data = (ENGINE_DIR / "vllm.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(data.replace("gpu_memory_utilization: 0.9", "gpu_memory_utilization: 1.5"))
    with pytest.raises(SpecError) as info:
        load_engine(str(bad))
    assert info.value.field == "scheduler.gpu_memory_utilization"
