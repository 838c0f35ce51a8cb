"""The hardware specs and engine profiles added for devices and releases people still serve on
(L4, A10G, RTX 3090, RTX 6000 Ada, MI250X one GCD, GH200 144 GB; vLLM 0.7-0.9, SGLang 0.4):
each key fact equals the value its YAML comment cites, each profile's defaults are the ones read
in that release's source, and a prediction on a device without validation rows says so instead
of printing an error band."""

from __future__ import annotations

from typing import Any

import pytest

from simulator.errors import SpecError
from simulator.metrics.bands import load_residuals
from simulator.runs.latency import estimate
from simulator.serving.group import default_scheduler
from simulator.specs import EngineSpec, HardwareSpec, load_engine, load_hardware, load_model
from simulator.units import GB, TFLOPS, GiB, MiB

NEW_HARDWARE = ["l4", "a10g", "rtx_3090", "rtx_6000_ada", "mi250x", "gh200_144gb"]
NEW_ENGINES = ["vllm-0.7", "vllm-0.8", "vllm-0.9", "sglang-0.4"]


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


# (device, field, value in the spec's cited source). Peaks are dense.
HARDWARE_FACTS: list[tuple[str, str, float | str]] = [
    # L4: datasheet's sparse figures halved; nvidia-smi 23034 MiB; 300 GB/s; 72 W; 58 SMs
    ("l4", "compute.units", 58),
    ("l4", "compute.peak_flops_per_s.bf16", 121 * TFLOPS),
    ("l4", "compute.peak_flops_per_s.fp8", 242.5 * TFLOPS),
    ("l4", "compute.peak_flops_per_s.tf32", 60 * TFLOPS),
    ("l4", "memory.capacity_bytes", 23034 * MiB),
    ("l4", "memory.bandwidth_bytes_per_s", 300 * GB),
    ("l4", "memory.l2_cache_bytes", 48e6),
    ("l4", "interconnect.topology", "pcie"),
    ("l4", "host.pcie_gen", 4),
    ("l4", "power.tdp_w", 72),
    # A10G: 80 SMs and 6 MB L2 from the device query, 23028 MiB and 300 W from nvidia-smi; half-rate
    # FP32-accumulate tensor math: 80 x 512 x 1.71 GHz
    ("a10g", "compute.units", 80),
    ("a10g", "compute.threads_per_unit", 1536),
    ("a10g", "compute.peak_flops_per_s.bf16", 70.0 * TFLOPS),
    ("a10g", "memory.capacity_bytes", 23028 * MiB),
    ("a10g", "memory.bandwidth_bytes_per_s", 600 * GB),
    ("a10g", "memory.l2_cache_bytes", 6e6),
    ("a10g", "power.tdp_w", 300),
    # RTX 3090: GA102 whitepaper appendix A
    ("rtx_3090", "compute.units", 82),
    ("rtx_3090", "compute.peak_flops_per_s.bf16", 71 * TFLOPS),
    ("rtx_3090", "compute.peak_flops_per_s.int8", 284 * TFLOPS),
    ("rtx_3090", "memory.capacity_bytes", 24576 * MiB),
    ("rtx_3090", "memory.bandwidth_bytes_per_s", 936 * GB),
    ("rtx_3090", "power.tdp_w", 350),
    # RTX 6000 Ada: 142 SMs at 2.505 GHz, 1,457 sparse FP8; 49140 MiB; 960 GB/s; 96 MB L2; 300 W
    ("rtx_6000_ada", "compute.units", 142),
    ("rtx_6000_ada", "compute.peak_flops_per_s.bf16", 364.2 * TFLOPS),
    ("rtx_6000_ada", "compute.peak_flops_per_s.fp8", 728.5 * TFLOPS),
    ("rtx_6000_ada", "memory.capacity_bytes", 49140 * MiB),
    ("rtx_6000_ada", "memory.bandwidth_bytes_per_s", 960 * GB),
    ("rtx_6000_ada", "memory.l2_cache_bytes", 96e6),
    ("rtx_6000_ada", "power.tdp_w", 300),
    # MI250X, one GCD: half the package's 383 / 3.2768 TB/s; 110 CUs; runtime's 68702699520 bytes
    ("mi250x", "vendor", "amd"),
    ("mi250x", "compute.units", 110),
    ("mi250x", "compute.peak_flops_per_s.bf16", 191.5 * TFLOPS),
    ("mi250x", "compute.peak_flops_per_s.fp64", 47.9 * TFLOPS),
    ("mi250x", "memory.capacity_bytes", 68702699520),
    ("mi250x", "memory.bandwidth_bytes_per_s", 1.6384e12),
    ("mi250x", "memory.l2_cache_bytes", 8 * MiB),
    ("mi250x", "interconnect.gpus_per_node", 8),
    ("mi250x", "interconnect.peer_bw_bytes_per_s", 50 * GB),
    ("mi250x", "power.tdp_w", 280),
    # GH200 144 GB: HBM3e 4.9 TB/s, nvidia-smi 146831 MiB, NVLink-C2C 450 GB/s per direction to
    # 480 GB LPDDR5X, two superchips joined by NV18
    ("gh200_144gb", "compute.peak_flops_per_s.bf16", 989.4 * TFLOPS),
    ("gh200_144gb", "memory.capacity_bytes", 146831 * MiB),
    ("gh200_144gb", "memory.bandwidth_bytes_per_s", 4.9e12),
    ("gh200_144gb", "host.pcie_bw_bytes_per_s", 450 * GB),
    ("gh200_144gb", "host.memory_bytes", 480 * GB),
    ("gh200_144gb", "host.memory_bw_bytes_per_s", 546 * GB),
    ("gh200_144gb", "interconnect.gpus_per_node", 2),
    ("gh200_144gb", "interconnect.peer_bw_bytes_per_s", 450 * GB),
]


