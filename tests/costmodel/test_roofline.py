"""Roofline goldens computed by hand from the h100_sxm spec, pinned to rel=1e-6.

The spec numbers the goldens use (H100 SXM, `hardware_specs/h100_sxm.yaml`):
  bf16 peak 989.4e12 FLOP/s, 132 SMs, GEMM tiles 128 x 128, GEMM peak fraction 0.80 (bf16),
  DRAM 3.35e12 B/s at stream fraction 0.89, decode attention at 0.80 of DRAM bandwidth,
  kernel latency 3 us, NVSwitch 450e9 B/s per direction, all-reduce busbw fraction 0.80 and
  fixed latency 25 us.
`test_golden_inputs` fails first if any of them changes, so a broken golden points at the spec.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.api import allreduce_cost, attention_cost, gemm_cost
from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment, deployment
from simulator.costmodel.memory import layer_weight_bytes
from simulator.costmodel.ops import Op, collective, gemm, step_ops
from simulator.costmodel.roofline import (
    OpCost,
    collective_bandwidth,
    evaluate,
    gemm_efficiency,
    wire_bytes,
)
from simulator.costmodel.step import kernel_launches, step_cost
from simulator.specs import load_engine, load_hardware
from simulator.specs.deployment import Precision

MiB = 1024**2
H100_BF16_PEAK = 989.4e12
H100_DRAM = 3.35e12 * 0.89  # datasheet bandwidth x STREAM fraction
KERNEL_LATENCY = 3e-6
BF16 = Precision(weights="bf16", compute="bf16", kv_cache="bf16", activations="bf16")
# The goldens check the roofline's arithmetic against the hand-written spec values; the
# calibrated overlay (hardware_specs/calibration/) is exercised by the validate tests.
H100 = load_hardware("h100_sxm", calibrated=False)


def scalar(x: object) -> float:
    """The one value of a scalar op's cost field (0-d or 1-element array)."""
    return float(np.ravel(np.asarray(x, dtype=float))[0])


def bound(cost: OpCost) -> str:
    return str(np.ravel(cost.bound)[0])


def make_deployment(model: str, hardware: str = "h100_sxm") -> Deployment:
    return deployment(model=model, hardware=hardware)


def test_golden_inputs() -> None:
    hw = H100
    eff = hw.efficiency
    assert hw.peak_flops("bf16") == H100_BF16_PEAK
    assert hw.compute.units == 132
    assert (eff.gemm.tile_m, eff.gemm.tile_n, eff.gemm.peak_fraction["bf16"]) == (128, 128, 0.80)
    assert (eff.gemm.tile_m_min, eff.gemm.tile_n_min, eff.gemm.split_k_min_k) == (32, 64, 512)
    assert hw.memory.bandwidth_bytes_per_s == 3.35e12
    assert eff.memory.stream_fraction == 0.89
    assert eff.attention.decode_fraction == 0.80
    assert eff.kernel_latency_s == pytest.approx(KERNEL_LATENCY, rel=1e-12)
    assert hw.interconnect.topology == "switch"
    assert hw.interconnect.link_bw_bytes_per_s == 450e9
    assert eff.collective.busbw_fraction == 0.80
    assert eff.collective.latency_s == pytest.approx(25e-6, rel=1e-12)


# -- (a) a square GEMM ----------------------------------------------------------------------------
def test_gemm_4096_cube_bf16_on_h100() -> None:
    # flops = 2 * 4096^3 = 137,438,953,472
    # tiles: the library takes the power-of-two tile (rows 32-128, columns 64-128) that wastes
    #   least. 4096 divides every candidate, so padding is 1 and waves decide:
    #     128 x 128: 1024 tiles, ceil(1024 / 132) = 8 waves  -> 1024 / 1056 = 0.9697
    #      64 x 128 or 128 x 64: 2048 tiles, 16 waves        -> 2048 / 2112 = 0.9697
    #      32 x 128 or  64 x 64: 4096 tiles, 32 waves        -> 4096 / 4224 = 0.9697
    #      32 x 64:  8192 tiles, 63 waves                     -> 8192 / 8316 = 0.98509
    #   split-K off (more tiles than SMs)
    # efficiency = 0.80 x 8192 / 8316 = 0.788071
    # compute = 137.44e9 / (989.4e12 x 0.788071) = 176.27 us; memory = (4096 x 4096 weights
    #   + 4096 x (4096 + 4096) activations) x 2 B = 100,663,296 B / 2.9815e12 B/s = 33.76 us
    # time = compute + 3 us kernel latency = 179.27 us, compute-bound
    flops = 2 * 4096**3
    eff = 0.80 * 8192 / 8316
    compute = flops / (H100_BF16_PEAK * eff)
    cost = gemm_cost(hardware=H100, m=4096, n=4096, k=4096)
    assert float(cost.op.flops) == flops
    assert float(cost.op.bytes) == (4096 * 4096 + 4096 * 8192) * 2
    assert scalar(cost.compute_s) == pytest.approx(compute, rel=1e-6)
    assert scalar(cost.memory_s) == pytest.approx(100_663_296 / H100_DRAM, rel=1e-6)
    assert scalar(cost.time_s) == pytest.approx(compute + KERNEL_LATENCY, rel=1e-6)
    assert scalar(cost.time_s) == pytest.approx(179.27e-6, rel=1e-4)
    assert bound(cost) == "compute"


