"""Decode attention that reads a grouped-query layer's KV cache once per query head
(TensorRT-LLM's masked attention before XQA: `EngineSpec.decode_kv_per_query_head`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simulator.costmodel.attention_kernels import per_query_head_reads
from simulator.costmodel.batch import BatchShape
from simulator.costmodel.ops import attention_ops
from simulator.costmodel.roofline import evaluate
from simulator.specs import load_engine, load_hardware
from simulator.specs.deployment import Precision

FP8_KV = Precision(weights="fp8", compute="fp8", kv_cache="fp8", activations="bf16")


def _decode(heads: int, kv_heads: int, batch: float = 256.0, context: float = 2048.0):
    ops = attention_ops(
        heads=heads,
        kv_heads=kv_heads,
        head_dim=128,
        prec=FP8_KV,
        batch=BatchShape.decode(batch_size=np.array([batch]), context_len=np.array([context])),
        count=1,
    )
    return ops[1]


def test_the_profiles_say_which_kernel_reads_per_query_head() -> None:
    assert load_engine("trtllm-0.6").decode_kv_per_query_head
    for name in ("trtllm", "vllm", "sglang", "vllm-0.6"):
        assert not load_engine(name).decode_kv_per_query_head, name


def test_a_group_of_eight_reads_its_kv_eight_times() -> None:
    op = _decode(heads=64, kv_heads=8)
    per_q = per_query_head_reads(op)
    kv = float(np.asarray(op.kv_bytes).ravel()[0])
    assert float(np.asarray(per_q.kv_bytes).ravel()[0]) == pytest.approx(8 * kv)
    assert float(np.asarray(per_q.bytes).ravel()[0]) == pytest.approx(
        float(np.asarray(op.bytes).ravel()[0]) + 7 * kv
    )
    assert per_q.kv_heads == 64 and per_q.heads == 64
    assert per_q.kv_row_elems == op.kv_row_elems  # the new token is still written once
    # a multi-head layer has nothing to re-read
    mha = _decode(heads=32, kv_heads=32)
    assert per_query_head_reads(mha) is mha


def test_only_the_per_query_head_engine_pays_for_the_group() -> None:
    hw = load_hardware("h200_sxm")
    old, new = load_engine("trtllm-0.6"), load_engine("trtllm")
    gqa, mha = _decode(heads=64, kv_heads=8), _decode(heads=64, kv_heads=64)
    t = {
        (name, kind): float(np.asarray(evaluate([op], hw, eng)[0].time_s).ravel()[0])
        for name, eng in (("old", old), ("new", new))
        for kind, op in (("gqa", gqa), ("mha", mha))
    }
    # 256 sequences of 2048 tokens: the KV read dominates; eight reads cost several times one
    assert t["old", "gqa"] > 4 * t["new", "gqa"]
    # the per-query-head kernel on a GQA layer costs what it costs on an MHA layer of as
    # many KV heads as query heads (same blocks, same bytes), up to the single KV write
    assert t["old", "gqa"] == pytest.approx(t["old", "mha"], rel=0.05)
    # the cost carries the op as priced: its bytes are the eight reads (the step's breakdown)
    priced = evaluate([gqa], hw, old)[0].op
    assert float(np.asarray(priced.kv_bytes).ravel()[0]) == pytest.approx(
        8 * float(np.asarray(gqa.kv_bytes).ravel()[0])
    )
    assert evaluate([gqa], hw, new)[0].op is gqa


@pytest.mark.parametrize("kv_dtype", ["fp8", "fp16"])
def test_the_h200_re_enactment_found_no_cheaper_than_a_read_per_query_head(kv_dtype: str) -> None:
    # simulator/data/measured/llmsim/h200_sxm/gqa_decode_*.csv: at 256-512 sequences of 1-2K
    # tokens the per-query-head kernel took at least `group` times the read-once kernel, so
    # pricing a read per query head without an L2 discount is not too slow
    from simulator.validate import data

    rows = pd.read_csv(data.MEASURED_DIR / "llmsim" / "h200_sxm" / f"gqa_decode_{kv_dtype}.csv")
    assert len(rows) == 36 and (rows["max_abs_diff"] < 0.01).all()
    big = rows[(rows["batch"] >= 256) & (rows["context"] >= 1024)]
    group = big["heads"] / big["kv_heads"]
    assert (big["ratio"] >= group).all()
    assert big["per_kv_head_tb_s"].max() < 4.8  # the read-once kernel within the datasheet