@pytest.fixture(scope="module")
def specs() -> dict[str, HardwareSpec]:
    return {hw: load_hardware(hw) for hw in NEW_HARDWARE}


@pytest.mark.parametrize(("hw", "field", "value"), HARDWARE_FACTS)
def test_key_fact_is_the_cited_value(
    specs: dict[str, HardwareSpec], hw: str, field: str, value: float | str
) -> None:
    got = _get(specs[hw], field)
    if isinstance(value, str):
        assert got == value
    else:
        assert got == pytest.approx(value, rel=1e-3)


@pytest.mark.parametrize("hw", ["a10g", "rtx_3090", "mi250x"])
def test_parts_without_an_fp8_matrix_unit_have_no_fp8_peak(
    specs: dict[str, HardwareSpec], hw: str
) -> None:
    # Ampere (GA102) and CDNA2 have no FP8 matrix unit: fp8 runs weight-only there.
    assert not specs[hw].supports("fp8")


def test_mi250x_is_one_gcd_as_rocm_exposes_it(specs: dict[str, HardwareSpec]) -> None:
    # 64 GB and half the package's peak, not the 128 GB / 383 TFLOP/s package.
    spec = specs["mi250x"]
    assert spec.memory.capacity_bytes < 64 * GiB
    assert spec.peak_flops("bf16") == pytest.approx(383e12 / 2)
    assert "tf32" not in spec.compute.peak_flops_per_s  # CDNA2 has no TF32


def test_gh200_144gb_differs_from_the_96gb_part_in_memory_only(
    specs: dict[str, HardwareSpec],
) -> None:
    small = load_hardware("gh200")
    big = specs["gh200_144gb"]
    assert big.compute == small.compute
    assert big.memory.capacity_bytes > small.memory.capacity_bytes
    assert big.memory.bandwidth_bytes_per_s > small.memory.bandwidth_bytes_per_s
    # same NVLink-C2C host link and Grace memory for CPU offload
    assert big.host.pcie_bw_bytes_per_s == small.host.pcie_bw_bytes_per_s
    # H100 SXM's fitted attention and collectives, as the 96 GB part takes them
    h100 = load_hardware("h100_sxm").efficiency
    assert big.efficiency.attention == h100.attention
    assert big.efficiency.collective.model_dump(exclude={"busbw_fraction"}) == (
        h100.collective.model_dump(exclude={"busbw_fraction"})
    )


