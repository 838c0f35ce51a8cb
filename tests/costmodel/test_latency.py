"""`bench latency`, analytically: the prefill schedule, TTFT / TPOT / latency bookkeeping, CUDA
graphs versus eager, and the errors for runs that cannot happen."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.deployment import deployment
from simulator.errors import SpecError
from simulator.runs.latency import LatencyResult, bench_latency, prefill_schedule


def make_run(
    *,
    model: str = "llama-3.1-8b",
    hardware: str = "h100_sxm",
    batch_size: int = 8,
    input_len: int = 512,
    output_len: int = 32,
    tp: int = 1,
    **knobs: Any,
) -> LatencyResult:
    dep = deployment(model=model, hardware=hardware, tensor_parallel_size=tp)
    return bench_latency(
        dep,
        batch_size=batch_size,
        input_len=input_len,
        output_len=output_len,
        **knobs,
    )


# -- bookkeeping ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("batch_size", "input_len", "output_len"), [(1, 128, 16), (8, 512, 32), (16, 1024, 8)]
)
def test_ttft_tpot_and_latency_add_up(batch_size: int, input_len: int, output_len: int) -> None:
    r = make_run(batch_size=batch_size, input_len=input_len, output_len=output_len)
    assert r.ttft_s == pytest.approx(float(np.sum(r.prefill_steps)), rel=1e-12)
    assert len(r.decode_steps) == output_len - 1  # the first token comes out of the prefill
    assert r.latency_s == pytest.approx(r.ttft_s + float(np.sum(r.decode_steps)), rel=1e-12)
    assert r.tpot_s == pytest.approx(float(np.mean(r.decode_steps)), rel=1e-12)
    assert r.ttft_s > 0
    assert r.tpot_s > 0


def test_decode_steps_grow_with_the_context() -> None:
    r = make_run(batch_size=32, input_len=2048, output_len=64)
    assert np.all(np.diff(r.decode_steps) >= 0)
    assert r.decode_steps[-1] > r.decode_steps[0]


def test_a_single_output_token_has_no_decode_steps() -> None:
    r = make_run(output_len=1)
    assert r.tpot_s == 0.0
    assert len(r.decode_steps) == 0
    assert r.latency_s == r.ttft_s
    assert "decode" not in set(r.breakdown()["phase"])


def test_output_json_has_vllm_keys() -> None:
    data = make_run(num_iters=5).as_json()
    assert {"avg_latency", "latencies", "percentiles", "ttft_s", "tpot_s"} <= set(data)
    assert data["latencies"] == [data["avg_latency"]] * 5
    assert set(data["percentiles"]) == {"10", "25", "50", "75", "90", "99"}


@pytest.mark.parametrize(
    ("model", "tp", "batch_size", "input_len"),
    [
        ("llama-3.1-8b", 1, 1, 32),
        ("llama-3.1-8b", 1, 64, 512),
        ("llama-3.1-8b", 1, 1, 8192),  # a prefill step too large to be graphed
        ("llama-3.1-70b", 4, 8, 256),
        ("mixtral-8x7b", 2, 16, 128),
    ],
)
def test_enforce_eager_is_never_faster(
    model: str, tp: int, batch_size: int, input_len: int
) -> None:
    common = dict(model=model, tp=tp, batch_size=batch_size, input_len=input_len, output_len=16)
    graphs = make_run(**common)
    eager = make_run(**common, enforce_eager=True)
    assert np.all(eager.prefill_steps >= graphs.prefill_steps)
    assert np.all(eager.decode_steps >= graphs.decode_steps)
    assert eager.latency_s >= graphs.latency_s


def test_enforce_eager_slows_launch_bound_decode() -> None:
    # qwen3-30b-a3b at batch 1 launches 628 kernels per step (13 in each of 48 layers, 4
    # outside). With an engine whose eager launch costs 20 us, launching takes 628 x 20 us =
    # 12.6 ms of CPU time, more than the ~5 ms the
    # GPU needs to stream 3.3B active parameters: eager is launch-bound, graphs are not.
    dep = deployment(model="qwen3-30b-a3b", hardware="h100_sxm")
    slow_launch = dep.engine.model_copy(
        update={"overhead": dep.engine.overhead.model_copy(update={"launch_eager_s": 20e-6})}
    )

    def tpot(enforce_eager: bool) -> float:
        return bench_latency(
            dataclasses.replace(dep, engine=slow_launch),
            batch_size=1,
            input_len=128,
            output_len=16,
            enforce_eager=enforce_eager,
        ).tpot_s

    assert tpot(True) > tpot(False)
    assert tpot(True) == pytest.approx(
        628 * 20e-6 + slow_launch.overhead.step_s + slow_launch.overhead.per_seq_s, rel=1e-9
    )


# -- the prefill schedule -------------------------------------------------------------------------
def test_chunked_prefill_of_16_prompts_of_1024_takes_two_steps() -> None:
    # 16 x 1024 = 16,384 tokens at 8,192 per step: ceil(16384 / 8192) = 2 steps of 8 prompts
    steps = prefill_schedule(batch_size=16, input_len=1024, max_tokens=8192, chunked=True)
    assert len(steps) == math.ceil(16 * 1024 / 8192) == 2
    assert steps == [[(1024, 0, True)] * 8] * 2


def test_chunked_prefill_splits_a_prompt_across_steps() -> None:
    # 3 x 5000 tokens at 8192 per step: the second prompt is cut at 3192 and resumed
    steps = prefill_schedule(batch_size=3, input_len=5000, max_tokens=8192, chunked=True)
    assert steps == [
        [(5000, 0, True), (3192, 0, False)],
        [(1808, 3192, True), (5000, 0, True)],
    ]


def test_bench_latency_uses_the_schedule() -> None:
    r = make_run(batch_size=16, input_len=1024, output_len=4, max_num_batched_tokens=8192)
    assert len(r.prefill_steps) == 2
    assert r.prefill_steps[0] == pytest.approx(r.prefill_steps[1], rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(
    batch_size=st.integers(1, 40),
    input_len=st.integers(1, 3000),
    max_tokens=st.integers(1, 9000),
)
def test_chunked_schedule_is_a_token_packing(
    batch_size: int, input_len: int, max_tokens: int
) -> None:
    steps = prefill_schedule(
        batch_size=batch_size, input_len=input_len, max_tokens=max_tokens, chunked=True
    )
    total = batch_size * input_len
    assert len(steps) == math.ceil(total / max_tokens)
    assert all(sum(t for t, _, _ in s) <= max_tokens for s in steps)
    assert all(sum(t for t, _, _ in s) == max_tokens for s in steps[:-1])  # full but the last
    # every prompt is computed exactly once, in order, and finishes exactly once
    chunks = [c for s in steps for c in s]
    assert sum(t for t, _, _ in chunks) == total
    assert sum(last for _, _, last in chunks) == batch_size
    done = 0
    for tokens, offset, last in chunks:
        assert tokens > 0
        assert offset == done
        done += tokens
        assert last == (done == input_len)
        if last:
            done = 0


def test_unchunked_prefill_packs_whole_prompts() -> None:
    # 8192 // 1024 = 8 whole prompts per step
    steps = prefill_schedule(batch_size=20, input_len=1024, max_tokens=8192, chunked=False)
    assert [len(s) for s in steps] == [8, 8, 4]
    assert all(chunk == (1024, 0, True) for s in steps for chunk in s)


def test_unchunked_prefill_longer_than_the_token_budget_is_an_error() -> None:
    with pytest.raises(SpecError, match="max_num_batched_tokens"):
        prefill_schedule(batch_size=1, input_len=8193, max_tokens=8192, chunked=False)
    with pytest.raises(SpecError, match="max_num_batched_tokens"):
        make_run(input_len=10_000, chunked_prefill=False, max_num_batched_tokens=8192)


def test_the_same_prompt_runs_with_chunked_prefill() -> None:
    r = make_run(batch_size=1, input_len=10_000, chunked_prefill=True, max_num_batched_tokens=8192)
    assert len(r.prefill_steps) == 2


# -- errors ---------------------------------------------------------------------------------------
def test_a_batch_too_large_for_the_kv_cache_names_batch_size() -> None:
    with pytest.raises(SpecError, match="batch_size") as info:
        make_run(batch_size=4096, input_len=4096, output_len=128)
    assert "KV blocks" in str(info.value)
    # past max_num_seqs the batch runs in waves: the message says which number it counts
    with pytest.raises(SpecError, match=r"wave of 512 \(max_num_seqs; the batch of 4096 runs"):
        make_run(batch_size=4096, input_len=4096, output_len=128, max_num_seqs=512)


@pytest.mark.parametrize("field", ["batch_size", "input_len", "output_len"])
@pytest.mark.parametrize("value", [0, -1])
def test_lengths_must_be_positive(field: str, value: int) -> None:
    with pytest.raises(SpecError, match=field):
        make_run(**{field: value})


def test_a_batch_beyond_max_num_seqs_runs_in_waves() -> None:
    # 8 sequences with max_num_seqs 4: two identical waves of 4, one after the other.
    waves = make_run(batch_size=8, input_len=128, output_len=16, max_num_seqs=4)
    one = make_run(batch_size=4, input_len=128, output_len=16, max_num_seqs=4)
    assert waves.config["waves"] == 2
    assert waves.latency_s == pytest.approx(2 * one.latency_s, rel=1e-12)
    assert waves.ttft_s == pytest.approx(one.ttft_s, rel=1e-12)


def test_an_uneven_last_wave_is_smaller() -> None:
    # 6 sequences, 4 per wave: a wave of 4 then a wave of 2, which is faster than a second 4.
    run = make_run(batch_size=6, input_len=128, output_len=16, max_num_seqs=4)
    four = make_run(batch_size=4, input_len=128, output_len=16, max_num_seqs=4)
    two = make_run(batch_size=2, input_len=128, output_len=16, max_num_seqs=4)
    assert run.latency_s == pytest.approx(four.latency_s + two.latency_s, rel=1e-12)


def test_lengths_past_the_context_window_are_rejected() -> None:
    # llama-2-7b has max_position_embeddings 4096 (vLLM's max_model_len).
    with pytest.raises(SpecError, match="context length 4096"):
        make_run(model="llama-2-7b", batch_size=1, input_len=4000, output_len=97)
    assert make_run(model="llama-2-7b", batch_size=1, input_len=4000, output_len=96).latency_s > 0
