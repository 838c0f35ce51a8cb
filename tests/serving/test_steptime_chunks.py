"""The step timer's exact pricing of several prompt chunks in one step: built from the
shape-dependent ops alone (`costmodel.ops.batch_ops`), it must give the very floats of the
whole step's op list filtered to those ops."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment, deployment
from simulator.costmodel.ops import Op, batch_ops, step_ops
from simulator.costmodel.roofline import evaluate, total_launches, total_time
from simulator.serving.steptime import StepTimer
from simulator.specs.deployment import Parallelism, Precision
from simulator.specs.model import ModelSpec

CASES = [
    dict(model="llama-3.1-8b", hardware="h100_sxm"),
    dict(model="mistral-7b", hardware="a100_sxm_80gb"),  # sliding window
    dict(model="mixtral-8x7b", hardware="h100_sxm", tensor_parallel_size=2),  # MoE
    dict(model="deepseek-v3", hardware="h200_sxm", tensor_parallel_size=8),  # MLA
    dict(model="bloom-176b", hardware="h100_sxm", tensor_parallel_size=8),  # ALiBi, MHA
    dict(model="qwen3-30b-a3b", hardware="h100_sxm", engine="sglang"),
    dict(model="llama-3.1-70b", hardware="h100_sxm", tensor_parallel_size=4, kv_cache_dtype="fp8"),
]


def whole_step_ops(
    model: ModelSpec,
    layout: Parallelism,
    prec: Precision,
    batch: BatchShape,
    *,
    gpus_per_node: int = 8,
) -> list[Op]:
    """`step_ops` under another name: a timer given it takes the general path."""
    return step_ops(model, layout, prec, batch, gpus_per_node=gpus_per_node)


def old_exact(dep: Deployment, chunks: list[tuple[int, int, bool]]) -> tuple[float, float]:
    """The multi-chunk pricing as it was: the whole step's ops filtered to "batch"."""
    batch = BatchShape.mixed(chunks=chunks, window=dep.model.attention.sliding_window)
    ops = [
        op
        for op in step_ops(
            dep.model,
            dep.layout,
            dep.precision,
            batch,
            gpus_per_node=dep.hardware.interconnect.gpus_per_node,
        )
        if op.scales_with == "batch"
    ]
    costs = evaluate(ops, dep.hardware, dep.engine)
    gpu = np.zeros(()) + total_time(costs)
    kernels = np.zeros(()) + total_launches(costs)
    return float(np.ravel(gpu)[0]), float(np.ravel(kernels)[0])


def random_chunks(rng: np.random.Generator, n: int) -> list[tuple[int, int, bool]]:
    return [
        (
            int(rng.integers(1, 3000)),
            int(rng.integers(0, 20000)) * int(rng.random() < 0.6),
            bool(rng.random() < 0.5),
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c["model"]))
def test_batch_ops_are_step_ops_shape_dependent_ops(case: dict) -> None:
    dep = deployment(**case)
    rng = np.random.default_rng(1)
    for _ in range(20):
        chunks = random_chunks(rng, int(rng.integers(0, 5)))
        decodes = rng.integers(1, 20000, int(rng.integers(0, 40))).tolist()
        window = dep.model.attention.sliding_window
        batch = BatchShape.mixed(chunks=chunks, decode_context_lens=decodes, window=window)
        args = (dep.model, dep.layout, dep.precision, batch)
        want = [op for op in step_ops(*args) if op.scales_with == "batch"]
        assert batch_ops(*args) == want
        split = batch_ops(*args, parts=("prefill",)) + batch_ops(*args, parts=("decode",))
        assert split == want


@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c["model"]))
def test_several_chunks_cost_the_same_floats_as_the_whole_op_list(case: dict) -> None:
    dep = deployment(**case)
    sizes = dict(max_num_seqs=64, max_num_batched_tokens=20000, max_context=32768)
    fast = StepTimer(dep, **sizes)
    general = StepTimer(dep, **sizes, ops=whole_step_ops)
    assert fast._no_decode is not None and general._no_decode is None  # the two paths
    rng = np.random.default_rng(0)
    for _ in range(60):
        chunks = random_chunks(rng, int(rng.integers(2, 7)))
        assert fast._chunks_part(chunks) == old_exact(dep, chunks)
        assert general._chunks_part(chunks) == old_exact(dep, chunks)
        decodes = rng.integers(1, 30000, int(rng.integers(0, 56))).tolist()
        got = fast.mixed(chunks=chunks, decode_contexts=decodes)
        assert got == general.mixed(chunks=chunks, decode_contexts=decodes)
        got = fast.kernel_s(chunks=chunks, decode_contexts=decodes)
        assert got == general.kernel_s(chunks=chunks, decode_contexts=decodes)