@pytest.mark.parametrize("hw", ["h100_sxm", "a100_sxm_80gb", "rtx_4090", "l40s", "mi300x"])
def test_a_longer_k_never_makes_a_skinny_gemm_faster(hw: str) -> None:
    # Split-K fills the idle SMs smoothly in k: with whole splits only, k = 960 (one split of
    # the least 512) cost more than k = 1024 (two) on every device, 1.6x on an RTX 4090.
    for m, n in [(64, 1024), (16, 4096), (256, 2048)]:
        times = [gemm_cost(hardware=hw, m=m, n=n, k=k).time_s.item() for k in range(128, 8193, 32)]
        assert np.all(np.diff(times) >= -1e-12 * max(times)), (m, n)


def test_gemm_single_row_is_memory_bound() -> None:
    # m = 1 (a decode GEMV): bytes = 4096 x 4096 x 2 (weights) + 1 x (4096 + 4096) x 2 = 33,570,816
    # memory = 33,570,816 / (3.35e12 x 0.89) = 11.26 us >> compute; time = memory + 3 us
    cost = gemm_cost(hardware=H100, m=1, n=4096, k=4096)
    nbytes = 4096 * 4096 * 2 + (4096 + 4096) * 2
    assert float(cost.op.bytes) == nbytes
    assert scalar(cost.time_s) == pytest.approx(nbytes / H100_DRAM + KERNEL_LATENCY, rel=1e-6)
    assert bound(cost) == "memory"


def test_fp8_gemm_runs_at_the_fp8_peak() -> None:
    # fp8 (W8A8): peak 1978.9e12 x fraction 0.71 x the same 8192 / 8316 waves. The GEMM reads
    # 1-byte weights and 1-byte activations and writes 2-byte outputs:
    #   4096 x 4096 x 1 + 4096 x 4096 x 1 + 4096 x 4096 x 2 bytes.
    # A quantisation kernel runs first: read 4096 x 4096 x 2, write 4096 x 4096 x 1 (pre_bytes),
    # memory-bound, with its own kernel latency. It overlaps nothing: its time adds to the
    # GEMM's max(compute, memory) however compute-bound the GEMM is.
    flops = 2 * 4096**3
    cost = gemm_cost(hardware=H100, m=4096, n=4096, k=4096, dtype="fp8")
    assert scalar(cost.compute_s) == pytest.approx(
        flops / (1978.9e12 * 0.71 * 8192 / 8316), rel=1e-6
    )
    assert float(cost.op.bytes) == 4096 * 4096 * (1 + 1 + 2)
    assert float(cost.op.pre_bytes) == 4096 * 4096 * (2 + 1)
    quant_s = 4096 * 4096 * 3 / H100_DRAM
    assert scalar(cost.memory_s) == pytest.approx(4096 * 4096 * 4 / H100_DRAM + quant_s, rel=1e-6)
    assert scalar(cost.latency_s) == pytest.approx(2 * KERNEL_LATENCY, rel=1e-6)
    assert scalar(cost.time_s) == pytest.approx(
        scalar(cost.compute_s) + quant_s + 2 * KERNEL_LATENCY, rel=1e-6
    )