# -- engine profiles ------------------------------------------------------------------------------
# (profile, field, value read in that release's source)
ENGINE_DEFAULTS: list[tuple[str, str, Any]] = [
    ("vllm-0.7", "scheduler.max_num_seqs", 256),
    ("vllm-0.7", "scheduler.max_num_batched_tokens", 2048),
    ("vllm-0.7", "scheduler.chunked_prefill", False),
    ("vllm-0.7", "scheduler.chunked_prefill_above", 32768),
    ("vllm-0.7", "scheduler.prefix_caching", False),
    ("vllm-0.7", "scheduler.block_size", 16),
    ("vllm-0.7", "scheduler.gpu_memory_utilization", 0.9),
    ("vllm-0.7", "scheduler.watermark", 0.01),
    ("vllm-0.7", "cuda_graph_max_tokens", 256),
    ("vllm-0.7", "attention_kernel", None),
    ("vllm-0.7", "gemm_library", None),
    ("vllm-0.7", "multi_step_scheduling", True),
    ("vllm-0.8", "scheduler.chunked_prefill", True),
    ("vllm-0.8", "scheduler.prefix_caching", True),
    ("vllm-0.8", "scheduler.watermark", 0.0),
    ("vllm-0.8", "cuda_graph_max_tokens", 512),
    ("vllm-0.8", "fused_activation_quant", False),
    ("vllm-0.8", "overhead.async_residual_s", None),
    ("vllm-0.8", "multi_step_scheduling", False),
    ("vllm-0.9", "scheduler.chunked_prefill", True),
    ("vllm-0.9", "fused_activation_quant", False),
    ("vllm-0.9", "overhead.async_residual_s", None),
    ("sglang-0.4", "scheduler.max_num_seqs", 2048),
    ("sglang-0.4", "scheduler.max_num_batched_tokens", 8192),
    ("sglang-0.4", "scheduler.mixed_prefill", False),
    ("sglang-0.4", "scheduler.block_size", 1),
    ("sglang-0.4", "scheduler.prefix_caching", True),
    ("sglang-0.4", "scheduler.kv_budget", "static"),
    ("sglang-0.4", "scheduler.gpu_memory_utilization", 0.88),
    ("sglang-0.4", "scheduler.static_reserve", None),
    ("sglang-0.4", "cuda_graph_max_tokens", 160),
]


@pytest.fixture(scope="module")
def engines() -> dict[str, EngineSpec]:
    return {engine: load_engine(engine) for engine in NEW_ENGINES}


@pytest.mark.parametrize(("engine", "field", "value"), ENGINE_DEFAULTS)
def test_profile_default_is_the_releases(
    engines: dict[str, EngineSpec], engine: str, field: str, value: Any
) -> None:
    assert _get(engines[engine], field) == value


# (profile, device, entrypoint, tensor parallel, max_num_seqs, max_num_batched_tokens, graphs)
BY_DEVICE: list[tuple[str, str, str, int, int, int, int]] = [
    # vLLM 0.8.5: 70 GiB and up (A100 80GB included) -> 1024 / 8192 (server) / 16384 (offline)
    ("vllm-0.8", "h100_sxm", "server", 1, 1024, 8192, 512),
    ("vllm-0.8", "a100_sxm_80gb", "offline", 1, 1024, 16384, 512),
    ("vllm-0.8", "l4", "server", 1, 256, 2048, 512),
    ("vllm-0.8", "l4", "offline", 1, 256, 8192, 512),
    # vLLM 0.9: A100 excluded from the large defaults
    ("vllm-0.9", "a100_sxm_80gb", "server", 1, 256, 2048, 512),
    ("vllm-0.9", "a100_sxm_80gb", "offline", 1, 256, 8192, 512),
    ("vllm-0.9", "gh200_144gb", "server", 1, 1024, 8192, 512),
    # SGLang 0.4.6: chunk 2048 and 8 (80 at tp >= 4) graphs below 25,000 MiB; graphs to 256 above
    # 96 GiB
    ("sglang-0.4", "l4", "server", 1, 2048, 2048, 8),
    ("sglang-0.4", "rtx_3090", "server", 4, 2048, 2048, 80),
    ("sglang-0.4", "rtx_6000_ada", "server", 1, 2048, 8192, 160),
    ("sglang-0.4", "h100_sxm", "server", 1, 2048, 8192, 160),
    ("sglang-0.4", "h200_sxm", "server", 1, 2048, 8192, 256),
]


@pytest.mark.parametrize(("engine", "hw", "entry", "tp", "seqs", "tokens", "graphs"), BY_DEVICE)
def test_profile_limits_by_device(
    engines: dict[str, EngineSpec],
    engine: str,
    hw: str,
    entry: str,
    tp: int,
    seqs: int,
    tokens: int,
    graphs: int,
) -> None:
    memory = load_hardware(hw).memory.capacity_bytes
    spec = engines[engine].on_device(
        hardware_id=hw,
        memory_bytes=memory,
        entrypoint=entry,  # type: ignore[arg-type]
        tensor_parallel=tp,
    )
    assert spec.scheduler.max_num_seqs == seqs
    assert spec.scheduler.max_num_batched_tokens == tokens
    assert spec.cuda_graph_max_tokens == graphs


