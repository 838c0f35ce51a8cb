"""The memory model: weights per device, KV capacity, fits / does not fit, batch limits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from simulator.costmodel.deployment import Deployment, deployment, fitting_layouts
from simulator.costmodel.memory import (
    MemoryPlan,
    kv_bytes_per_token_per_device,
    layer_weight_bytes,
    require_fit,
    weight_bytes_per_device,
)
from simulator.costmodel.ops import INT4_GROUP_SIZE
from simulator.errors import SpecError
from simulator.runs.latency import estimate
from simulator.units import GiB


def make_deployment(
    model: str = "llama-3.1-8b", hardware: str = "h100_sxm", **knobs: Any
) -> Deployment:
    return deployment(model=model, hardware=hardware, **knobs)


def make_plan(
    model: str = "llama-3.1-8b",
    hardware: str = "h100_sxm",
    *,
    gpu_memory_utilization: float | None = None,
    **knobs: Any,
) -> MemoryPlan:
    return make_deployment(model, hardware, **knobs).memory(
        gpu_memory_utilization=gpu_memory_utilization
    )


def test_llama_8b_on_h100_leaves_room_for_400k_kv_tokens() -> None:
    # 8.03B params x 2 B = 16.06 GB of weights out of 0.9 x 81,559 MiB = 76.97 GB; the rest
    # (~57.9 GB) at 131,072 B per token is ~442k tokens.
    plan = make_plan(gpu_memory_utilization=0.9)
    assert plan.fits
    assert plan.weights_bytes == 16_060_514_304  # 8,030,261,248 params x 2 B
    assert plan.kv_bytes_per_token == 131_072  # 2 x 8 KV heads x 128 x 32 layers x 2 B
    assert plan.kv_capacity_tokens > 400_000
    assert plan.kv_capacity_tokens == plan.kv_capacity_blocks * plan.block_size


def test_llama_405b_does_not_fit_on_one_rtx_4090() -> None:
    plan = make_plan("llama-3.1-405b", "rtx_4090")
    assert not plan.fits
    assert plan.kv_capacity_blocks == 0
    with pytest.raises(SpecError) as info:
        require_fit(plan, what="llama-3.1-405b on rtx_4090")
    message = str(info.value)
    assert "does not fit" in message
    assert "llama-3.1-405b on rtx_4090" in message
    assert f"weights {plan.weights_bytes / GiB:.2f} GiB" in message
    assert f"{plan.capacity_bytes / GiB:.2f} GiB" in message


def test_estimate_refuses_a_model_that_does_not_fit() -> None:
    with pytest.raises(SpecError, match="does not fit"):
        estimate(model="llama-3.1-405b", hardware="rtx_4090")


@pytest.mark.parametrize("seq_len", [1, 15, 16, 17, 1000, 2048, 32_768])
def test_max_batch_is_consistent_with_kv_capacity_blocks(seq_len: int) -> None:
    plan = make_plan()
    blocks_per_seq = -(-seq_len // plan.block_size)
    batch = plan.max_batch(seq_len=seq_len)
    assert batch * blocks_per_seq <= plan.kv_capacity_blocks
    assert (batch + 1) * blocks_per_seq > plan.kv_capacity_blocks


def test_bench_latency_accepts_max_batch_and_refuses_one_more() -> None:
    # rtx_4090 keeps the numbers small: ~31.6k KV tokens, 15 sequences of 2048 (planned as
    # `bench latency` runs vLLM: offline, the LLM class's 8192-token steps)
    plan = make_plan(hardware="rtx_4090", entrypoint="offline")
    batch = plan.max_batch(seq_len=2048)
    assert batch > 0
    estimate(
        model="llama-3.1-8b", hardware="rtx_4090", batch_size=batch, input_len=2040, output_len=8
    )
    with pytest.raises(SpecError, match="batch_size"):
        estimate(
            model="llama-3.1-8b",
            hardware="rtx_4090",
            batch_size=batch + 1,
            input_len=2040,
            output_len=8,
        )


def test_fp8_kv_cache_doubles_the_token_capacity() -> None:
    bf16 = make_plan()
    fp8 = make_plan(kv_cache_dtype="fp8")
    assert fp8.kv_cache_bytes == bf16.kv_cache_bytes  # everything else equal
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token / 2
    # block rounding: at most one block of difference
    assert 2 * bf16.kv_capacity_tokens <= fp8.kv_capacity_tokens
    assert fp8.kv_capacity_tokens <= 2 * bf16.kv_capacity_tokens + bf16.block_size


def test_nvfp4_weights_are_half_a_byte_plus_an_fp8_scale_per_16() -> None:
    bf16 = make_deployment(hardware="b200")
    fp4 = make_deployment(hardware="b200", quantization="fp4")
    per_param = 0.5 + 1 / 16  # e2m1 values + one fp8 (E4M3) scale per block of 16
    norms = 2 * 4096 * 2  # the norms stay 16-bit
    layers_bf16 = layer_weight_bytes(bf16.model, bf16.layout, bf16.precision)
    layers_fp4 = layer_weight_bytes(fp4.model, fp4.layout, fp4.precision)
    np.testing.assert_allclose(
        layers_fp4 - norms, (layers_bf16 - norms) * per_param / 2, rtol=1e-12
    )


def test_int4_weights_are_a_quarter_of_bf16_plus_scales() -> None:
    bf16 = make_deployment()
    int4 = make_deployment(quantization="int4")
    assert int4.precision.weights == "int4"
    # linear weights: 0.5 B + one 2 B scale per 128 weights = 0.515625 B vs 2 B; the norms
    # (2 x 4096 x 2 B per layer) stay 16-bit
    per_param = 0.5 + 2 / INT4_GROUP_SIZE
    norms = 2 * 4096 * 2
    layers_bf16 = layer_weight_bytes(bf16.model, bf16.layout, bf16.precision)
    layers_int4 = layer_weight_bytes(int4.model, int4.layout, int4.precision)
    np.testing.assert_allclose(
        layers_int4 - norms, (layers_bf16 - norms) * per_param / 2, rtol=1e-12
    )
    assert layers_int4.sum() / layers_bf16.sum() == pytest.approx(per_param / 2, rel=1e-3)
    # embedding and LM head (2 x 128,256 x 4096) stay 16-bit
    table = 2 * 128_256 * 4096 * 2
    assert weight_bytes_per_device(int4.model, int4.layout, int4.precision) == pytest.approx(
        layers_int4.sum() + table, rel=1e-12
    )


def test_tensor_parallel_shards_weights_and_kv() -> None:
    one = make_deployment("llama-3.1-70b")
    four = make_deployment("llama-3.1-70b", tensor_parallel_size=4)
    w1 = weight_bytes_per_device(one.model, one.layout, one.precision)
    w4 = weight_bytes_per_device(four.model, four.layout, four.precision)
    assert w4 == pytest.approx(w1 / 4, rel=1e-3)  # only the norms are replicated
    assert kv_bytes_per_token_per_device(four.model, four.layout, four.precision) == (
        2 * (8 // 4) * 128 * 80 * 2
    )


def test_kv_heads_are_replicated_when_tp_exceeds_them() -> None:
    # qwen3-30b-a3b has 4 KV heads of 128 and 48 layers: at tp 8 each KV head lives on two
    # devices, so each device caches max(1, 4 // 8) = 1 head, not half of one
    dep = make_deployment("qwen3-30b-a3b", tensor_parallel_size=8)
    assert kv_bytes_per_token_per_device(dep.model, dep.layout, dep.precision) == (
        2 * 1 * 128 * 48 * 2
    )


def test_pipeline_parallel_takes_the_busiest_stage() -> None:
    # 32 layers over 3 stages split 11 / 11 / 10; the first stage also holds the embedding and
    # the last the LM head, so the busiest is the first or last with 11 layers
    dep = make_deployment(pipeline_parallel_size=3)
    layers = layer_weight_bytes(dep.model, dep.layout, dep.precision)
    table = 128_256 * 4096 * 2
    assert weight_bytes_per_device(dep.model, dep.layout, dep.precision) == pytest.approx(
        layers[:11].sum() + table, rel=1e-12
    )
    assert kv_bytes_per_token_per_device(dep.model, dep.layout, dep.precision) == (
        2 * 8 * 128 * 11 * 2
    )


@pytest.mark.parametrize("util", [0.0, -0.5, 1.01])
def test_gpu_memory_utilization_out_of_range_is_an_error(util: float) -> None:
    with pytest.raises(SpecError, match="gpu_memory_utilization"):
        make_plan(gpu_memory_utilization=util)


def test_lower_utilization_leaves_less_kv_cache() -> None:
    assert (
        make_plan(gpu_memory_utilization=0.5).kv_capacity_tokens
        < make_plan(gpu_memory_utilization=0.9).kv_capacity_tokens
    )


def test_each_engine_takes_its_memory_fraction_of_what_it_says() -> None:
    """vLLM's fraction is of the whole device (activations inside it), SGLang's static pool
    holds weights and KV only, TensorRT-LLM's KV pool is a fraction of what is left once
    weights and activations are allocated: same model, device and fraction, three pools."""
    for engine in ("vllm", "sglang", "trtllm"):
        plan = make_plan(engine=engine, gpu_memory_utilization=0.9)
        total, resident = plan.capacity_bytes, plan.weights_bytes + plan.reserve_bytes
        expected = {
            "vllm": 0.9 * total - resident - plan.activation_bytes,
            "sglang": 0.9 * total - resident,
            "trtllm": 0.9 * (total - resident - plan.activation_bytes),
        }[engine]
        assert plan.kv_budget == {"vllm": "total", "sglang": "static", "trtllm": "free"}[engine]
        assert plan.kv_cache_bytes == pytest.approx(expected)
        assert plan.as_dict()["kv_budget"] == plan.kv_budget


@pytest.mark.parametrize(
    ("engine", "words"),
    [
        ("vllm", "GiB usable of"),
        ("sglang", "static pool of"),
        ("trtllm", "KV pool 0.90 of the rest"),
    ],
)
def test_memory_summary_says_how_the_pool_was_sized(engine: str, words: str) -> None:
    plan = make_plan("llama-3.1-405b", "rtx_4090", engine=engine)
    with pytest.raises(SpecError) as info:
        require_fit(plan, what="llama-3.1-405b on rtx_4090")
    assert words in str(info.value)


def test_free_budget_shrinks_with_activations_a_static_one_does_not() -> None:
    """More tokens per step means a larger activation peak: it comes out of vLLM's and
    TensorRT-LLM's KV pools (all of it, and 0.9 of it), not out of SGLang's static pool."""
    for engine, share in (("vllm", 1.0), ("trtllm", 0.9), ("sglang", 0.0)):
        small = make_deployment(engine=engine).memory(max_num_batched_tokens=2048)
        large = make_deployment(engine=engine).memory(max_num_batched_tokens=16384)
        grown = large.activation_bytes - small.activation_bytes
        assert grown > 0
        assert small.kv_cache_bytes - large.kv_cache_bytes == pytest.approx(share * grown)


def test_a_model_that_does_not_fit_names_the_fewest_gpus_that_hold_it() -> None:
    # 70B in bf16 is 131 GiB of weights: two H100s (72 GiB usable each) hold it, one does not;
    # fp8 weights on one would leave no room beside the activations (67.7 + 5 + 1.5 > 71.7)
    with pytest.raises(SpecError) as err:
        estimate(model="llama-3.1-70b", hardware="h100_sxm")
    reason = err.value.reason
    assert "fits with -tp 2 (tensor_parallel_size: 2) on h100_sxm" in reason
    assert "--quantization fp8" not in reason
    # it comes before the offload hint, which stays as the fallback
    assert reason.index("fits with") < reason.index("--cpu-offload-gb")


def test_the_layout_hint_offers_fp8_where_it_takes_fewer_gpus() -> None:
    dep = deployment(model="llama-3.1-70b", hardware="rtx_4090")
    hint = fitting_layouts(dep)
    assert hint == (
        "fits with -tp 8 (tensor_parallel_size: 8), or -tp 4 (tensor_parallel_size: 4) with "
        "--quantization fp8 on rtx_4090"
    )
    # and each layout it names does fit
    for tp, quantization in ((8, None), (4, "fp8")):
        fits = deployment(
            model="llama-3.1-70b",
            hardware="rtx_4090",
            tensor_parallel_size=tp,
            quantization=quantization,
        )
        assert fits.memory().fits