def test_real_weights_cap_gemm_efficiency_at_the_data_ceiling() -> None:
    # The calibrated H100 curves come from GEMMs on uninitialised weights and reach ~0.85 of
    # the bf16 peak on a large GEMM; real weights hold the clock down to the random-input
    # maximum (0.803). A skinny GEMM, far below it, is unchanged; the spec without the
    # ceiling (the operator data's conditions) keeps the fitted value.
    hw = load_hardware("h100_sxm")
    assert hw.efficiency.gemm.data_ceiling["bf16"] == 0.803
    as_measured = hw.without_data_ceiling()
    assert as_measured.efficiency.gemm.data_ceiling == {}
    big = gemm("big", m=8192, n=8192, k=8192, count=1, prec=BF16)
    skinny = gemm("skinny", m=64, n=4096, k=4096, count=1, prec=BF16)
    assert float(gemm_efficiency(as_measured, big)) > 0.803
    assert float(gemm_efficiency(hw, big)) == pytest.approx(0.803)
    assert float(gemm_efficiency(as_measured, skinny)) < 0.5
    assert float(gemm_efficiency(hw, skinny)) == float(gemm_efficiency(as_measured, skinny))


def test_an_engine_that_fuses_activation_quantisation_skips_its_kernel() -> None:
    # vLLM (torch.compile fusion) and TensorRT-LLM (fused norm + FP8 quant) write fp8 activations
    # from the kernel before; SGLang and llama.cpp run the quantisation as a kernel of its own.
    engines = {name: load_engine(name) for name in ("vllm", "trtllm", "sglang")}
    assert engines["vllm"].fused_activation_quant and engines["trtllm"].fused_activation_quant
    assert not engines["sglang"].fused_activation_quant
    prec = Precision(weights="fp8", compute="fp8", kv_cache="bf16", activations="bf16")
    op = gemm("gemm", m=4096.0, n=4096.0, k=4096.0, count=1, prec=prec)
    alone, fused, separate = (
        evaluate([op], H100, engine)[0] for engine in (None, engines["vllm"], engines["sglang"])
    )
    quant_s = 4096 * 4096 * 3 / H100_DRAM
    assert scalar(fused.time_s) == pytest.approx(scalar(fused.compute_s) + KERNEL_LATENCY)
    assert scalar(alone.time_s) - scalar(fused.time_s) == pytest.approx(
        quant_s + KERNEL_LATENCY, rel=1e-6
    )
    assert scalar(separate.time_s) == pytest.approx(scalar(alone.time_s))
    # a bf16 GEMM has nothing to quantise: every engine prices it alike
    bf16 = gemm("gemm", m=4096.0, n=4096.0, k=4096.0, count=1, prec=BF16)
    times = {scalar(evaluate([bf16], H100, e)[0].time_s) for e in (None, *engines.values())}
    assert len(times) == 1


def test_an_nvfp4_gemm_quantises_activations_to_4_bits_and_runs_on_the_fp4_units() -> None:
    b200 = load_hardware("b200")
    fp4 = Precision(weights="fp4", compute="fp4", kv_cache="bf16", activations="bf16")
    fp8 = Precision(weights="fp8", compute="fp8", kv_cache="bf16", activations="bf16")
    m = n = k = 8192.0
    op4, op8 = (gemm("g", m=m, n=n, k=k, count=1, prec=p) for p in (fp4, fp8))
    per_elem = 0.5 + 1 / 16
    assert scalar(op4.bytes) == pytest.approx(n * k * per_elem + m * k * per_elem + m * n * 2)
    assert scalar(op4.pre_bytes) == pytest.approx(m * k * (2 + per_elem))  # read bf16, write fp4
    c4, c8 = (evaluate([op], b200)[0] for op in (op4, op8))
    peak4 = b200.peak_flops("fp4") * b200.efficiency.gemm.peak_fraction["fp4"]
    assert scalar(c4.compute_s) == pytest.approx(2 * m * n * k / peak4, rel=0.05)
    assert scalar(c4.compute_s) < scalar(c8.compute_s)


def test_the_quantisation_kernel_runs_at_its_own_measured_speed() -> None:
    # Calibrated H100: vLLM 0.14's fp8 quantisation kernel alone reaches `quant_fraction` of
    # DRAM bandwidth (x its size curve), not the STREAM fraction.
    hw = load_hardware("h100_sxm")
    quant = hw.efficiency.gemm.quant_fraction["fp8"]
    assert quant < 0.5 * hw.efficiency.memory.stream_fraction
    m, k = 8192, 8192
    pre = m * k * 3.0
    cost = gemm_cost(hardware=hw, m=m, n=32, k=k, dtype="fp8")  # a thin GEMM: the quant dominates
    quant_s = pre / (
        hw.memory.bandwidth_bytes_per_s * quant * hw.efficiency.gemm.quant_size_curve(pre)
    )
    assert scalar(cost.time_s) > quant_s
    assert scalar(cost.time_s) < 1.2 * quant_s


