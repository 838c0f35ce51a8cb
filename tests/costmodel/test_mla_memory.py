"""vLLM 0.7's MLA memory: absorbed matrices beside the weights, the KV row aligned on CUDA."""

from __future__ import annotations

import pytest

from simulator.costmodel.deployment import deployment
from simulator.costmodel.memory import (
    absorbed_mla_bytes,
    comm_memory_bytes,
    mla_kv_padding,
    plan_memory,
)
from simulator.units import GiB

MiB = 1024.0**2


def _plan(engine: str, hardware: str = "h200_sxm"):
    d = deployment(
        model="deepseek-v3",
        hardware=hardware,
        engine=engine,
        tensor_parallel_size=8,
        quantization="fp8",
    )
    return d, plan_memory(d.model, d.hardware, d.layout, d.precision, d.engine)


def test_vllm_07_keeps_deepseeks_absorbed_matrices_beside_the_weights() -> None:
    d, plan = _plan("vllm-0.7")
    per_layer = absorbed_mla_bytes(d.model, d.layout, d.precision, d.engine) / 61
    # W_Q_UK 1536 x 16 x 512 and W_UV_O 16 x 512 x 7168 in fp8 (12 + 56 MiB), W_QR
    # 1536 x 16 x 64 and kv_b_proj 512 x 16 x 256 in bf16 (3 + 4 MiB)
    assert per_layer == pytest.approx(75 * MiB, rel=0.01)
    assert 61 * per_layer / GiB == pytest.approx(4.47, abs=0.01)
    comm = comm_memory_bytes(d.engine, d.hardware, 8)
    assert plan.reserve_bytes == pytest.approx(
        d.engine.memory_reserve_bytes + 61 * per_layer + comm
    )
    # today's engine dropped them (0.8.0)
    d_now, _ = _plan("vllm")
    assert absorbed_mla_bytes(d_now.model, d_now.layout, d_now.precision, d_now.engine) == 0.0


def test_vllm_07_pads_the_latent_row_on_cuda_only() -> None:
    d, plan = _plan("vllm-0.7")
    assert mla_kv_padding(d.model, d.hardware, d.precision, d.engine) == pytest.approx(640 / 576)
    assert plan.kv_bytes_per_token == pytest.approx(61 * 640 * 2)  # 78,080 bytes a token
    amd, amd_plan = _plan("vllm-0.7", hardware="mi300x")
    assert mla_kv_padding(amd.model, amd.hardware, amd.precision, amd.engine) == 1.0
    assert amd_plan.kv_bytes_per_token == pytest.approx(61 * 576 * 2)
    # the same engine without either fact holds (126.36 - 80.13 - 12.40 - 1.50) GiB of
    # 70,272-byte tokens; with both, 4.47 GiB less of 78,080-byte ones
    bare = d.engine.model_copy(update={"mla_kv_align_bytes": None, "mla_absorbed_weights": False})
    without = plan_memory(d.model, d.hardware, d.layout, d.precision, bare)
    assert without.kv_bytes_per_token == pytest.approx(61 * 576 * 2)
    ratio = plan.kv_capacity_tokens / without.kv_capacity_tokens
    free = without.usable_bytes - without.weights_bytes - without.activation_bytes
    expected = (free - without.reserve_bytes - 4.47 * GiB) / (free - without.reserve_bytes)
    assert ratio == pytest.approx(expected * 576 / 640, rel=0.01)


def test_a_dense_model_is_untouched() -> None:
    d = deployment(model="llama-3.1-8b", hardware="h100_sxm", engine="vllm-0.7")
    assert mla_kv_padding(d.model, d.hardware, d.precision, d.engine) == 1.0
    assert absorbed_mla_bytes(d.model, d.layout, d.precision, d.engine) == 0.0


def test_vllm_07_holds_its_communicators_memory_by_tp_size_behind_an_nvswitch() -> None:
    from simulator.specs import load_engine, load_hardware

    engine = load_engine("vllm-0.7")
    h200 = load_hardware("h200_sxm")
    by_tp = {tp: comm_memory_bytes(engine, h200, tp) / GiB for tp in (1, 2, 3, 4, 8, 16)}
    assert by_tp == pytest.approx({1: 0.0, 2: 0.8, 3: 3.8, 4: 3.8, 8: 6.3, 16: 6.3})
    # no NVSwitch (a PCIe card), another vendor, another engine: none
    assert comm_memory_bytes(engine, load_hardware("l40s"), 8) == 0.0
    assert comm_memory_bytes(engine, load_hardware("mi300x"), 8) == 0.0
    assert comm_memory_bytes(load_engine("vllm"), h200, 8) == 0.0
    # DeepSeek-R1 at TP8 on H200, vLLM 0.7 at its defaults: vLLM's own start-up log of a 0.7.4
    # build (vllm-project/vllm PR #14842) printed 4,739 blocks of 64 tokens, 303,296 tokens
    # (an MLA model's unchunked step budget: max_model_len, 163,840 tokens)
    d = deployment(
        model="deepseek-v3", hardware="h200_sxm", engine="vllm-0.7", tensor_parallel_size=8,
        quantization="fp8",
    )  # fmt: skip
    plan = plan_memory(
        d.model, d.hardware, d.layout, d.precision, d.engine, max_num_batched_tokens=163_840
    )
    assert plan.kv_capacity_tokens == pytest.approx(303_296, rel=0.05)
