"""Properties of the cost model that must hold for every shape, checked with hypothesis:
a faster device is never slower, more work is never faster, TP never adds weights per device,
and the vectorised step cost equals the scalar one element by element."""

from __future__ import annotations

from functools import cache
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment, deployment
from simulator.costmodel.memory import weight_bytes_per_device
from simulator.costmodel.ops import Op, attention_ops, gemm, step_ops
from simulator.costmodel.roofline import evaluate
from simulator.costmodel.step import step_cost
from simulator.specs import HardwareSpec, load_hardware
from simulator.specs.deployment import Precision

FEW = settings(max_examples=50, deadline=None)
HARDWARE = ["h100_sxm", "a100_sxm_80gb", "mi300x", "rtx_4090"]
# (model, tp): dense, sliding-window, MoE and MLA, single GPU and tensor parallel
LAYOUTS = [
    ("llama-3.1-8b", 1),
    ("llama-3.1-70b", 4),
    ("mistral-7b", 2),
    ("mixtral-8x7b", 2),
    ("qwen3-30b-a3b", 1),
    ("deepseek-v3", 8),
]
BF16 = Precision(weights="bf16", compute="bf16", kv_cache="bf16", activations="bf16")


@cache
def make_deployment(model: str, tp: int = 1, hardware: str = "h100_sxm") -> Deployment:
    return deployment(model=model, hardware=hardware, tensor_parallel_size=tp)


def scaled(hw: HardwareSpec, *, bandwidth: float = 1.0, flops: float = 1.0) -> HardwareSpec:
    """`hw` with DRAM bandwidth and every peak FLOP/s multiplied (specs are frozen: rebuild the
    nested parts with model_copy)."""
    memory = hw.memory.model_copy(
        update={"bandwidth_bytes_per_s": hw.memory.bandwidth_bytes_per_s * bandwidth}
    )
    peaks = {dtype: peak * flops for dtype, peak in hw.compute.peak_flops_per_s.items()}
    compute = hw.compute.model_copy(update={"peak_flops_per_s": peaks})
    return hw.model_copy(update={"memory": memory, "compute": compute})


def op_times(ops: list[Op], hw: HardwareSpec) -> np.ndarray:
    return np.array([float(np.ravel(c.time_s)[0]) for c in evaluate(ops, hw)])


def step_seconds(dep: Deployment, batch: BatchShape, hw: HardwareSpec | None = None) -> float:
    cost = step_cost(dep.model, hw or dep.hardware, dep.layout, dep.precision, batch)
    return cost.seconds


def make_batch(prefills: int, chunk: int, offset: int, decodes: int, context: int) -> BatchShape:
    """A mixed step: `prefills` chunks of `chunk` tokens after `offset` cached tokens, plus
    `decodes` sequences at `context` tokens (at least one sequence in all)."""
    return BatchShape.mixed(
        chunks=[(chunk, offset, True)] * prefills,
        decode_context_lens=[context] * (decodes if prefills or decodes else 1),
    )


batches = st.builds(
    make_batch,
    prefills=st.integers(0, 4),
    chunk=st.integers(1, 4096),
    offset=st.integers(0, 4096),
    decodes=st.integers(0, 256),
    context=st.integers(1, 32_768),
)
speedups = st.floats(1.0, 10.0)


# -- a faster device is never slower --------------------------------------------------------------
@FEW
@given(
    hw_id=st.sampled_from(HARDWARE),
    m=st.integers(1, 16_384),
    n=st.integers(1, 16_384),
    k=st.integers(1, 16_384),
    bandwidth=speedups,
    flops=speedups,
)
def test_faster_device_never_slows_a_gemm(
    hw_id: str, m: int, n: int, k: int, bandwidth: float, flops: float
) -> None:
    hw = load_hardware(hw_id)
    op = gemm("g", m=float(m), n=float(n), k=float(k), count=1, prec=BF16)
    base = op_times([op], hw)
    assert np.all(op_times([op], scaled(hw, bandwidth=bandwidth)) <= base)
    assert np.all(op_times([op], scaled(hw, flops=flops)) <= base)


@FEW
@given(
    hw_id=st.sampled_from(HARDWARE),
    batch_size=st.integers(1, 64),
    seq_len=st.integers(1, 32_768),
    kv_heads=st.sampled_from([1, 2, 8, 32]),
    bandwidth=speedups,
    flops=speedups,
)
def test_faster_device_never_slows_attention(
    hw_id: str, batch_size: int, seq_len: int, kv_heads: int, bandwidth: float, flops: float
) -> None:
    hw = load_hardware(hw_id)
    ops = [
        *attention_ops(
            heads=32,
            kv_heads=kv_heads,
            head_dim=128,
            prec=BF16,
            batch=BatchShape.prefill(batch_size=batch_size, prompt_len=seq_len),
            count=1,
        ),
        *attention_ops(
            heads=32,
            kv_heads=kv_heads,
            head_dim=128,
            prec=BF16,
            batch=BatchShape.decode(batch_size=batch_size, context_len=seq_len),
            count=1,
        ),
    ]
    base = op_times(ops, hw)
    assert np.all(op_times(ops, scaled(hw, bandwidth=bandwidth)) <= base)
    assert np.all(op_times(ops, scaled(hw, flops=flops)) <= base)


@FEW
@given(layout=st.sampled_from(LAYOUTS), batch=batches, bandwidth=speedups, flops=speedups)
def test_faster_device_never_slows_any_op_of_a_step(
    layout: tuple[str, int], batch: BatchShape, bandwidth: float, flops: float
) -> None:
    dep = make_deployment(*layout)
    hw = dep.hardware
    ops = step_ops(dep.model, dep.layout, dep.precision, batch)
    base = op_times(ops, hw)
    for faster in (scaled(hw, bandwidth=bandwidth), scaled(hw, flops=flops)):
        assert np.all(op_times(ops, faster) <= base)
        assert step_seconds(dep, batch, faster) <= step_seconds(dep, batch)