def test_a_block_scaled_fp8_gemm_runs_at_its_own_measured_factors() -> None:
    # A checkpoint with 128 x 128 weight blocks (DeepSeek-V3) runs vLLM's per-token-group
    # quantisation and block-scaled GEMM: the `fp8_block` factors fitted to aiconfigurator's
    # fp8_block rows, not per-tensor fp8's. Same bytes and FLOPs; measured on H100 1.3-2x the
    # per-tensor time, and the calibrated factors say so at decode and at prefill sizes.
    hw = load_hardware("h100_sxm")
    factors = hw.efficiency.gemm
    assert {"fp8", "fp8_block"} <= set(factors.peak_fraction) & set(factors.extra_latency_s)
    per_tensor = Precision(weights="fp8", compute="fp8", kv_cache="bf16", activations="bf16")
    blocks = per_tensor.model_copy(update={"fp8_blocks": True})
    for m in (1.0, 64.0, 4096.0):
        plain, blocked = (
            gemm("g", m=m, n=7168.0, k=2048.0, count=1, prec=p) for p in (per_tensor, blocks)
        )
        assert blocked.fp8_blocks and not plain.fp8_blocks
        assert scalar(blocked.bytes) == scalar(plain.bytes)
        t_plain, t_block = (scalar(evaluate([op], hw)[0].time_s) for op in (plain, blocked))
        assert 1.15 < t_block / t_plain < 2.5
    # the single-op API asks for it by name
    api = {
        b: scalar(gemm_cost(hardware=hw, m=4, n=7168, k=2048, dtype="fp8", block_scaled=b).time_s)
        for b in (False, True)
    }
    assert api[True] > 1.5 * api[False]
    # a device whose table has no fp8_block factors prices block-scaled fp8 as per-tensor
    mi300x = load_hardware("mi300x")
    assert "fp8_block" not in mi300x.efficiency.gemm.peak_fraction
    plain, blocked = (
        gemm("g", m=64.0, n=7168.0, k=2048.0, count=1, prec=p) for p in (per_tensor, blocks)
    )
    assert scalar(evaluate([blocked], mi300x)[0].time_s) == scalar(
        evaluate([plain], mi300x)[0].time_s
    )


# -- (b) a llama-2-7b decode step -----------------------------------------------------------------
# llama-2-7b: hidden 4096, 32 layers, 32 heads = 32 KV heads (MHA) of 128, SwiGLU 11008,
# vocab 32000, fp16. One decode token (m = 1); each GEMM reads its weights once plus m x (k + n)
# activations, all 2 bytes:
#   qkv_proj  k 4096, n (32 + 2 x 32) x 128 = 12288: 4096 x 12288 x 2 = 100,663,296 + 32,768
#   o_proj    k 4096, n 4096:                        4096 x  4096 x 2 =  33,554,432 + 16,384
#   up_proj   k 4096, n 2 x 11008 = 22016 (gate+up): 4096 x 22016 x 2 = 180,355,072 + 52,224
#   down_proj k 11008, n 4096:                      11008 x  4096 x 2 =  90,177,536 + 30,208
#   lm_head   k 4096, n 32000 (once):                4096 x 32000 x 2 = 262,144,000 + 72,192
LLAMA2_7B_GEMM_BYTES = {
    "qkv_proj": 100_663_296 + 32_768,
    "o_proj": 33_554_432 + 16_384,
    "up_proj": 180_355_072 + 52_224,
    "down_proj": 90_177_536 + 30_208,
    "lm_head": 262_144_000 + 72_192,
}
LLAMA2_7B_LAYER_WEIGHTS = 100_663_296 + 33_554_432 + 180_355_072 + 90_177_536  # 404,750,336
LLAMA2_7B_WEIGHTS = 32 * LLAMA2_7B_LAYER_WEIGHTS + 262_144_000  # 13,214,154,752


def _llama2_7b_decode() -> tuple[Deployment, BatchShape]:
    return make_deployment("llama-2-7b"), BatchShape.decode(batch_size=1, context_len=1024)