def test_vllm_07_chunks_prefill_only_above_32k_context(engines: dict[str, EngineSpec]) -> None:
    """vLLM V0's EngineArgs: chunked prefill on (budget 2048) for max_model_len > 32768, else off
    with a step of max(max_model_len, 2048)."""
    engine = engines["vllm-0.7"]
    long = default_scheduler(engine, max_model_len=131072)
    assert long.chunked_prefill and long.max_num_batched_tokens == 2048
    short = default_scheduler(engine, max_model_len=8192)
    assert not short.chunked_prefill and short.max_num_batched_tokens == 8192
    exact = default_scheduler(engine, max_model_len=32768)
    assert not exact.chunked_prefill
    # an explicit choice wins
    off = default_scheduler(engine, max_model_len=131072, chunked_prefill=False)
    assert not off.chunked_prefill and off.max_num_batched_tokens == 131072
    # profiles without the rule keep their own default
    assert not default_scheduler(load_engine("vllm-0.6"), max_model_len=131072).chunked_prefill


def test_vllm_07_bench_latency_fits_llama_31_on_an_l4_by_chunking() -> None:
    # 128K context: chunked prefill on, so no step holds 131,072 tokens of activations.
    result = estimate(
        model="llama-3.1-8b",
        hardware="l4",
        engine="vllm-0.7",
        input_len=256,
        output_len=8,
        num_iters=1,
    )
    assert result.memory.activation_bytes < 2 * GiB
    with pytest.raises(SpecError, match="does not fit"):
        estimate(
            model="llama-3.1-8b",
            hardware="l4",
            engine="vllm-0.7",
            enable_chunked_prefill=False,
            input_len=256,
            output_len=8,
            num_iters=1,
        )


# -- no validation rows: no error band, a note ----------------------------------------------------
@pytest.mark.parametrize("hw", NEW_HARDWARE)
def test_new_device_predictions_are_reported_as_unbacked(hw: str) -> None:
    engine = "vllm-0.8"
    backed = {(r.device, r.engine_family) for r in load_residuals()}
    result = estimate(
        model="llama-3.1-8b",
        hardware=hw,
        engine=engine,
        batch_size=2,
        input_len=128,
        output_len=8,
        num_iters=1,
    )
    assert result.latency_s > 0
    out = result.intervals()
    if (hw, "vllm") in backed:  # validation rows were added for it: then it has bands
        assert "avg_latency_interval" in out
    else:
        assert out == {"interval_note": f"no end-to-end validation rows for {hw} under vllm"}
        assert not any(key.endswith("_interval") for key in out)


def test_vllm_07_runs_mla_models_unchunked(engines: dict[str, EngineSpec]) -> None:
    """vLLM V0 0.7-0.8 had no chunked prefill for MLA (0.7.3's VllmConfig forces it off; 0.8.0's
    _set_default_args_v0 leaves it off): a DeepSeek model runs unchunked with a step of
    max(max_model_len, 2048) tokens whatever its context length; other models and V1 profiles
    keep their rule."""
    v3 = load_model("deepseek-v3")
    llama = load_model("llama-3.1-8b")
    engine = engines["vllm-0.7"]
    mla = default_scheduler(engine, max_model_len=163840, model=v3)
    assert not mla.chunked_prefill and mla.max_num_batched_tokens == 163840
    assert mla.kind == "prefill_first"  # V0 without chunking: a step is all prefill or decode
    assert default_scheduler(engine, max_model_len=163840, model=llama).chunked_prefill
    # an explicit choice still wins
    asked = default_scheduler(engine, max_model_len=163840, model=v3, chunked_prefill=True)
    assert asked.chunked_prefill and asked.max_num_batched_tokens == 2048
    # V1 chunks MLA models as any other
    assert default_scheduler(engines["vllm-0.8"], max_model_len=163840, model=v3).chunked_prefill


def test_a_vllm_07_run_prefills_deepseek_prompts_whole() -> None:
    """The run picks the MLA default up: prompts of 3000 tokens go through in whole prompts a
    step (more than the 2048 tokens a chunked step would take), never mixed with decodes."""
    import math

    from simulator.runs import runner
    from simulator.specs.engine_args import EngineArgs
    from simulator.specs.workload import WorkloadSpec
    from simulator.workload.requests import RandomDataset

    workload = WorkloadSpec(
        dataset=RandomDataset(input_len=3000, output_len=8, range_ratio=0.0),
        num_prompts=4,
        request_rate=math.inf,
    )
    scenario = runner.bench_scenario(
        model="deepseek-v3",
        hardware="h200_sxm",
        workload=workload,
        engine_args=EngineArgs(engine="vllm-0.7", tensor_parallel_size=8, quantization="fp8"),
    )
    steps = runner.run(scenario).sim.steps
    prefill = steps[steps["prefill_tokens"] > 0]
    assert (prefill["prefill_tokens"] % 3000 == 0).all()
    assert prefill["prefill_tokens"].max() > 2048
    assert (prefill["decode_tokens"] == 0).all()
