"""The shipped engine profiles (`simulator/specs/engines/*.yaml`): every file loads, the ids other
parts of the simulator use are there, the numbers are mutually sane, and unknown ids fail as
SpecError."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.costmodel.deployment import deployment
from simulator.errors import SpecError
from simulator.serving.group import default_scheduler
from simulator.specs import EngineSpec, list_engines, load_engine

ENGINE_DIR = Path(__file__).resolve().parents[2] / "simulator" / "specs" / "engines"
ENGINE_IDS = sorted(p.stem for p in ENGINE_DIR.glob("*.yaml"))

# Ids the CLI, scenarios and docs refer to; they must always exist.
INTERFACE_IDS = [
    "llamacpp",
    "sglang",
    "trtllm",
    "vllm",
    "vllm-0.7",
    "vllm-0.8",
    "vllm-0.9",
    "sglang-0.4",
]

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
    vLLM mixes chunks into decode steps, and with chunking off whole prompts (V1); vLLM V0
    without chunking runs prompts first (tests/serving/test_unchunked_mixing.py)."""
    sglang = default_scheduler(engines["sglang"])
    assert (sglang.kind, sglang.chunked_prefill) == ("prefill_first", True)
    assert default_scheduler(engines["vllm"]).kind == "continuous"
    assert default_scheduler(engines["vllm"], chunked_prefill=False).kind == "continuous"
    assert default_scheduler(engines["vllm-0.6"], chunked_prefill=False).kind == "prefill_first"
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


# -- base: a profile that starts from another -----------------------------------------------------
def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_base_lays_the_file_over_the_named_profile(tmp_path: Path) -> None:
    """`base: vllm` plus one scheduler knob: vLLM's profile with that knob (and its sibling
    knobs kept: mappings merge key by key), the file's own id."""
    path = write(
        tmp_path / "my-vllm.yaml",
        "base: vllm\nversion: fork\nscheduler:\n  max_num_seqs: 64\n",
    )
    spec, vllm = load_engine(path), load_engine("vllm")
    assert spec.id == "my-vllm" and spec.version == "fork" and spec.name == vllm.name
    assert spec.scheduler.max_num_seqs == 64
    expected = vllm.model_copy(
        update={
            "id": "my-vllm",
            "version": "fork",
            "scheduler": vllm.scheduler.model_copy(update={"max_num_seqs": 64}),
        }
    )
    assert spec == expected


def test_base_carries_its_calibration(tmp_path: Path) -> None:
    """A profile on `base: vllm-0.2` runs vllm-0.2's fitted CPU overheads (its
    calibration/vllm-0.2.yaml), and the priors with calibrated=False."""
    path = write(tmp_path / "late-2023.yaml", "base: vllm-0.2\n")
    assert load_engine(path).overhead == load_engine("vllm-0.2").overhead
    priors = load_engine("vllm-0.2", calibrated=False).overhead
    assert load_engine(path, calibrated=False).overhead == priors
    assert priors != load_engine("vllm-0.2").overhead


def test_base_by_relative_path_and_chained(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "base: trtllm\ncuda_graph_max_tokens: 64\n")
    (tmp_path / "sub").mkdir()
    path = write(tmp_path / "sub" / "b.yaml", "base: ../a.yaml\nattention_factor: 0.9\n")
    spec = load_engine(path)
    assert (spec.cuda_graph_max_tokens, spec.attention_factor) == (64, 0.9)
    assert spec.overhead == load_engine("trtllm").overhead


def test_shipped_profile_on_a_base_differs_only_where_it_says() -> None:
    """sglang-0.3 starts from sglang: the launch costs it does not state are sglang's; its
    per-step and per-sequence CPU work (no overlap scheduler) are its own, and larger."""
    old, new = load_engine("sglang-0.3"), load_engine("sglang")
    launches = ("launch_eager_s", "graph_launch_s", "async_residual_s")
    assert all(getattr(old.overhead, f) == getattr(new.overhead, f) for f in launches)
    assert old.overhead.step_s > new.overhead.step_s
    assert old.overhead.per_seq_s > new.overhead.per_seq_s
    assert old.scheduler.max_num_seqs == new.scheduler.max_num_seqs
    assert (old.cuda_graph_max_tokens, old.gemm_library) == (160, "cublas-12.1")


def test_trtllm_06_is_todays_trtllm_without_graphs_python_or_split() -> None:
    """trtllm-0.6 (TensorRT engines in the C++ session) starts from trtllm and changes only
    the host side, the decode split, the KV memory and the GEMMs: launched from C++, no graphs,
    no per-request work, the batch's non-paged KV in all the free memory, and TensorRT's own
    GEMM tactics (the device's factors) instead of the PyTorch backend's cuBLAS calls; and
    static session batches, not the in-flight batching that puts whole prompts beside decodes."""
    old, new = load_engine("trtllm-0.6"), load_engine("trtllm")
    assert (old.cuda_graphs, old.cuda_graph_max_tokens, old.decode_split) == (False, 0, "none")
    assert old.overhead.per_seq_s == 0 and old.overhead.launch_eager_s < new.overhead.launch_eager_s
    assert (old.gemm_library, new.gemm_library) == (None, "cublas-13.1")
    same = ("attention_factor", "scalar_row_kernels", "fused_activation_quant")
    assert all(getattr(old, f) == getattr(new, f) for f in same)
    memory = {"gpu_memory_utilization": 1.0, "prefix_caching": False, "unchunked_mixed": False}
    assert old.scheduler == new.scheduler.model_copy(update=memory)
    assert old.scheduler.kv_budget == new.scheduler.kv_budget == "free"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("base: no-such-engine\n", "unknown engine (known: "),
        ("base: missing.yaml\n", "no such file"),
        ("base: [vllm]\n", "expected an engine id or a path"),
        ("base: loop.yaml\n", "base profiles form a cycle (loop -> loop)"),
    ],
)
def test_bad_base_names_the_file_and_field(tmp_path: Path, text: str, reason: str) -> None:
    path = write(tmp_path / "loop.yaml", text)
    with pytest.raises(SpecError) as info:
        load_engine(path)
    assert (info.value.source, info.value.field) == (path, "base")
    assert reason in info.value.reason


def test_error_in_the_base_file_names_that_file(tmp_path: Path) -> None:
    base = write(tmp_path / "base.yaml", "base: vllm\nscheduler:\n  max_num_seqs: -1\n")
    path = write(tmp_path / "child.yaml", "base: base.yaml\n")
    with pytest.raises(SpecError) as info:
        load_engine(path)
    assert (info.value.source, info.value.field) == (base, "scheduler.max_num_seqs")


@pytest.mark.parametrize("engine", ["trtllm", "trtllm-0.6"])
def test_tensorrt_llm_runs_on_nvidia_gpus_only(engine: str) -> None:
    assert load_engine(engine).vendors == ["nvidia"]
    with pytest.raises(SpecError, match="runs on nvidia GPUs, not on AMD Instinct MI300X") as info:
        deployment(model="llama-3.1-8b", hardware="mi300x", engine=engine)
    assert info.value.field == "engine"
    deployment(model="llama-3.1-8b", hardware="h100_sxm", engine=engine)
    deployment(model="llama-3.1-8b", hardware="mi300x", engine="sglang")  # any vendor