def test_llama2_7b_decode_gemms_stream_their_weights_once() -> None:
    dep, batch = _llama2_7b_decode()
    ops = {op.name: op for op in step_ops(dep.model, dep.layout, dep.precision, batch)}
    for name, nbytes in LLAMA2_7B_GEMM_BYTES.items():
        assert float(ops[name].bytes) == nbytes, name
    assert {name: ops[name].count for name in LLAMA2_7B_GEMM_BYTES} == {
        "qkv_proj": 32,
        "o_proj": 32,
        "up_proj": 32,
        "down_proj": 32,
        "lm_head": 1,
    }


def test_op_list_and_memory_model_agree_on_layer_weights() -> None:
    # The memory model's per-layer bytes = the GEMM weights + two RMSNorms (2 x 4096 x 2 B).
    dep, _ = _llama2_7b_decode()
    per_layer = layer_weight_bytes(dep.model, dep.layout, dep.precision)
    assert per_layer.shape == (32,)
    assert np.all(per_layer == LLAMA2_7B_LAYER_WEIGHTS + 2 * 4096 * 2)


def test_llama2_7b_decode_step_is_weight_streaming() -> None:
    # KV read at context 1024: 32 layers x 1024 tokens x (2 x 32 x 128) x 2 B = 536,870,912 B
    # Kernels with work: embedding 1 + norms 2 x 32 + 7 per layer x 32 (qkv, rotary, attention,
    #   o, up, act, down) + final norm, lm_head, sampler 3 = 292 -> 292 x 3 us = 876 us
    # step ~ (13,214,154,752 + 536,870,912) B / 2.9815e12 B/s + 876 us = 4.612 ms + 0.876 ms
    #      = 5.488 ms (the KV read runs at 0.80 rather than 0.89 of DRAM; elementwise ops add a
    #      little): within 10%, under vLLM V1, whose elementwise kernels are vectorised (without
    #      an engine, vLLM's one-block-per-token kernels add their launch: test_elementwise_kernels)
    dep, batch = _llama2_7b_decode()
    step = step_cost(
        dep.model, dep.hardware, dep.layout, dep.precision, batch, engine=load_engine("vllm")
    )
    kv_bytes = 32 * 1024 * 2 * 32 * 128 * 2
    assert float(kernel_launches(step)[0]) == 292
    expected = (LLAMA2_7B_WEIGHTS + kv_bytes) / H100_DRAM + 292 * KERNEL_LATENCY
    assert step.seconds == pytest.approx(expected, rel=0.10)
    bounds = {c.op.name: bound(c) for c in step.costs}
    assert all(bounds[name] == "memory" for name in LLAMA2_7B_GEMM_BYTES)
    # no prefill work: no time, no kernel latency; only fixed costs (none) remain
    assert bounds["attention_prefill"] == "latency"


# -- (c) an all-reduce ----------------------------------------------------------------------------
def test_allreduce_8_gpus_16_mib_on_h100() -> None:
    # ring all-reduce: each GPU sends 2 x (8 - 1) / 8 x 16 MiB = 29,360,128 B
    # at 450e9 B/s x 0.80 busbw = 360e9 B/s -> 81.56 us, plus 25 us fixed = 106.56 us
    size = 16 * MiB
    cost = allreduce_cost(hardware=H100, num_devices=8, size_bytes=size)
    expected = 25e-6 + 2 * 7 / 8 * size / (450e9 * 0.8)
    assert scalar(cost.time_s) == pytest.approx(expected, rel=1e-6)
    assert scalar(cost.time_s) == pytest.approx(106.556e-6, rel=1e-4)
    assert bound(cost) == "network"


def test_wire_bytes_of_each_collective() -> None:
    def coll(kind: str) -> Op:
        return collective("c", kind, msg_bytes=800.0, group=4, count=1)

    assert float(wire_bytes(coll("all_reduce"))) == 2 * 3 / 4 * 800
    assert float(wire_bytes(coll("all_gather"))) == 3 / 4 * 800
    assert float(wire_bytes(coll("all_to_all"))) == 3 / 4 * 800
    assert float(wire_bytes(coll("send_recv"))) == 800


