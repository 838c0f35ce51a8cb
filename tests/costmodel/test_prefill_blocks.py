"""Prefill attention's thread blocks (`roofline.prefill_work`) under each kernel family:
hand-computed cases, plus monotonicity of prefill time in prompt length and batch.

FlashAttention-2 (`fa2`, vLLM's paged split-KV kernel): sequences x query heads x 64-row
tiles, a GQA group's heads in separate blocks, except a one-token query, whose group is
packed (`seqlenq_ngroups_swapped`). Others (FlashAttention-3): sequences x KV heads x
128-row tiles of the packed group. Tiles are continuous, at least one per block row set.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.batch import BatchShape, Num
from simulator.costmodel.ops import Op, attention_ops
from simulator.costmodel.roofline import evaluate, prefill_work
from simulator.specs import HardwareSpec, load_hardware
from simulator.specs.deployment import Precision

BF16 = Precision(weights="bf16", compute="bf16", kv_cache="bf16", activations="bf16")
A100 = load_hardware("a100_sxm_80gb")
H100 = load_hardware("h100_sxm")


def with_split(hw: HardwareSpec, split: str) -> HardwareSpec:
    attention = hw.efficiency.attention.model_copy(update={"decode_split": split})
    efficiency = hw.efficiency.model_copy(update={"attention": attention})
    return hw.model_copy(update={"efficiency": efficiency})


def prefill_op(*, heads: int, kv_heads: int, batch: Num, prompt: Num) -> Op:
    shape = BatchShape.prefill(batch_size=batch, prompt_len=prompt)
    ops = attention_ops(
        heads=heads, kv_heads=kv_heads, head_dim=128, prec=BF16, batch=shape, count=1
    )
    return ops[0]


@pytest.mark.parametrize(
    ("split", "shape", "expected"),
    [
        # FA2: 4 prompts x 32 query heads x 1024 / 64 = 16 tiles -> 2048
        ("fa2", {"heads": 32, "kv_heads": 8, "batch": 4, "prompt": 1024}, 4 * 32 * 16),
        # FA2, a prompt shorter than a tile: one tile per (sequence, query head)
        ("fa2", {"heads": 32, "kv_heads": 8, "batch": 256, "prompt": 16}, 256 * 32),
        # FA2, one-token query: the group of 4 packed into one 64-row tile per KV head
        ("fa2", {"heads": 32, "kv_heads": 8, "batch": 256, "prompt": 1}, 256 * 8),
        # FA2, one-token query of a group of 128: 2 tiles per KV head
        ("fa2", {"heads": 128, "kv_heads": 1, "batch": 2, "prompt": 1}, 2 * 1 * 2),
        # FA3: 4 x 8 KV heads x (1024 x 4 rows) / 128 = 32 tiles -> 1024
        ("fa3", {"heads": 32, "kv_heads": 8, "batch": 4, "prompt": 1024}, 4 * 8 * 32),
        # FA3: 16 x 4 = 64 packed rows, one tile per (sequence, KV head)
        ("fa3", {"heads": 32, "kv_heads": 8, "batch": 256, "prompt": 16}, 256 * 8),
        ("none", {"heads": 32, "kv_heads": 8, "batch": 256, "prompt": 16}, 256 * 8),
    ],
)
def test_prefill_blocks_by_hand(split: str, shape: dict[str, int], expected: float) -> None:
    op = prefill_op(
        heads=shape["heads"],
        kv_heads=shape["kv_heads"],
        batch=shape["batch"],
        prompt=shape["prompt"],
    )
    assert float(np.ravel(prefill_work(op, split))[0]) == pytest.approx(expected, rel=1e-12)


def test_fa2_prefill_time_of_short_prompts_follows_query_heads_not_kv_heads() -> None:
    # 256 prompts of 16 tokens, 32 query heads: FA2 launches 8192 blocks whatever the KV
    # heads, so its per-wave time is the same for MHA-like kv=8 and MQA kv=1; FA3 packs the
    # group, and kv=1 (32 x 16 = 512 rows, 4 tiles) launches half the blocks of kv=8. (The
    # KV-cache write before it, whose blocks do grow with the KV heads, is left out here.)
    def latency(hw: HardwareSpec, kv_heads: int) -> float:
        op = prefill_op(heads=32, kv_heads=kv_heads, batch=256, prompt=16)
        return float(np.ravel(evaluate([op], hw)[0].latency_s)[0])

    at = A100.efficiency.attention.model_copy(update={"cache_write_block_s": 0.0})
    a100 = A100.model_copy(
        update={"efficiency": A100.efficiency.model_copy(update={"attention": at})}
    )
    assert latency(a100, 1) == pytest.approx(latency(a100, 8), rel=1e-12)
    fa3 = with_split(a100, "fa3")
    assert latency(fa3, 1) < latency(fa3, 8)


FEW = settings(max_examples=30, deadline=None)


@FEW
@given(
    hw=st.sampled_from([A100, H100]),
    split=st.sampled_from(["fa2", "fa3"]),
    group=st.sampled_from([1, 4, 8, 128]),
    kv_heads=st.integers(1, 8),
    batch=st.integers(1, 256),
)
def test_prefill_time_never_falls_as_the_prompt_grows(
    hw: HardwareSpec, split: str, group: int, kv_heads: int, batch: int
) -> None:
    prompt = np.unique(np.round(np.geomspace(1, 32768, 300)))
    op = prefill_op(heads=group * kv_heads, kv_heads=kv_heads, batch=batch, prompt=prompt)
    times = evaluate([op], with_split(hw, split))[0].time_s
    assert np.all(np.diff(times) >= -1e-12 * times[1:])


@FEW
@given(
    hw=st.sampled_from([A100, H100]),
    split=st.sampled_from(["fa2", "fa3"]),
    group=st.sampled_from([1, 4, 8, 128]),
    kv_heads=st.integers(1, 8),
    prompt=st.integers(1, 16384),
)
def test_prefill_time_never_falls_as_the_batch_grows(
    hw: HardwareSpec, split: str, group: int, kv_heads: int, prompt: int
) -> None:
    batch = np.arange(1.0, 513.0)
    op = prefill_op(heads=group * kv_heads, kv_heads=kv_heads, batch=batch, prompt=prompt)
    times = evaluate([op], with_split(hw, split))[0].time_s
    assert np.all(np.diff(times) >= -1e-12 * times[1:])
