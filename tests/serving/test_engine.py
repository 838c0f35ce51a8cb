"""Narrative tests of the serving engine: tiny cases whose timelines are computed by hand.

They run on a fixed step-time model so every number can be checked on paper:
  a step with prefill chunks takes 10 ms + 10 us per prefill token,
  a decode-only step takes 5 ms.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest
from factories import MS, FixedTimer, fixed_group, make_requests, make_scheduler, times_ms
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.serving.cluster import SimResult, serve
from simulator.specs.serving import RouterSpec, SchedulerSpec
from simulator.workload.requests import RequestTable


def run(
    requests: RequestTable,
    *,
    num_blocks: int = 1000,
    block_size: int = 16,
    num_replicas: int = 1,
    scheduler: SchedulerSpec | None = None,
    **kwargs: object,
) -> SimResult:
    group = fixed_group(
        scheduler=scheduler, num_blocks=num_blocks, block_size=block_size, count=num_replicas
    )
    return serve(requests, groups=[group], **kwargs)  # type: ignore[arg-type]


def test_one_request() -> None:
    # t=0: prefill 100 tokens: 10 + 1 = 11 ms -> first token at 11 ms;
    # two decode steps of 5 ms -> tokens at 16 and 21 ms; finish at 21 ms.
    result = run(make_requests((0.0, 100, 3)))
    df = result.requests
    assert times_ms(df, "first_token_s") == [11.0]
    assert times_ms(df, "finish_s") == [21.0]
    assert df["output_tokens"].tolist() == [3]
    # ITL: two gaps of 5 ms, each from one request
    assert sorted(np.repeat(result.itl_s, result.itl_weight.astype(int)) / MS) == pytest.approx(
        [5.0, 5.0]
    )
    steps = result.steps
    assert steps["prefill_tokens"].tolist() == [100, 0, 0]
    assert steps["decode_tokens"].tolist() == [0, 1, 1]
    # what each step held (16-token blocks): 100 -> 7, 101 -> 7, 102 -> 7; the last step's
    # blocks are freed after it, and the steps' peak is the cache's
    assert steps["kv_used_blocks"].tolist() == [7, 7, 7]
    assert steps["kv_used_blocks"].max() / 1000 == result.kv_peak_fraction


def test_a_step_that_finishes_requests_counts_the_kv_it_held() -> None:
    # two 8000-token prompts of one output token, in 2048-token chunks: the step of the first
    # one's last chunk holds its 500 blocks and the second's first 12, then frees the 500
    result = run(make_requests((0.0, 8000, 1), (0.0, 8000, 1)))
    assert result.steps["kv_used_blocks"].tolist()[3] == 512  # counted after the free: 12
    assert result.steps["kv_used_blocks"].max() / 1000 == result.kv_peak_fraction == 0.512


def test_two_requests_contending() -> None:
    # r0 at 0 (prompt 100, 3 out): prefill 0-11 ms, decode step 11-16 ms (token 2).
    # r1 arrives at 12 ms, during that decode step: the step finishes first (atomic), then a
    # mixed step 16-26.5 ms does r0's decode and r1's 50-token prefill (10 + 0.5 ms):
    # r0's 3rd token and finish at 26.5; r1's first token at 26.5.
    # r1 decodes once more: 26.5-31.5 ms, finish.
    result = run(make_requests((0.0, 100, 3), (0.012, 50, 2)))
    df = result.requests
    assert times_ms(df, "first_token_s") == [11.0, 26.5]
    assert times_ms(df, "finish_s") == [26.5, 31.5]
    assert times_ms(df, "first_scheduled_s") == [0.0, 16.0]
    assert result.steps["num_seqs"].tolist() == [1, 1, 2, 1]


def test_chunked_prefill_splits_a_long_prompt() -> None:
    # budget 64 tokens: a 150-token prompt runs as chunks of 64, 64, 22:
    # 10.64 + 10.64 + 10.22 = 31.5 ms to the first token; one decode step -> 36.5 ms.
    result = run(make_requests((0.0, 150, 2)), scheduler=make_scheduler(max_num_batched_tokens=64))
    assert result.steps["prefill_tokens"].tolist()[:3] == [64, 64, 22]
    assert times_ms(result.requests, "first_token_s") == [31.5]
    assert times_ms(result.requests, "finish_s") == [36.5]


def test_without_chunked_prefill_prompts_go_whole() -> None:
    # prefill_first with budget 200: two 150-token prompts cannot share a step:
    # r0 prefill 0-11.5 ms, r1 prefill 11.5-23 ms (decodes wait), then both decode together.
    result = run(
        make_requests((0.0, 150, 2), (0.0, 150, 2)),
        scheduler=make_scheduler(
            kind="prefill_first", chunked_prefill=False, max_num_batched_tokens=200
        ),
    )
    assert times_ms(result.requests, "first_token_s") == [11.5, 23.0]
    assert times_ms(result.requests, "finish_s") == [28.0, 28.0]


def test_prefill_first_with_chunks_runs_prefill_steps_apart_from_decodes() -> None:
    # SGLang's policy (chunked, not mixed), budget 100. r0 (prompt 60, 3 out) at 0: prefill
    # 0-10.6 ms. r1 (prompt 150, 2 out) arrives at 12 ms, during r0's decode step 10.6-15.6.
    # Then r1 prefills in chunks of 100 (15.6-26.6) and 50 (26.6-37.1), decodes waiting (a
    # mixed scheduler would have put r0's decode beside each chunk). Then one decode step of
    # both, 37.1-42.1: r0's 3rd token and r1's 2nd.
    result = run(
        make_requests((0.0, 60, 3), (0.012, 150, 2)),
        scheduler=make_scheduler(kind="prefill_first", max_num_batched_tokens=100),
    )
    steps = result.steps
    assert steps["prefill_tokens"].tolist() == [60, 0, 100, 50, 0]
    assert steps["decode_tokens"].tolist() == [0, 1, 0, 0, 2]
    assert times_ms(result.requests, "first_token_s") == [10.6, 37.1]
    assert times_ms(result.requests, "finish_s") == [42.1, 42.1]


def test_prefill_first_continues_the_chunked_prompt_before_new_ones() -> None:
    # Budget 100; r0 (prompt 150) and r1 (prompt 30) both wait at 0. Step 1: r0's first 100
    # tokens. Step 2: r0's last 50, then r1's 30 in the budget left (SGLang's chunked_req
    # goes first into the next prefill batch): 11 + 10.8 ms to both first tokens.
    result = run(
        make_requests((0.0, 150, 2), (0.0, 30, 2)),
        scheduler=make_scheduler(kind="prefill_first", max_num_batched_tokens=100),
    )
    steps = result.steps
    assert steps["prefill_tokens"].tolist()[:2] == [100, 80]
    assert times_ms(result.requests, "first_token_s") == [21.8, 21.8]


def test_preemption_when_the_kv_cache_runs_out() -> None:
    # 10 blocks of 16 tokens = 160 tokens. Two requests of 64-token prompts (4 blocks each)
    # growing to 64 + 40 tokens (7 blocks each) cannot both finish: when the cache is full,
    # r1 (admitted last) is preempted, recomputed later, and both still finish in full.
    result = run(make_requests((0.0, 64, 40), (0.0, 64, 40)), num_blocks=10)
    df = result.requests.sort_values("request_id")
    assert df["preemptions"].tolist() == [0, 1]
    assert df["output_tokens"].tolist() == [40, 40]
    assert df["finish_s"].iloc[0] < df["finish_s"].iloc[1]
    assert result.steps["kv_used_blocks"].max() <= 10


def test_without_chunking_a_step_must_hold_the_longest_request() -> None:
    from simulator.errors import SpecError

    with pytest.raises(SpecError, match="max_num_batched_tokens"):
        run(
            make_requests((0.0, 150, 100)),
            scheduler=make_scheduler(
                kind="prefill_first", chunked_prefill=False, max_num_batched_tokens=200
            ),
        )


def test_static_batching_waits_for_the_whole_batch() -> None:
    # static, batch of up to 2: r0 and r1 run together; r2 (at t=0 too) waits until both end.
    # batch prefill of 2 x 10 tokens: 10.2 ms; r0 needs 1 more token (5 ms) -> 15.2 ms;
    # r1 needs 3 more (15 ms) -> 25.2 ms; then r2: prefill 25.2-35.3 ms, finish there.
    result = run(
        make_requests((0.0, 10, 2), (0.0, 10, 4), (0.0, 10, 1)),
        scheduler=make_scheduler(kind="static", max_num_seqs=2),
    )
    assert times_ms(result.requests, "finish_s") == [15.2, 25.2, 35.3]


def test_the_router_spreads_requests() -> None:
    reqs = make_requests(*[(0.0, 10, 2)] * 4)
    rr = run(reqs, num_replicas=2, router=RouterSpec(kind="round_robin")).requests
    assert rr.sort_values("request_id")["replica"].tolist() == [0, 1, 0, 1]
    lo = run(reqs, num_replicas=3, router=RouterSpec(kind="least_outstanding")).requests
    assert lo.sort_values("request_id")["replica"].tolist() == [0, 1, 2, 0]


def test_replica_groups_can_differ() -> None:
    # a fast group (the narrative timer) and a slow one (every step twice as long), round robin:
    # the same request takes twice as long on the slow replica.
    class SlowTimer(FixedTimer):
        def decode_run(
            self,
            *,
            num_seqs: int,
            total_context: float,
            steps: int,
            outputs: tuple[int, int] = (0, 0),
        ) -> np.ndarray:
            return 2 * super().decode_run(
                num_seqs=num_seqs, total_context=total_context, steps=steps
            )

        def mixed(
            self,
            *,
            chunks: Sequence[tuple[int, int, bool]],
            decode_contexts: Sequence[int],
            outputs: tuple[int, int] = (0, 0),
        ) -> float:
            return 2 * super().mixed(chunks=chunks, decode_contexts=decode_contexts)

    groups = [fixed_group(num_blocks=100), fixed_group(timer=SlowTimer(), num_blocks=100)]
    result = serve(make_requests((0.0, 100, 3), (0.0, 100, 3)), groups=groups)
    assert times_ms(result.requests, "finish_s") == [21.0, 42.0]


def test_max_concurrency_holds_requests_back() -> None:
    # one client slot: r1 is sent when r0 finishes at 21 ms, and its clock starts then.
    result = run(make_requests((0.0, 100, 3), (0.0, 100, 3)), max_concurrency=1)
    assert times_ms(result.requests, "arrival_s") == [0.0, 21.0]
    assert times_ms(result.requests, "finish_s") == [21.0, 42.0]


# -- properties ---------------------------------------------------------------------------------
workloads = st.lists(
    st.tuples(st.floats(0, 0.5), st.integers(1, 300), st.integers(1, 60)), min_size=1, max_size=25
)


@settings(max_examples=60, deadline=None)
@given(
    rows=workloads,
    kind=st.sampled_from(["continuous", "prefill_first", "static"]),
    blocks=st.integers(40, 200),
    budget=st.integers(300, 1024),
    chunked=st.booleans(),
)
def test_every_request_finishes_once_with_its_tokens(
    rows: list[tuple[float, int, int]], kind: str, blocks: int, budget: int, chunked: bool
) -> None:
    rows.sort()
    reqs = make_requests(*rows)
    if not chunked:  # without chunking a step must hold a whole request (vLLM too)
        budget = max(budget, max(p + o for _, p, o in rows))
    scheduler = make_scheduler(kind=kind, max_num_batched_tokens=budget, chunked_prefill=chunked)
    result = run(reqs, num_blocks=blocks, scheduler=scheduler)
    df = result.requests.sort_values("request_id")
    assert len(df) == len(rows)
    assert df["output_tokens"].tolist() == [r[2] for r in rows]
    assert df["finish_s"].notna().all()
    assert (df["first_token_s"] >= df["arrival_s"]).all()
    assert (df["finish_s"] >= df["first_token_s"]).all()
    assert result.steps["kv_used_blocks"].max() <= blocks
    # every token after the first is one inter-token gap
    assert result.itl_weight.sum() == pytest.approx(float((df["output_tokens"] - 1).sum()))


def test_the_same_inputs_give_identical_results() -> None:
    rng = np.random.default_rng(3)
    n = 200
    reqs = RequestTable(
        arrival_s=np.cumsum(rng.exponential(0.01, n)),
        prompt_len=rng.integers(1, 500, n),
        output_len=rng.integers(1, 100, n),
    )
    a = run(reqs, num_replicas=3, router=RouterSpec(kind="power_of_two"), seed=7)
    b = run(reqs, num_replicas=3, router=RouterSpec(kind="power_of_two"), seed=7)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)


def run_with_swap(requests: RequestTable, scheduler: SchedulerSpec) -> SimResult:
    group = fixed_group(
        scheduler=scheduler, num_blocks=10, host_blocks=100, swap_s_per_block=1 * MS
    )
    return serve(requests, groups=[group])


def test_swap_preemption_keeps_the_kv_and_charges_the_copies() -> None:
    # As the recompute case above: 10 blocks; r0 and r1 prefill 64 tokens each (11.28 ms),
    # then 16 decode steps together (5 ms each, to 91.28 ms) fill the cache (5 blocks each).
    # Step 17: r0 needs a 6th block, so r1 (admitted last) is swapped out: 5 blocks at 1 ms
    # each plus the step (10 ms) -> 106.28 ms. r0 decodes its last 22 tokens alone (110 ms)
    # and finishes at 216.28 ms. r1 is swapped back in (5 ms) with its next decode (10 ms) ->
    # 231.28 ms, then its last 22 tokens -> 341.28 ms. No prompt token is computed twice.
    result = run_with_swap(
        make_requests((0.0, 64, 40), (0.0, 64, 40)),
        make_scheduler(preemption_mode="swap"),
    )
    assert times_ms(result.requests, "finish_s") == [216.28, 341.28]
    assert result.requests.sort_values("request_id")["preemptions"].tolist() == [0, 1]
    assert result.steps["prefill_tokens"].sum() == 128
    recompute = run_with_swap(make_requests((0.0, 64, 40), (0.0, 64, 40)), make_scheduler())
    assert recompute.steps["prefill_tokens"].sum() == 128 + 64 + 17  # r1's prompt and outputs


def test_swap_falls_back_to_recompute_without_swap_space() -> None:
    group = fixed_group(
        scheduler=make_scheduler(preemption_mode="swap"),
        num_blocks=10,
        host_blocks=4,  # r1's 5 blocks do not fit
        swap_s_per_block=1 * MS,
    )
    result = serve(make_requests((0.0, 64, 40), (0.0, 64, 40)), groups=[group])
    assert result.steps["prefill_tokens"].sum() == 128 + 64 + 17


def prioritised(*rows: tuple[float, int, int, int]) -> RequestTable:
    """(arrival s, prompt tokens, output tokens, priority) per request."""
    arrival, prompt, output, priority = zip(*rows, strict=True)
    return RequestTable(
        arrival_s=np.array(arrival),
        prompt_len=np.array(prompt),
        output_len=np.array(output),
        priority=np.array(priority),
    )


def test_priority_policy_serves_the_urgent_first() -> None:
    # One sequence at a time. r0 runs from t=0: prefill 10.1 ms, one decode -> 15.1 ms. r1
    # (priority 1) arrives at 1 ms, r2 (priority 0) at 2 ms. Priority: r2 prefills 15.1-25.2,
    # decodes -> 30.2, then r1 -> 45.3. FCFS: r1 first, then r2.
    rows = ((0.0, 10, 2, 1), (0.001, 10, 2, 1), (0.002, 10, 2, 0))
    urgent = run(prioritised(*rows), scheduler=make_scheduler(max_num_seqs=1, policy="priority"))
    assert times_ms(urgent.requests, "finish_s") == [15.1, 45.3, 30.2]
    fcfs = run(prioritised(*rows), scheduler=make_scheduler(max_num_seqs=1))
    assert times_ms(fcfs.requests, "finish_s") == [15.1, 30.2, 45.3]


def test_priority_policy_preempts_the_least_urgent() -> None:
    # r0 (priority 1) is admitted at t=0, r1 (priority 0) at its arrival; when the cache runs
    # out, FCFS preempts r1 (admitted last), the priority policy r0 (less urgent).
    rows = ((0.0, 64, 40, 1), (0.001, 64, 40, 0))
    urgent = run(prioritised(*rows), num_blocks=10, scheduler=make_scheduler(policy="priority"))
    assert urgent.requests.sort_values("request_id")["preemptions"].tolist() == [1, 0]
    fcfs = run(prioritised(*rows), num_blocks=10)
    assert fcfs.requests.sort_values("request_id")["preemptions"].tolist() == [0, 1]
