"""The page-walk limit of FlashAttention-3 decode (`decode_walk_tokens_per_s`): KV tokens of up
to `decode_walk_seqs` sequences over a rate, whatever the KV heads, their dtype or the GQA
group; hand-computed cases on the H100 spec with the other decode limits switched off.

Hand numbers: a 1e9 tokens/s walk shared by 16 sequences; 131072 tokens of one sequence take
131072 / 1e9 = 131.072 us; 8 sequences 8 x that; 16, 32 or 64 sequences 16 x that (2.097 ms).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.attention_kernels import decode_kv_s, kernels
from simulator.costmodel.batch import BatchShape, Num
from simulator.costmodel.ops import Op, attention_ops
from simulator.costmodel.roofline import evaluate
from simulator.specs import HardwareSpec, load_hardware
from simulator.specs.deployment import Precision

H100 = load_hardware("h100_sxm")
WALK, SHARED = 1e9, 16.0


def precision(kv: str) -> Precision:
    return Precision(weights="bf16", compute="bf16", kv_cache=kv, activations="bf16")


def walk_only(hw: HardwareSpec, **update: object) -> HardwareSpec:
    """`hw` with a 1e9 tokens/s walk shared by 16 sequences, no per-block bound, no fp8 factor
    and a bandwidth so high that the KV read itself costs next to nothing."""
    fields: dict[str, object] = {
        "decode_walk_tokens_per_s": WALK,
        "decode_walk_seqs": SHARED,
        "decode_block_bytes_per_s": None,
        "fp8_kv_factor": 1.0,
        **update,
    }
    attention = hw.efficiency.attention.model_copy(update=fields)
    efficiency = hw.efficiency.model_copy(update={"attention": attention})
    memory = hw.memory.model_copy(update={"bandwidth_bytes_per_s": 1e18})
    return hw.model_copy(update={"efficiency": efficiency, "memory": memory})


def decode_op(*, heads: int, kv_heads: int, batch: Num, context: Num, kv: str = "bf16") -> Op:
    shape = BatchShape.decode(batch_size=batch, context_len=context)
    ops = attention_ops(
        heads=heads, kv_heads=kv_heads, head_dim=128, prec=precision(kv), batch=shape, count=1
    )
    return ops[1]


def kv_read_s(hw: HardwareSpec, op: Op) -> float:
    """Memory seconds of the op less its non-KV traffic (query, output, new KV)."""
    memory = float(np.ravel(evaluate([op], hw)[0].memory_s)[0])
    rest = float(
        np.ravel(evaluate([op], walk_only(hw, decode_walk_tokens_per_s=None))[0].memory_s)[0]
    )
    return memory - rest


@pytest.mark.parametrize(
    ("batch", "expected_s"),
    [
        (1, 131.072e-6),
        (8, 8 * 131.072e-6),
        (16, 16 * 131.072e-6),
        (32, 16 * 131.072e-6),
        (64, 16 * 131.072e-6),
    ],
)
def test_the_walk_counts_tokens_of_up_to_the_shared_sequences(
    batch: int, expected_s: float
) -> None:
    op = decode_op(heads=8, kv_heads=8, batch=batch, context=131072)
    assert kv_read_s(walk_only(H100), op) == pytest.approx(expected_s, rel=1e-3)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "kv"),
    [(1, 1, "bf16"), (8, 8, "bf16"), (64, 8, "bf16"), (64, 1, "bf16"), (8, 8, "fp8")],
)
def test_the_walk_ignores_kv_heads_dtype_and_group(heads: int, kv_heads: int, kv: str) -> None:
    # 4 sequences x 65536 tokens at 1e9 tokens/s: 262.144 us, whatever the KV bytes
    op = decode_op(heads=heads, kv_heads=kv_heads, batch=4, context=65536, kv=kv)
    assert kv_read_s(walk_only(H100), op) == pytest.approx(4 * 65536 / WALK, rel=1e-3)


def test_the_walk_and_the_bandwidth_time_join_by_a_four_norm() -> None:
    # at the H100's own bandwidth: KV read time t without the walk, 131.072 us of walk (one
    # sequence of 131072 tokens at 1e9 tokens/s): (t^4 + 131.072us^4)^(1/4)
    op = decode_op(heads=8, kv_heads=8, batch=1, context=131072)
    on = walk_only(H100).model_copy(update={"memory": H100.memory})
    off = walk_only(H100, decode_walk_tokens_per_s=None).model_copy(update={"memory": H100.memory})
    t = float(np.ravel(decode_kv_s(off, op, kernels(off, None)))[0])
    both = float(np.ravel(decode_kv_s(on, op, kernels(on, None)))[0])
    assert both == pytest.approx((t**4 + 131.072e-6**4) ** 0.25, rel=1e-9)


@pytest.mark.parametrize("split", ["none", "fa2", "paged_v2"])
def test_the_walk_applies_to_fa3_only(split: str) -> None:
    op = decode_op(heads=8, kv_heads=8, batch=1, context=131072)
    hw = walk_only(H100, decode_split=split)
    assert kv_read_s(hw, op) == pytest.approx(0.0, abs=1e-9)


def test_the_calibrated_h100_has_a_walk_and_the_a100_none() -> None:
    h100 = H100.efficiency.attention
    assert h100.decode_walk_tokens_per_s is not None and h100.decode_walk_tokens_per_s >= 1e8
    assert 1.0 <= h100.decode_walk_seqs <= 256.0
    assert load_hardware("a100_sxm_80gb").efficiency.attention.decode_walk_tokens_per_s is None


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 512),
    extra=st.integers(1, 512),
    context=st.integers(1, 131072),
    longer=st.integers(1, 65536),
)
def test_decode_time_never_falls_with_context_or_batch(
    batch: int, extra: int, context: int, longer: int
) -> None:
    def time(b: int, c: int) -> float:
        op = decode_op(heads=32, kv_heads=1, batch=b, context=c)
        return float(np.ravel(evaluate([op], H100)[0].time_s)[0])

    now = time(batch, context)
    assert time(batch + extra, context) >= now * (1 - 1e-12)
    assert time(batch, context + longer) >= now * (1 - 1e-12)
