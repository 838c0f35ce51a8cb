"""Expert parallelism in the cost model: all-to-all sizes and times by hand, the load-imbalance
factor, and the layouts `Parallelism.check` accepts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator as sim
from simulator.costmodel.batch import BatchShape
from simulator.costmodel.ops import Op, expert_imbalance_from_skew, step_ops
from simulator.costmodel.roofline import evaluate
from simulator.errors import SpecError
from simulator.specs import load_hardware
from simulator.specs.deployment import Parallelism

US = 1e-6
H, TOP_K, MOE_LAYERS = 7168, 8, 58  # DeepSeek-V3: hidden, experts per token, MoE layers


# The datasheet spec without the calibration overlay: flat collective curves, so the numbers
# below follow from hardware_specs/h100_sxm.yaml alone.
H100 = load_hardware("h100_sxm", calibrated=False)


def ops_of(layout: Parallelism, batch: BatchShape) -> list[Op]:
    dep = sim.deployment(model="deepseek-v3", hardware=H100)
    return step_ops(dep.model, layout, dep.precision, batch, gpus_per_node=8)


def named(ops: list[Op], name: str) -> Op:
    return next(op for op in ops if op.name == name)


def test_all_to_all_over_two_nodes_by_hand() -> None:
    # 16 DP-attention ranks of one H100 each (2 nodes of 8), EP 16, 32 decodes per rank.
    # Each device dispatches its 32 tokens x 8 experts x 7168 x 2 bytes = 3,670,016 bytes.
    # Of 16 equal shares, 7 stay in the node (NVLink 450 GB/s x busbw 0.8 = 360 GB/s) and 8
    # leave it (scale-out 50 GB/s x 0.8 = 40 GB/s), at once:
    #   inside  7/16 x 3,670,016 / 360e9 = 4.4602 us;  outside 8/16 x 3,670,016 / 40e9 = 45.8752 us
    # plus the collective latency 25 us: 70.8752 us per all-to-all, 2 x 58 per step.
    layout = Parallelism(tp=1, dp=16, ep=16)
    ops = ops_of(layout, BatchShape.decode(batch_size=32, context_len=1000))
    dispatch, combine = named(ops, "moe_dispatch"), named(ops, "moe_combine")
    for op in (dispatch, combine):
        assert float(op.msg_bytes) == 32 * TOP_K * H * 2 == 3_670_016
        assert (op.count, op.group_size, op.collective) == (MOE_LAYERS, 16, "all_to_all")
        assert op.scales_with == "ep_group"
    (cost,) = evaluate([dispatch], H100)
    assert cost.time_s[0] == pytest.approx(70.8752 * US, rel=1e-9)
    assert cost.network_s[0] == pytest.approx(45.8752 * US, rel=1e-9)


def test_all_to_all_inside_one_node_by_hand() -> None:
    # 8 ranks in one node: 7/8 of 3,670,016 bytes over NVLink at 360 GB/s = 8.9201 us + 25 us.
    layout = Parallelism(tp=1, dp=8, ep=8)
    op = named(ops_of(layout, BatchShape.decode(batch_size=32, context_len=1000)), "moe_dispatch")
    (cost,) = evaluate([op], H100)
    assert cost.time_s[0] == pytest.approx(25 * US + 7 / 8 * 3_670_016 / 360e9, rel=1e-9)


def test_attention_tp_ranks_split_the_dispatch() -> None:
    # tp=2 x dp=4, EP 8: a rank's 64 tokens live on both of its devices; each sends 32.
    ops = ops_of(Parallelism(tp=2, dp=4, ep=8), BatchShape.decode(batch_size=64, context_len=500))
    assert float(named(ops, "moe_dispatch").msg_bytes) == 32 * TOP_K * H * 2


def test_no_all_to_all_when_experts_stay_in_the_tp_group() -> None:
    ops = ops_of(Parallelism(tp=8, ep=8), BatchShape.decode(batch_size=32, context_len=1000))
    assert not [op for op in ops if op.collective == "all_to_all"]
    assert all(op.scales_with != "ep_group" for op in ops)


def test_imbalance_scales_the_busiest_ranks_experts_and_receive() -> None:
    batch = BatchShape.decode(batch_size=32, context_len=1000)
    even = ops_of(Parallelism(tp=1, dp=16, ep=16), batch)
    skewed = ops_of(Parallelism(tp=1, dp=16, ep=16, expert_load_imbalance=1.5), batch)
    for name in ("expert_up_proj", "expert_down_proj"):
        assert float(named(skewed, name).m) == pytest.approx(1.5 * float(named(even, name).m))
        assert float(named(skewed, name).groups) == float(named(even, name).groups)
    # It receives 1.5 x the mean (32 tokens) = 48 tokens' copies, more than it sends (32).
    assert float(named(skewed, "moe_combine").msg_bytes) == 48 * TOP_K * H * 2
    # EP inside the TP group: the experts' tokens grow, there is no all-to-all.
    tp_even = ops_of(Parallelism(tp=8, ep=8), batch)
    tp_skew = ops_of(Parallelism(tp=8, ep=8, expert_load_imbalance=2.0), batch)
    up = "expert_up_proj"
    assert float(named(tp_skew, up).m) == pytest.approx(2 * float(named(tp_even, up).m))


def test_imbalance_from_skew_by_hand() -> None:
    # 4 experts, popularity 1 : 1/2 : 1/3 : 1/4 (sum 25/12), 2 ranks round-robin: rank 0 holds
    # the 1st and 3rd, (1 + 1/3) / (25/12) = 0.64 of the load against a mean of 0.5: 1.28.
    assert expert_imbalance_from_skew(num_experts=4, ep=2, skew=1.0) == pytest.approx(1.28)
    assert expert_imbalance_from_skew(num_experts=256, ep=16, skew=0.0) == pytest.approx(1.0)


@settings(max_examples=30, deadline=None)
@given(st.floats(0, 3), st.floats(0, 3), st.sampled_from([2, 4, 8, 16, 32]))
def test_imbalance_grows_with_skew_and_stays_below_ep(a: float, b: float, ep: int) -> None:
    lo, hi = sorted((a, b))
    f_lo = expert_imbalance_from_skew(num_experts=256, ep=ep, skew=lo)
    f_hi = expert_imbalance_from_skew(num_experts=256, ep=ep, skew=hi)
    assert 1.0 - 1e-12 <= f_lo <= f_hi + 1e-12 <= ep + 1e-9


def test_wide_ep_layouts_that_check() -> None:
    dep = sim.deployment(
        model="deepseek-v3",
        hardware="h100_sxm",
        data_parallel_size=16,
        expert_parallel_size=16,
        expert_load_imbalance=1.2,
    )
    assert (dep.layout.ep, dep.layout.dp, dep.layout.expert_load_imbalance) == (16, 16, 1.2)
    with pytest.raises(SpecError, match="expert parallel size 16"):  # not tp x dp
        sim.deployment(model="deepseek-v3", hardware="h100_sxm", expert_parallel_size=16)
    with pytest.raises(SpecError, match="256 experts"):  # 12 does not divide 256
        sim.deployment(
            model="deepseek-v3", hardware="h100_sxm", data_parallel_size=12, expert_parallel_size=12
        )
    with pytest.raises(SpecError) as err:
        sim.deployment(model="deepseek-v3", hardware="h100_sxm", expert_load_imbalance=0.5)
    assert err.value.field == "expert_load_imbalance"


def test_wide_ep_memory_spreads_the_experts() -> None:
    # 256 experts x 3 x 7168 x 2048 fp8 bytes x 58 layers over 16 GPUs: ~41 GiB each, which an
    # EP-in-TP layout of 8 GPUs would double.
    wide = sim.deployment(
        model="deepseek-v3", hardware="h100_sxm", data_parallel_size=16, expert_parallel_size=16
    )
    experts_per_gpu = 256 * 3 * H * 2048 * MOE_LAYERS / 16
    assert wide.memory().weights_bytes > experts_per_gpu
    assert wide.memory().fits


# -- the routing kernels around the experts ------------------------------------------------------
@pytest.mark.parametrize(
    "layout",
    [Parallelism(tp=8, ep=8), Parallelism(tp=8), Parallelism(tp=1, dp=16, ep=16)],
    ids=["ep-in-tp", "tp-only", "wide-ep"],
)
def test_routing_kernels_work_on_the_devices_own_tokens(layout: Parallelism) -> None:
    # Per MoE layer: the sort reads and writes 32 x 8 int32 ids; the top-k sum reads each of the
    # device's 32 tokens' 8 expert rows and writes one, 7168 bf16 values each, whatever the
    # experts' layout (the Triton fused_moe writes every token's top_k rows).
    ops = ops_of(layout, BatchShape.decode(batch_size=32, context_len=1000))
    align, total = named(ops, "moe_align"), named(ops, "moe_sum")
    assert float(align.bytes) == 32 * TOP_K * 4 * 2
    assert float(total.bytes) == 32 * (TOP_K + 1) * H * 2 == 4_128_768
    assert align.count == total.count == MOE_LAYERS
    assert align.scales_with == total.scales_with == "tokens"


def test_dense_models_have_no_routing_kernels() -> None:
    dep = sim.deployment(model="llama-3.1-8b", hardware=H100)
    ops = step_ops(
        dep.model, dep.layout, dep.precision, BatchShape.decode(batch_size=4, context_len=100)
    )
    assert not [op for op in ops if op.name.startswith("moe_")]
