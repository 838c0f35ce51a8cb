"""Decode attention's thread blocks under each split-KV choice, the per-block streaming bound
and the FA2 GQA re-layout cost: hand-computed cases, plus monotonicity in context and batch.

Hand numbers use SM counts of 108 (A100) and 132 (H100) and 128-token KV tiles:
  fa3 fills 132 / 1.1 = 120 blocks, fa2 fills 2 x 108 = 216 (GQA layers only), none keeps
  sequences x KV heads; paged_v2 (vLLM 0.2) launches sequences x query heads x 512-token
  partitions.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.batch import BatchShape, Num
from simulator.costmodel.ops import Op, attention_ops
from simulator.costmodel.roofline import decode_blocks, evaluate
from simulator.errors import SpecError
from simulator.specs import HardwareSpec, load_engine, load_hardware
from simulator.specs.deployment import Precision

BF16 = Precision(weights="bf16", compute="bf16", kv_cache="bf16", activations="bf16")
A100 = load_hardware("a100_sxm_80gb")
H100 = load_hardware("h100_sxm")


def with_attention(hw: HardwareSpec, **update: object) -> HardwareSpec:
    attention = hw.efficiency.attention.model_copy(update=update)
    efficiency = hw.efficiency.model_copy(update={"attention": attention})
    return hw.model_copy(update={"efficiency": efficiency})


def decode_op(*, heads: int, kv_heads: int, batch: Num, context: Num) -> Op:
    shape = BatchShape.decode(batch_size=batch, context_len=context)
    ops = attention_ops(
        heads=heads, kv_heads=kv_heads, head_dim=128, prec=BF16, batch=shape, count=1
    )
    return ops[1]


def blocks(hw: HardwareSpec, split: str, **shape: int) -> float:
    op = decode_op(
        heads=shape["heads"],
        kv_heads=shape["kv_heads"],
        batch=shape["batch"],
        context=shape["context"],
    )
    return float(np.ravel(decode_blocks(with_attention(hw, decode_split=split), op))[0])


def test_the_calibrated_devices_name_their_kernels_split() -> None:
    assert A100.efficiency.attention.decode_split == "fa2"
    assert H100.efficiency.attention.decode_split == "fa3"


@pytest.mark.parametrize(
    ("hw", "split", "shape", "expected"),
    [
        # one sequence, one KV head, 131072 tokens = 1024 tiles: split to fill the SMs
        (H100, "fa3", {"heads": 8, "kv_heads": 1, "batch": 1, "context": 131072}, 120.0),
        (A100, "fa2", {"heads": 8, "kv_heads": 1, "batch": 1, "context": 131072}, 216.0),
        (A100, "none", {"heads": 8, "kv_heads": 1, "batch": 1, "context": 131072}, 1.0),
        # fa2 never splits an MHA layer: one block per (sequence, head) whatever the context
        (A100, "fa2", {"heads": 8, "kv_heads": 8, "batch": 1, "context": 131072}, 8.0),
        (A100, "fa2", {"heads": 8, "kv_heads": 8, "batch": 3, "context": 4096}, 24.0),
        # paged_v2: 2 sequences x 14 heads x 4096 / 512 partitions
        (A100, "paged_v2", {"heads": 14, "kv_heads": 14, "batch": 2, "context": 4096}, 224.0),
        # GQA: a block per query head, not per KV head: 1 x 8 x 131072 / 512
        (A100, "paged_v2", {"heads": 8, "kv_heads": 1, "batch": 1, "context": 131072}, 2048.0),
        # shorter than a partition: one block per (sequence, head)
        (A100, "paged_v2", {"heads": 14, "kv_heads": 14, "batch": 2, "context": 300}, 28.0),
        # past 512 (sequence, head) pairs (the V1 switch): partitions of 512 pairs at most,
        # never fewer blocks than pairs: 64 x 14 = 896 pairs; 512 x 2048 / 512 = 2048
        (A100, "paged_v2", {"heads": 14, "kv_heads": 14, "batch": 64, "context": 2048}, 2048.0),
        (A100, "paged_v2", {"heads": 14, "kv_heads": 14, "batch": 64, "context": 256}, 896.0),
        # 1024 tokens = 8 tiles: at most one block per tile, 4 sequences x 2 KV heads x 8
        (H100, "fa3", {"heads": 16, "kv_heads": 2, "batch": 4, "context": 1024}, 64.0),
        # shorter than a tile: one block per (sequence, KV head)
        (H100, "fa3", {"heads": 16, "kv_heads": 2, "batch": 4, "context": 100}, 8.0),
        # 64 sequences x 8 KV heads already exceed the fill: no split
        (A100, "fa2", {"heads": 64, "kv_heads": 8, "batch": 64, "context": 8192}, 512.0),
        # 128 query heads per KV head take two 64-row tiles (MLA-like decode)
        (H100, "none", {"heads": 128, "kv_heads": 1, "batch": 3, "context": 4096}, 6.0),
    ],
)
def test_decode_blocks_by_hand(
    hw: HardwareSpec, split: str, shape: dict[str, int], expected: float
) -> None:
    assert blocks(hw, split, **shape) == pytest.approx(expected, rel=1e-12)


def test_one_block_streams_its_kv_no_faster_than_the_block_rate() -> None:
    # none: one sequence and one KV head are one block; 131072 tokens x 512 bytes (K and V,
    # 128 x bf16 each) at 20 GB/s take 3.355 ms, which dwarfs the bandwidth time.
    hw = with_attention(A100, decode_split="none", decode_block_bytes_per_s=20e9)
    op = decode_op(heads=1, kv_heads=1, batch=1, context=131072)
    memory = float(np.ravel(evaluate([op], hw)[0].memory_s)[0])
    chained = 131072 * 512 / 20e9
    assert chained <= memory <= chained * 1.01
    # with no block rate the bound is gone and the same read takes the bandwidth time
    free = with_attention(hw, decode_block_bytes_per_s=None)
    assert float(np.ravel(evaluate([op], free)[0].memory_s)[0]) < chained / 10


def relayout_s(split: str, *, heads: int, kv_heads: int, batch: int) -> float:
    """Latency a 6 us re-layout cost adds to one decode call."""
    op = decode_op(heads=heads, kv_heads=kv_heads, batch=batch, context=4096)

    def latency(copy_s: float) -> float:
        hw = with_attention(A100, decode_split=split, decode_gqa_copy_s=copy_s)
        return float(np.ravel(evaluate([op], hw)[0].latency_s)[0])

    return latency(6e-6) - latency(0.0)


def test_an_engine_names_its_own_split() -> None:
    # vLLM 0.2 ran PagedAttention V2 on the A100, whose own kernel (vLLM 0.14's FA2) never
    # splits MHA: one long MHA sequence is 14 blocks there and 14 x 8 partitions under vLLM 0.2
    engine = load_engine("vllm-0.2")
    assert engine.decode_split == "paged_v2" and load_engine("vllm").decode_split is None
    op = decode_op(heads=14, kv_heads=14, batch=1, context=4096)
    assert float(np.ravel(decode_blocks(A100, op))[0]) == 14.0
    assert float(np.ravel(decode_blocks(A100, op, engine.decode_split))[0]) == 14.0 * 8
    alone, under_engine = (evaluate([op], A100, e)[0] for e in (None, engine))
    assert float(np.ravel(under_engine.time_s)[0]) < float(np.ravel(alone.time_s)[0])


def test_the_fa2_query_relayout_costs_only_gqa_batches_with_several_kv_heads() -> None:
    assert relayout_s("fa2", heads=32, kv_heads=8, batch=2) == pytest.approx(6e-6, rel=1e-9)
    # one sequence or one KV head: a view, no copy; MHA: no re-layout; fa3 packs natively
    assert relayout_s("fa2", heads=32, kv_heads=8, batch=1) == 0.0
    assert relayout_s("fa2", heads=8, kv_heads=1, batch=8) == 0.0
    assert relayout_s("fa2", heads=8, kv_heads=8, batch=8) == 0.0
    assert relayout_s("fa3", heads=32, kv_heads=8, batch=8) == 0.0


FEW = settings(max_examples=40, deadline=None)


@FEW
@given(
    hw=st.sampled_from([A100, H100]),
    split=st.sampled_from(["none", "fa2", "fa3", "paged_v2"]),
    group=st.sampled_from([1, 4, 8, 128]),
    kv_heads=st.integers(1, 8),
    batch=st.integers(1, 512),
)
def test_decode_time_never_falls_as_the_context_grows(
    hw: HardwareSpec, split: str, group: int, kv_heads: int, batch: int
) -> None:
    spec = with_attention(hw, decode_split=split, decode_gqa_copy_s=5e-6)
    context = np.unique(np.round(np.geomspace(1, 131072, 400)))
    op = decode_op(heads=group * kv_heads, kv_heads=kv_heads, batch=batch, context=context)
    times = evaluate([op], spec)[0].time_s
    assert np.all(np.diff(times) >= -1e-12 * times[1:])


@FEW
@given(
    hw=st.sampled_from([A100, H100]),
    split=st.sampled_from(["none", "fa2", "fa3", "paged_v2"]),
    group=st.sampled_from([1, 4, 8, 128]),
    kv_heads=st.integers(1, 8),
    context=st.integers(1, 131072),
)
def test_decode_time_never_falls_as_the_batch_grows(
    hw: HardwareSpec, split: str, group: int, kv_heads: int, context: int
) -> None:
    spec = with_attention(hw, decode_split=split, decode_gqa_copy_s=5e-6)
    batch = np.arange(1.0, 1025.0)
    op = decode_op(heads=group * kv_heads, kv_heads=kv_heads, batch=batch, context=context)
    times = evaluate([op], spec)[0].time_s
    assert np.all(np.diff(times) >= -1e-12 * times[1:])


def test_an_unknown_split_is_a_spec_error(tmp_path: object) -> None:
    from pathlib import Path

    src = Path(__file__).parents[2] / "hardware_specs" / "h100_sxm.yaml"
    path = Path(str(tmp_path)) / "mygpu.yaml"
    path.write_text(src.read_text().replace("decode_split: fa3", "decode_split: fa4"))
    with pytest.raises(SpecError, match="decode_split"):
        load_hardware(str(path))