def test_collective_bandwidth_by_topology() -> None:
    h100, rtx, mi300x = (load_hardware(h) for h in ("h100_sxm", "rtx_4090", "mi300x"))
    assert collective_bandwidth(h100, 8, scale_out=False) == 450e9  # NVSwitch: the full link
    # PCIe without P2P: min(peer 13 GB/s, host PCIe 32 GB/s x 0.81)
    assert collective_bandwidth(rtx, 2, scale_out=False) == 13e9
    # xGMI mesh: one 64 GB/s link to each other member, capped at the 448 GB/s aggregate
    assert collective_bandwidth(mi300x, 2, scale_out=False) == 64e9
    assert collective_bandwidth(mi300x, 8, scale_out=False) == 448e9
    # more than a node, or explicitly scale-out: the NIC
    scale_out = h100.interconnect.scale_out_bw_bytes_per_s
    assert collective_bandwidth(h100, 16, scale_out=False) == scale_out
    assert collective_bandwidth(h100, 2, scale_out=True) == scale_out


# -- (d) decode attention -------------------------------------------------------------------------
def test_decode_attention_bytes() -> None:
    # batch B = 8, KV length S = 4096, H = 32 query heads, KV = 8 KV heads, D = 128, bf16 (2 B):
    #   KV read      B x S x (2 x KV x D) x 2 = 8 x 4096 x 2 x 8 x 128 x 2 = 134,217,728
    #   Q in, O out  B x (2 x H x D) x 2      = 8 x 2 x 32 x 128 x 2      =     131,072
    #   new K, V     B x (2 x KV x D) x 2     = 8 x 2 x 8 x 128 x 2       =      32,768
    #                                                              total  = 134,381,568
    # flops = 4 x H x D x B x S (QK^T and PV) = 4 x 32 x 128 x 8 x 4096 = 536,870,912
    # time = KV read / (3.35e12 x decode fraction 0.80) + the rest / (3.35e12 x stream 0.89)
    #      + 3 us = 50.08 us + 0.055 us + 3 us = 53.14 us, memory-bound
    cost = attention_cost(
        hardware=H100,
        phase="decode",
        batch_size=8,
        seq_len=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
    )
    nbytes = 8 * 4096 * 2 * 8 * 128 * 2 + 8 * 2 * 32 * 128 * 2 + 8 * 2 * 8 * 128 * 2
    assert nbytes == 134_381_568
    assert float(cost.op.bytes) == nbytes
    assert float(cost.op.flops) == 4 * 32 * 128 * 8 * 4096
    kv_read = 8 * 4096 * 2 * 8 * 128 * 2
    assert scalar(cost.time_s) == pytest.approx(
        kv_read / (3.35e12 * 0.80) + (nbytes - kv_read) / H100_DRAM + KERNEL_LATENCY, rel=1e-6
    )
    assert bound(cost) == "memory"


def test_fp8_kv_cache_halves_the_kv_read() -> None:
    def decode_bytes(kv_dtype: str) -> float:
        cost = attention_cost(
            hardware=H100,
            phase="decode",
            batch_size=8,
            seq_len=4096,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            kv_cache_dtype=kv_dtype,
        )
        return float(cost.op.bytes)

    # KV read and new K/V at 1 B, Q/O still 2 B: 67,108,864 + 131,072 + 16,384
    assert decode_bytes("fp8") == 8 * 4096 * 2 * 8 * 128 + 8 * 2 * 32 * 128 * 2 + 8 * 2 * 8 * 128
    assert decode_bytes("auto") == 134_381_568

    # int4 (COMET): 4 bits + two fp16 per 128 = 0.53125 B an element, no 16-bit window
    packed = 8 * 4096 * 2 * 8 * 128
    assert decode_bytes("int4") == pytest.approx(
        packed * 0.53125 + 8 * 2 * 32 * 128 * 2 + 8 * 2 * 8 * 128 * 0.53125
    )
    # int2 (KIVI): 0.375 B an element, plus each sequence's 128-token window's extra bytes
    window = 8 * 128 * 2 * 8 * 128 * (2 - 0.375)
    assert decode_bytes("int2") == pytest.approx(
        packed * 0.375 + window + 8 * 2 * 32 * 128 * 2 + 8 * 2 * 8 * 128 * 0.375
    )


def test_prefill_attention_flops_are_causal() -> None:
    # B = 2 prompts of S = 1000: pairs = S (S + 1) / 2 = 500,500 each;
    # flops = 4 x H x D x pairs x B = 4 x 32 x 128 x 500,500 x 2
    cost = attention_cost(
        hardware=H100,
        phase="prefill",
        batch_size=2,
        seq_len=1000,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
    )
    assert float(cost.op.flops) == 4 * 32 * 128 * 500_500 * 2
    assert float(cost.op.seq_len) == 1000


