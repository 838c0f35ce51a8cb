"""Weight memory and GEMM costs follow each linear's format: Meta's FP8 Llama 3.1 405B (attention
and edge layers in bf16), GGUF file types, AWQ int4; and bad formats exit 2 with one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import simulator as sim
from simulator.costmodel.deployment import deployment
from simulator.costmodel.memory import layer_weight_bytes
from simulator.costmodel.op import gemm
from simulator.costmodel.roofline import evaluate
from simulator.runs.latency import estimate
from simulator.specs import load_hardware, load_model
from simulator.specs.deployment import Precision
from tests.clitools import one_line_error, run_cli
from tests.factories import scenario_data, write_yaml


def _weights(model: str, quantization: str | None = None, **kw: object) -> float:
    dep = deployment(model=model, hardware="h100_sxm", quantization=quantization, **kw)  # type: ignore[arg-type]
    return dep.memory().weights_bytes


def test_405b_fp8_weights_match_a_hand_count() -> None:
    m = load_model("meta-llama/Llama-3.1-405B-Instruct-FP8")
    assert m.id == "llama-3.1-405b-fp8" and m.weight_dtype == "fp8"
    h, inter, vocab, tp = 16384, 53248, 128256, 8
    attn = h * (16384 // tp + 2 * 128) + 16384 // tp * h  # q, k, v, o per device (bf16)
    mlp = 3 * h * inter // tp
    # 126 layers of bf16 attention and two RMSNorms; MLPs fp8 but in layers 0 and 125;
    # embedding and LM head bf16, vocab-parallel
    hand = 126 * (2 * attn + 2 * 2 * h) + 124 * mlp + 2 * 2 * mlp + 2 * 2 * vocab * h / tp
    mixed = _weights("llama-3.1-405b-fp8", tensor_parallel_size=tp)
    assert mixed == pytest.approx(hand, rel=1e-12)
    all_fp8 = _weights("llama-3.1-405b", "fp8", tensor_parallel_size=tp)
    all_bf16 = _weights("llama-3.1-405b", tensor_parallel_size=tp)
    assert all_fp8 < mixed < all_bf16
    # --quantization fp8 on the FP8 checkpoint reads its own formats, as vLLM does
    assert _weights("llama-3.1-405b-fp8", "fp8", tensor_parallel_size=tp) == mixed


def test_405b_fp8_prices_attention_gemms_in_bf16_and_mlp_in_fp8() -> None:
    result = estimate(
        model="llama-3.1-405b-fp8",
        hardware="h100_sxm",
        tensor_parallel_size=8,
        batch_size=1,
        input_len=128,
        output_len=4,
        num_iters=1,
    )
    dtypes = {c.op.name: c.op.dtype for c in result.decode_cost.costs}
    assert (dtypes["qkv_proj"], dtypes["o_proj"], dtypes["lm_head"]) == ("bf16",) * 3
    assert dtypes["up_proj"] == dtypes["down_proj"] == "fp8"
    assert not any(c.op.weight_only for c in result.decode_cost.costs)  # bf16 is no dequant
    uniform = estimate(
        model="llama-3.1-405b",
        hardware="h100_sxm",
        quantization="fp8",
        tensor_parallel_size=8,
        batch_size=1,
        input_len=128,
        output_len=4,
        num_iters=1,
    )
    assert uniform.tpot_s < result.tpot_s  # bf16 attention reads twice its fp8 bytes


def test_gguf_bits_per_weight() -> None:
    params = load_model("llama-3.1-8b").num_params
    q4_k_m = _weights("llama-3.1-8b", "gguf:Q4_K_M") * 8 / params
    assert 4.8 <= q4_k_m <= 4.95  # llama.cpp's Q4_K_M of Llama 3.1 8B: 4.92 GB, ~4.9 bits
    assert _weights("llama-3.1-8b", "gguf:Q8_0") * 8 / params == pytest.approx(8.5, abs=0.01)
    q4_0 = _weights("llama-3.1-8b", "gguf:Q4_0") * 8 / params
    assert q4_0 < q4_k_m < _weights("llama-3.1-8b", "gguf:Q5_K_M") * 8 / params


def test_int4_awq_weights_are_4x_smaller_and_decode_faster_at_batch_1() -> None:
    bf16 = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    int4 = deployment(model="llama-3.1-8b", hardware="h100_sxm", quantization="int4")
    ratio = layer_weight_bytes(bf16.model, bf16.layout, bf16.precision) / layer_weight_bytes(
        int4.model, int4.layout, int4.precision
    )
    # 2 bytes against half a byte plus one fp16 scale per 128 weights (the norms stay 16-bit)
    assert np.allclose(ratio, 2 / (0.5 + 2 / 128), rtol=1e-3)
    kw = {"hardware": "h100_sxm", "batch_size": 1, "input_len": 128, "output_len": 8}
    fast = estimate(model="llama-3.1-8b", quantization="int4", num_iters=1, **kw)  # type: ignore[arg-type]
    slow = estimate(model="llama-3.1-8b", num_iters=1, **kw)  # type: ignore[arg-type]
    assert fast.tpot_s < 0.6 * slow.tpot_s
    assert fast.memory.kv_capacity_tokens > slow.memory.kv_capacity_tokens


BENCH = ("bench", "latency", "--hardware", "h100_sxm", "--model", "llama-3.1-8b")
SHORT = ("--batch-size", "1", "--input-len", "16", "--output-len", "2")


def test_unknown_gguf_type_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(capsys, *BENCH, "-q", "gguf:Q9_K", *SHORT)
    assert "quantization" in err and "unknown GGUF type 'Q9_K'" in err


def test_engine_without_gguf_kernels_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(capsys, *BENCH, "-q", "gguf:Q4_K_M", "--engine", "trtllm", *SHORT)
    assert "no gguf kernels" in err


def test_gguf_bench_latency_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    args = (*BENCH, *SHORT, "--engine", "llamacpp")
    code, out_q4, err = run_cli(capsys, *args, "-q", "gguf:Q4_K_M")
    assert code == 0, err
    code, out_q8, err = run_cli(capsys, *args, "-q", "gguf:Q8_0")
    assert code == 0, err
    assert out_q4 != out_q8


def test_a_scenario_runs_a_gguf_file_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    group = {"hardware": "h100_sxm", "engine": "llamacpp", "quantization": "gguf:Q4_K_M"}
    data = scenario_data(input_len=32, output_len=4, num_prompts=4, group=group)
    path = write_yaml(tmp_path / "q4.yaml", data)
    result = sim.run(str(path))
    assert result.summary["completed"] == 4
    bad = write_yaml(
        tmp_path / "bad.yaml", {**data, "replicas": [{**group, "quantization": "gguf:Q3"}]}
    )
    err = one_line_error(capsys, "run", str(bad))
    assert "bad.yaml" in err and "quantization" in err and "unknown GGUF type 'Q3'" in err


def test_weight_only_int4_speedup_follows_marlins_published_shape() -> None:
    # MARLIN (arXiv:2408.11743) on an A10, a 72k x 18k layer: close to the ideal ~3.9x over
    # fp16 up to batch 16-32, falling off by 64-128 as the GEMM turns compute-bound
    hw = load_hardware("a10g")
    fp16 = Precision(weights="fp16", compute="fp16", kv_cache="fp16", activations="fp16")
    int4 = fp16.model_copy(update={"weights": "int4"})

    def speedup(m: int) -> float:
        t = [
            evaluate([gemm("w", m=m, n=73728, k=18432, count=1, prec=p)], hw)[0].time_s[0]
            for p in (fp16, int4)
        ]
        return float(t[0] / t[1])

    assert gemm("w", m=1, n=8, k=8, count=1, prec=int4).weight_only
    assert not gemm("w", m=1, n=8, k=8, count=1, prec=fp16).weight_only
    assert speedup(1) == pytest.approx(2 / (0.5 + 2 / 128), rel=0.02)
    assert speedup(16) > 3.5
    assert speedup(128) < 2.0 < speedup(16)