# -- more work is never faster --------------------------------------------------------------------
@FEW
@given(
    layout=st.sampled_from(LAYOUTS),
    batch_size=st.integers(1, 16),
    tokens=st.integers(1, 8192),
    extra=st.integers(1, 2048),
)
def test_step_time_grows_with_prefill_tokens(
    layout: tuple[str, int], batch_size: int, tokens: int, extra: int
) -> None:
    dep = make_deployment(*layout)
    short = BatchShape.prefill(batch_size=batch_size, prompt_len=tokens)
    long = BatchShape.prefill(batch_size=batch_size, prompt_len=tokens + extra)
    assert step_seconds(dep, long) >= step_seconds(dep, short)


@FEW
@given(
    layout=st.sampled_from(LAYOUTS),
    batch_size=st.integers(1, 512),
    extra=st.integers(1, 256),
    context=st.integers(1, 32_768),
)
def test_step_time_grows_with_decode_batch(
    layout: tuple[str, int], batch_size: int, extra: int, context: int
) -> None:
    dep = make_deployment(*layout)
    small = BatchShape.decode(batch_size=batch_size, context_len=context)
    large = BatchShape.decode(batch_size=batch_size + extra, context_len=context)
    assert step_seconds(dep, large) >= step_seconds(dep, small)


@FEW
@given(
    layout=st.sampled_from(LAYOUTS),
    batch_size=st.integers(1, 256),
    context=st.integers(1, 32_768),
    extra=st.integers(1, 32_768),
    offset=st.integers(0, 8192),
)
def test_step_time_grows_with_context_length(
    layout: tuple[str, int], batch_size: int, context: int, extra: int, offset: int
) -> None:
    dep = make_deployment(*layout)
    short = BatchShape.decode(batch_size=batch_size, context_len=context)
    long = BatchShape.decode(batch_size=batch_size, context_len=context + extra)
    assert step_seconds(dep, long) >= step_seconds(dep, short)
    # a prefill chunk after a longer cached prefix reads more KV and attends to more pairs
    window = dep.model.attention.sliding_window
    chunk = BatchShape.prefill(batch_size=1, prompt_len=context, offset=offset, window=window)
    later = BatchShape.prefill(
        batch_size=1, prompt_len=context, offset=offset + extra, window=window
    )
    assert step_seconds(dep, later) >= step_seconds(dep, chunk)


# -- tensor parallelism never adds weights per device ---------------------------------------------
@pytest.mark.parametrize("model", ["llama-3.1-70b", "mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b"])
def test_tensor_parallel_never_increases_weights_per_device(model: str) -> None:
    # every TP size with every pair compared: 1 >= 2 >= 4 >= 8 (KV heads and MLA latents are
    # replicated past their count, but the sharded parts always shrink)
    per_device = [
        weight_bytes_per_device(dep.model, dep.layout, dep.precision)
        for dep in (make_deployment(model, tp) for tp in (1, 2, 4, 8))
    ]
    assert all(b <= a for a, b in pairwise(per_device)), per_device
    assert per_device[-1] < per_device[0]


# -- vectorised == scalar -------------------------------------------------------------------------
@FEW
@given(layout=st.sampled_from(LAYOUTS), shapes=st.lists(batches, min_size=1, max_size=6))
def test_vectorised_step_cost_equals_the_scalar_results(
    layout: tuple[str, int], shapes: list[BatchShape]
) -> None:
    dep = make_deployment(*layout)
    stacked = BatchShape(
        **{f: np.array([float(getattr(b, f)) for b in shapes]) for f in BatchShape.__slots__}
    )
    vector = step_cost(dep.model, dep.hardware, dep.layout, dep.precision, stacked)
    assert np.shape(vector.time_s) == (len(shapes),)
    for i, shape in enumerate(shapes):
        assert vector.time_s[i] == pytest.approx(step_seconds(dep, shape), rel=1e-9)


# -- exhaustive monotonicity on dense grids (vectorised, so every point is checked) --------------
DENSE_LAYOUTS = [
    ("llama-3.1-8b", "h100_sxm", 1),
    ("qwen3-30b-a3b", "h100_sxm", 1),
    ("llama-2-70b", "a100_sxm_80gb", 4),
    ("deepseek-v3", "h200_sxm", 8),
    ("mixtral-8x7b", "h100_sxm", 2),
    ("mistral-7b", "mi300x", 1),
]


@pytest.mark.parametrize(("model", "hardware", "tp"), DENSE_LAYOUTS)
def test_step_time_is_monotone_on_dense_grids(model: str, hardware: str, tp: int) -> None:
    # Every prompt length 1..8192, 3000 KV lengths up to 128K and every batch 1..1024: the
    # calibrated curves, tile choices and wave terms must never make more work faster.
    dep = deployment(model=model, hardware=hardware, tensor_parallel_size=tp)
    args = (dep.model, dep.hardware, dep.layout, dep.precision)

    def never_falls(batch: BatchShape) -> None:
        times = step_cost(*args, batch).time_s
        assert np.all(np.diff(times) >= -1e-12 * times[1:])

    tokens = np.arange(1.0, 8193.0)
    for b in (1, 4):
        never_falls(BatchShape.prefill(batch_size=b, prompt_len=tokens))
    context = np.unique(np.round(np.geomspace(1, 131072, 3000)))
    for b in (1, 8, 64):
        never_falls(BatchShape.decode(batch_size=b, context_len=context))
    for c in (128, 4096):
        never_falls(BatchShape.decode(batch_size=np.arange(1.0, 1025.0), context_len=c))