# -- no work, no cost -----------------------------------------------------------------------------
def test_an_op_without_work_costs_nothing() -> None:
    hw = H100
    empty_gemm = gemm("g", m=0.0, n=4096, k=4096, count=1, prec=BF16)
    empty_coll = collective("c", "all_reduce", msg_bytes=0.0, group=8, count=1)
    for cost in evaluate([empty_gemm, empty_coll], hw):
        assert scalar(cost.time_s) == 0.0
        assert bound(cost) == "latency"  # the contract's set has no "none"


def test_evaluate_broadcasts_over_a_vector_of_shapes() -> None:
    hw = H100
    ms = np.array([1.0, 64.0, 4096.0])
    vec = evaluate([gemm("g", m=ms, n=4096, k=4096, count=1, prec=BF16)], hw)[0]
    for i, m in enumerate(ms):
        one = gemm_cost(hardware=hw, m=int(m), n=4096, k=4096)
        assert vec.time_s[i] == pytest.approx(scalar(one.time_s), rel=1e-12)


# -- GEMM libraries of engine releases ---------------------------------------------------------
def test_a_gemm_library_overrides_only_its_own_factors() -> None:
    hw = load_hardware("h100_sxm")
    lib = hw.efficiency.gemm_libraries["cublas-12.1"]
    under = hw.efficiency.gemm_for("cublas-12.1")
    assert under.peak_fraction["bf16"] == lib.peak_fraction["bf16"]
    assert under.size_curve == lib.size_curve
    assert under.tile_m_min == lib.tile_m_min == 128  # the fit's choice; the device's is 32
    assert hw.efficiency.gemm.tile_m_min == 32
    # fp8 keeps the device's (the library holds 16-bit measurements only), as do the largest
    # tiles and the real-weight ceiling
    assert under.peak_fraction["fp8"] == hw.efficiency.gemm.peak_fraction["fp8"]
    assert under.size_curves == hw.efficiency.gemm.size_curves
    assert under.data_ceiling == hw.efficiency.gemm.data_ceiling
    assert (under.tile_m, under.tile_n) == (hw.efficiency.gemm.tile_m, hw.efficiency.gemm.tile_n)
    assert hw.efficiency.gemm_for(None) is hw.efficiency.gemm
    assert hw.efficiency.gemm_for("no-such-library") is hw.efficiency.gemm


def test_an_engine_runs_its_releases_gemm_library_where_the_device_has_measurements() -> None:
    from simulator.api import gemm_cost

    def seconds(hardware: str, engine: str, m: int) -> float:
        cost = gemm_cost(hardware=hardware, engine=engine, m=m, n=8192, k=8192)
        return float(np.ravel(cost.kernel.time_s)[0])

    # vllm-0.6 ships PyTorch 2.4's cuBLAS 12.1: slower than today's vLLM on a large GEMM
    assert seconds("h100_sxm", "vllm-0.6", 4096) > 1.05 * seconds("h100_sxm", "vllm", 4096)
    # no measurements of that library on B200: the device's own factors for both
    assert seconds("b200", "vllm-0.6", 4096) == seconds("b200", "vllm", 4096)
    # the same library on the same device whatever the engine naming it (SGLang 0.3 ran on
    # the same PyTorch 2.4 as vLLM 0.6; today's SGLang on the newer library)
    assert seconds("h100_sxm", "vllm-0.6", 4096) == seconds("h100_sxm", "vllm-0.2", 4096)
    assert seconds("h100_sxm", "sglang-0.3", 4096) == seconds("h100_sxm", "vllm-0.6", 4096)
    assert seconds("h100_sxm", "sglang", 4096) == seconds("h100_sxm", "vllm", 4096)


def test_an_engine_runs_its_attention_kernel_where_the_device_has_a_comparison() -> None:
    def compute(hardware: str, engine: str, phase: str, seq_len: int) -> float:
        cost = attention_cost(
            hardware=hardware,
            engine=engine,
            phase=phase,
            batch_size=4,
            seq_len=seq_len,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
        )
        return float(np.ravel(cost.kernel.compute_s)[0])

    fa2 = load_hardware("h100_sxm").efficiency.attention_speed("fa2")
    assert fa2 is not None
    # vLLM 0.6 runs FlashAttention-2: its prefill on H100 computes at FA2's measured share of
    # the fitted FA3 speed (FlashAttention-3 paper, causal, head dim 128: 319 / 579 at 4k)
    for seq_len, share in ((4096, 319 / 579), (512, 191 / 292), (16384, 335 / 616)):
        assert fa2(float(seq_len)) == pytest.approx(share, abs=0.002)
        # FlashInfer 0.1 is FA2-style too; vLLM 0.2 ran FA2 through xformers
        for old in ("vllm-0.6", "sglang-0.3", "vllm-0.2"):
            ratio = compute("h100_sxm", "vllm", "prefill", seq_len) / compute(
                "h100_sxm", old, "prefill", seq_len
            )
            assert ratio == pytest.approx(fa2(float(seq_len)), rel=1e-9)
    # decode keeps the device's factors; A100 was fitted to FA2 itself: no comparison there
    assert compute("h100_sxm", "vllm-0.6", "decode", 4096) == compute(
        "h100_sxm", "vllm", "decode", 4096
    )
    assert load_hardware("a100_sxm_80gb").efficiency.attention_speed("fa2") is None
    assert load_hardware("h100_sxm").efficiency.attention_speed("no-such-kernel") is None
    for old in ("vllm-0.6", "vllm-0.2"):
        assert compute("a100_sxm_80gb", old, "prefill", 4096) == compute(
            "a100_sxm_80gb", "vllm", "prefill", 4096
        )


def test_the_kv_cache_write_costs_a_block_per_token_over_the_resident_blocks() -> None:
    from simulator.costmodel.attention_kernels import cache_write_waves
    from simulator.costmodel.ops import attention_ops

    hw = load_hardware("h100_sxm")
    block_s = hw.efficiency.attention.cache_write_block_s
    assert 1e-6 < block_s < 1e-5  # fitted to the few-KV-head prefill rows

    def prefill(kv_heads: int, batch: int, prompt: int) -> Op:
        shape = BatchShape.prefill(batch_size=batch, prompt_len=prompt)
        ops = attention_ops(
            heads=32, kv_heads=kv_heads, head_dim=128, prec=BF16, batch=shape, count=1
        )
        return ops[0]

    # 128 x 256 tokens; 512-thread blocks (4+ KV heads of 128): 4 resident per SM of 2048
    # threads, so 32768 / (132 x 4) waves, whatever the KV heads beyond 4
    for kv in (4, 8):
        waves = cache_write_waves(hw, prefill(kv, 128, 256))
        assert float(np.ravel(waves)[0]) == pytest.approx(32768 / (132 * 4))
    # one KV head: 128-thread blocks, 16 per SM: a quarter of the waves
    waves_1 = float(np.ravel(cache_write_waves(hw, prefill(1, 128, 256)))[0])
    assert waves_1 == pytest.approx(32768 / (132 * 16))
    # decode writes one token per sequence
    decode = attention_ops(
        heads=32,
        kv_heads=8,
        head_dim=128,
        prec=BF16,
        batch=BatchShape.decode(batch_size=256, context_len=1024),
        count=1,
    )[1]
    assert float(np.ravel(cache_write_waves(hw, decode))[0]) == pytest.approx(256 / (132 * 4))
    # an Ada SM holds 1536 threads: three 512-thread blocks
    ada = load_hardware("l40s")
    assert ada.compute.threads_per_unit == 1536
    ada_waves = float(np.ravel(cache_write_waves(ada, prefill(8, 128, 256)))[0])
    assert ada_waves == pytest.approx(32768 / (ada.compute.units * 3))
    # it adds to the kernel's fixed time: block time x waves
    at = hw.efficiency.attention.model_copy(update={"cache_write_block_s": 0.0})
    no_write = hw.model_copy(
        update={"efficiency": hw.efficiency.model_copy(update={"attention": at})}
    )
    op = prefill(4, 128, 256)
    added = evaluate([op], hw)[0].latency_s - evaluate([op], no_write)[0].latency_s
    assert float(np.ravel(added)[0]) == pytest.approx(block_s * 32768 / (132 * 4))
    # an op that names no K row (hand-built) gets no write
    assert float(np.ravel(cache_write_waves(hw, Op("x", "attention_prefill", 1, 1.0, 1.0)))[0]) == 0
