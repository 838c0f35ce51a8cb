"""Automatic prefix caching: the block manager by hand, then narratives through the engine.

The engine cases run on the fixed step-time model of test_engine.py (numbers on paper):
  a step with prefill chunks (or a preemption) takes 10 ms + 10 us per prefill token,
  a decode-only step takes 5 ms.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from clitools import run_cli
from factories import FixedTimer, fixed_group, make_requests, make_scheduler, times_ms
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.runs import runner
from simulator.serving.cluster import SimResult, serve
from simulator.serving.kv_cache import RUN, BlockManager, PrefixCachingBlockManager
from simulator.serving.request import Request
from simulator.specs.engine_args import EngineArgs
from simulator.workload.requests import RequestTable


def run(
    requests: RequestTable,
    *,
    caching: bool = True,
    num_blocks: int = 1000,
    timer: FixedTimer | None = None,
    **scheduler: object,
) -> SimResult:
    group = fixed_group(
        scheduler=make_scheduler(**scheduler),
        timer=timer,
        num_blocks=num_blocks,
        host_blocks=1000,
        enable_prefix_caching=caching,
    )
    return serve(requests, groups=[group])


def request(
    id: int, prompt: int, *, prefix: tuple[int, int] = (-1, 0), session: int = -1
) -> Request:
    return Request(
        id=id,
        arrival_s=0.0,
        prompt_len=prompt,
        output_len=4,
        prefix_id=prefix[0],
        prefix_len=prefix[1],
        session_id=session,
    )


def compute(kv: PrefixCachingBlockManager, req: Request, tokens: int) -> Request:
    """Allocate for `tokens` more tokens of `req` and count them computed (as a step would)."""
    assert kv.allocate(req, tokens)
    req.num_computed += tokens
    return req


# -- the block manager --------------------------------------------------------------------------
def test_a_hit_covers_exactly_the_shared_full_blocks() -> None:
    # 16-token blocks, a 40-token shared prefix: blocks [0, 16) and [16, 32) are all prefix and
    # shared; [32, 48) holds 8 prefix tokens and 8 of each request's own, so it differs.
    kv = PrefixCachingBlockManager(num_blocks=10, block_size=16, watermark=0.0)
    compute(kv, request(0, 100, prefix=(7, 40)), 100)
    assert len(kv.held) == 2  # the prefix's full blocks; the rest only request 0 can reuse
    other = request(1, 60, prefix=(7, 40))
    assert kv.prefix_hit(other) == 32
    assert kv.prefix_hit(request(2, 60, prefix=(8, 40))) == 0  # another prefix
    assert kv.can_admit(other, 28, hit=32)
    kv.take_prefix(other, 32)
    kv.allocate(other, 28)
    assert (other.num_computed, other.blocks, other.cached_tokens) == (32, 4, 32)
    assert kv.used == 7 + 2  # first: 7 blocks; other: 2 shared + 2 of its own
    assert [kv.held[k] for k in other.cache_keys[:2] if k] == [2, 2]


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    kv = PrefixCachingBlockManager(num_blocks=10, block_size=16, watermark=0.0)
    compute(kv, request(0, 64, prefix=(1, 64)), 64)  # caches 4 full blocks
    # the same 48 tokens: 3 blocks cached, but the last token must be computed to sample
    # from, so the hit stops a block short (vLLM V1 caps the hit at the prompt minus one)
    assert kv.prefix_hit(request(1, 48, prefix=(1, 48))) == 32
    assert kv.prefix_hit(request(2, 49, prefix=(1, 48))) == 48  # 1 token left to compute
    assert kv.prefix_hit(request(3, 1, prefix=(1, 1))) == 0


def test_lru_evicts_the_least_recently_freed_tail_first() -> None:
    kv = PrefixCachingBlockManager(num_blocks=4, block_size=16, watermark=0.0)
    a = request(0, 33, prefix=(1, 33))  # blocks a0, a1 full and cached, a third partial
    b = request(1, 17, session=5)  # b0 cached, a second partial
    kv.release(compute(kv, a, 33))
    kv.release(compute(kv, b, 17))
    a0, a1 = PrefixCachingBlockManager.key(a, 16), PrefixCachingBlockManager.key(a, 32)
    b0 = PrefixCachingBlockManager.key(b, 16)
    assert list(kv.lru) == [a1, a0, b0]  # a freed last block first: its tail goes first
    assert (kv.free, kv.empty) == (4, 1)
    kv.allocate(request(2, 32), 32)  # 2 blocks: the empty one, then evict a1
    assert list(kv.lru) == [a0, b0] and kv.evictions == 1
    assert kv.prefix_hit(request(3, 40, prefix=(1, 33))) == 16  # a0 only
    kv.allocate(request(4, 16), 16)  # evicts a0, older than b0
    assert list(kv.lru) == [b0]
    assert kv.prefix_hit(request(5, 40, prefix=(1, 33))) == 0


def test_a_hit_takes_unheld_blocks_out_of_the_free_count() -> None:
    kv = PrefixCachingBlockManager(num_blocks=4, block_size=16, watermark=0.0)
    donor = compute(kv, request(0, 48, prefix=(1, 48)), 48)
    assert kv.free == 1
    kv.release(donor)
    assert kv.free == 4 and len(kv.lru) == 3  # cached but unheld: allocatable
    # 32 cached tokens (2 unheld blocks) + 16 to compute (1 block): 3 of the 4 free blocks
    again = request(1, 48, prefix=(1, 48))
    assert kv.can_admit(again, 16, hit=32)
    # 48 cached (3 unheld) + 52 to compute: 7 blocks in all, 3 of them cached, 4 more: 7 > 4
    assert not kv.can_admit(request(2, 100, prefix=(1, 48)), 52, hit=48)
    kv.take_prefix(again, 32)
    assert kv.free == 2
    compute(kv, again, 16)  # the third block: taken from the empty one, nothing evicted
    assert (kv.free, kv.used, kv.evictions) == (1, 3, 0)
    kv.release(again)
    assert kv.free == 4


def test_preemption_by_recompute_rehits_its_own_blocks() -> None:
    kv = PrefixCachingBlockManager(num_blocks=10, block_size=16, watermark=0.0)
    req = compute(kv, request(0, 40), 40)
    req.num_output = 1
    for _ in range(9):  # nine decode steps: 49 tokens computed, 10 sampled
        compute(kv, req, 1)
        req.num_output += 1
    kv.release(req)  # preempted by recompute
    req.num_computed, req.preemptions = 0, 1
    # known tokens 50: the hit may cover 49, in full blocks 48 (prompt and generated tokens)
    assert kv.prefix_hit(req) == 48
    # another request needs 8 blocks: the 7 empty ones, then the tail of req's cached blocks
    other = compute(kv, request(1, 128), 128)
    assert kv.evictions == 1 and kv.prefix_hit(req) == 32
    kv.release(other)
    kv.take_prefix(req, 32)
    assert req.num_computed == 32 and req.remaining == 18 and req.blocks == 2
    assert req.cached_tokens == 0  # counted at the first admission only, as vLLM


def test_without_prefix_caching_nothing_is_looked_up() -> None:
    kv = BlockManager(num_blocks=10, block_size=16, watermark=0.0)
    assert not kv.prefix_caching and kv.prefix_hit(request(0, 40)) == 0
    with pytest.raises(ValueError):
        kv.take_prefix(request(0, 40), 16)


def check_accounting(kv: PrefixCachingBlockManager, active: list[Request]) -> None:
    assert kv.free == kv.empty + kv.unheld
    assert kv.unheld == len(kv.lru) - len(kv.runs) + sum(kv.runs.values())
    assert {k[1] for k in kv.lru if k[0] == RUN} == set(kv.runs)
    holders: dict[object, int] = {}
    private = 0
    for r in active:
        keys = [k for k in r.cache_keys if k is not None]
        assert len(r.cache_keys) <= r.blocks
        private += r.blocks - len(keys)
        for k in keys:
            holders[k] = holders.get(k, 0) + 1
    assert holders == kv.held  # a shared block counts once, however many hold it
    assert kv.free + private + len(kv.held) == kv.num_blocks
    assert not set(kv.held) & set(kv.lru)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["admit", "grow", "finish", "recompute", "swap"]), st.integers(0, 7)
        ),
        min_size=1,
        max_size=60,
    )
)
def test_block_accounting_holds_under_any_sequence(ops: list[tuple[str, int]]) -> None:
    # requests of 4 kinds of content (two prefixes, one conversation, their own), admitted
    # from the cache, grown a token at a time, finished, preempted by recompute (readmitted
    # from the cache) or by swap (blocks allocated anew), in any order
    kv = PrefixCachingBlockManager(num_blocks=24, block_size=16, watermark=0.0)
    active: list[Request] = []

    def admit(req: Request) -> None:
        hit = kv.prefix_hit(req)
        assert hit % 16 == 0 and hit < req.known
        n = req.known - req.num_computed - hit
        if kv.can_admit(req, n, hit=hit):
            if hit:
                kv.take_prefix(req, hit)
            compute(kv, req, n)
            req.num_output += 1
            active.append(req)

    for number, (op, x) in enumerate(ops):
        if op == "admit":
            prefix = [(1, 30), (2, 50), (-1, 0), (-1, 0)][x % 4]
            req = request(number, prefix[1] + 5 + 17 * x, prefix=prefix)
            if x % 4 == 2:
                req.stream = 99  # a conversation's stream
            admit(req)
        elif op in ("recompute", "swap") and active:
            req = active.pop(x % len(active))
            kv.release(req)
            if op == "recompute":
                req.num_computed = 0
                req.preemptions += 1
                admit(req)
            elif kv.can_admit(req, 0):  # swapped back in: its KV comes back to new blocks
                compute(kv, req, 0)
                active.append(req)
        elif op == "grow" and active:
            req = active[x % len(active)]
            if kv.allocate(req, 1):
                req.num_computed += 1
                req.num_output += 1
        elif op == "finish" and active:
            kv.release(active.pop(x % len(active)))
        check_accounting(kv, active)


# -- through the engine -------------------------------------------------------------------------
def test_a_later_request_skips_the_cached_shared_prefix() -> None:
    # r0 (60-token prompt, 40 of them a shared system prompt): prefill 10.6 ms, one decode
    # step -> 15.6 ms. r1 arrives at 100 ms with the same 40-token prefix: 32 tokens (two
    # full blocks) come from the cache, so it prefills 28 tokens at offset 32: 10.28 ms.
    timer = FixedTimer()
    rows = ((0.0, 60, 2), (0.1, 60, 2))
    result = run(make_requests(*rows, prefix_id=[0, 0], prefix_len=[40, 40]), timer=timer)
    df = result.requests
    assert times_ms(df, "first_token_s") == [10.6, 110.28]
    assert times_ms(df, "finish_s") == [15.6, 115.28]
    assert df["cached_tokens"].tolist() == [0, 32]
    assert result.steps["prefill_tokens"].tolist() == [60, 0, 28, 0]
    assert timer.chunks == [(60, 0, True), (28, 32, True)]  # priced at the cached offset
    off = run(make_requests(*rows, prefix_id=[0, 0], prefix_len=[40, 40]), caching=False)
    assert times_ms(off.requests, "first_token_s") == [10.6, 110.6]
    assert off.requests["cached_tokens"].tolist() == [0, 0]


def test_a_preempted_request_recomputes_only_what_was_evicted() -> None:
    # 7 blocks of 16. A (40 + 20 out) and B (40 + 30 out) prefill together: 10.8 ms; eight
    # decode steps to 48 tokens each (50.8 ms). A takes the last block; B cannot grow and is
    # preempted (a 10 ms step for A alone, 60.8 ms). Its 3 full blocks stay cached, unheld.
    # A decodes 10 more steps, finishes at 110.8 ms; B comes back: 49 tokens known, 48 cached,
    # so its first step is a 5 ms decode, then 20 more: 110.8 + 21 * 5 = 215.8 ms.
    # Without the cache B re-prefills 49 tokens (10.49 ms) and then decodes 20 steps.
    requests = make_requests((0.0, 40, 20), (0.0, 40, 30))
    on, off = run(requests, num_blocks=7), run(requests, num_blocks=7, caching=False)
    assert on.requests["preemptions"].tolist() == [0, 1]
    assert off.requests["preemptions"].tolist() == [0, 1]
    assert times_ms(on.requests, "finish_s") == [110.8, 215.8]
    assert times_ms(off.requests, "finish_s") == [110.8, 221.29]
    assert on.steps["prefill_tokens"].sum() == 80
    assert off.steps["prefill_tokens"].sum() == 80 + 49
    assert on.requests["cached_tokens"].tolist() == [0, 0]


def test_a_conversation_turn_reuses_the_previous_turn() -> None:
    # Turn 1: prompt 40, 10 out: prefill 10.4 ms + 9 decode steps -> finishes at 55.4 ms,
    # having computed 49 tokens (3 full blocks). Turn 2 is sent 50 ms later (105.4 ms) with
    # prompt 40 + 10 + 20 = 70 tokens: 48 cached, 22 prefilled (10.22 ms), one decode step.
    conversation = make_requests(
        (0.0, 40, 10), (0.0, 70, 2), session_id=[3, 3], follows=[-1, 0], think_s=[0.0, 0.05]
    )
    result = run(conversation)
    df = result.requests
    assert times_ms(df, "arrival_s") == [0.0, 105.4]  # the second turn's clock starts when sent
    assert times_ms(df, "first_token_s") == [10.4, 115.62]
    assert times_ms(df, "finish_s") == [55.4, 120.62]
    assert df["cached_tokens"].tolist() == [0, 48]
    off = run(conversation, caching=False)
    assert times_ms(off.requests, "finish_s") == [55.4, 121.1]


def test_turns_wait_for_a_slot_under_max_concurrency() -> None:
    # Two conversations of two turns, one request at a time: every turn is sent, none overlap.
    conversations = make_requests(
        (0.0, 40, 3),
        (0.0, 60, 3),
        (0.0, 40, 3),
        (0.0, 60, 3),
        session_id=[0, 0, 1, 1],
        follows=[-1, 0, -1, 2],
        think_s=[0.0, 0.0, 0.0, 0.0],
    )
    group = fixed_group(num_blocks=100, enable_prefix_caching=True)
    df = serve(conversations, groups=[group], max_concurrency=1).requests.sort_values("arrival_s")
    assert sorted(df["request_id"]) == [0, 1, 2, 3]
    assert (df["arrival_s"].to_numpy()[1:] >= df["finish_s"].to_numpy()[:-1]).all()
    assert (
        df.set_index("request_id").loc[1, "arrival_s"]
        >= df.set_index("request_id").loc[0, "finish_s"]
    )


# -- properties ---------------------------------------------------------------------------------
workloads = st.lists(
    st.tuples(st.floats(0, 0.3), st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=20
)


def unshared(rows: list[tuple[float, int, int]]) -> RequestTable:
    rows.sort()
    return make_requests(*rows)


@settings(max_examples=40, deadline=None)
@given(rows=workloads, num_blocks=st.integers(25, 200))
def test_nothing_shared_gives_the_same_results_as_no_caching(
    rows: list[tuple[float, int, int]], num_blocks: int
) -> None:
    # Cached blocks nobody holds count as free, so the cache changes nothing unless it hits;
    # with nothing shared a hit can only come from a preempted request's own blocks.
    requests = unshared(rows)
    off = run(requests, num_blocks=num_blocks, caching=False)
    on = run(requests, num_blocks=num_blocks)
    if off.requests["preemptions"].sum() == 0:
        pd.testing.assert_frame_equal(on.requests, off.requests)
        pd.testing.assert_frame_equal(on.steps, off.steps)
    assert (on.requests["cached_tokens"] == 0).all()


@settings(max_examples=30, deadline=None)
@given(rows=workloads, num_blocks=st.integers(25, 120))
def test_with_swap_preemption_nothing_shared_is_identical(
    rows: list[tuple[float, int, int]], num_blocks: int
) -> None:
    # Swapped requests come back with their KV: no lookups, so even preemptions match.
    requests = unshared(rows)
    off = run(requests, num_blocks=num_blocks, caching=False, preemption_mode="swap")
    on = run(requests, num_blocks=num_blocks, preemption_mode="swap")
    pd.testing.assert_frame_equal(on.requests, off.requests)
    pd.testing.assert_frame_equal(on.steps, off.steps)


@settings(max_examples=40, deadline=None)
@given(
    rows=workloads,
    num_blocks=st.integers(34, 120),  # the longest request: 300 + 200 + 40 tokens, 34 blocks
    prefix=st.integers(1, 200),
    shared=st.lists(st.booleans(), min_size=20, max_size=20),
)
def test_shared_prefixes_finish_every_request_within_the_cache(
    rows: list[tuple[float, int, int]], num_blocks: int, prefix: int, shared: list[bool]
) -> None:
    rows.sort()
    carry = np.array(shared[: len(rows)])
    prompt = np.array([r[1] for r in rows]) + np.where(carry, prefix, 0)
    requests = make_requests(
        *[(a, int(p), o) for (a, _, o), p in zip(rows, prompt, strict=True)],
        prefix_id=np.where(carry, 0, -1),
        prefix_len=np.where(carry, prefix, 0),
    )
    result = run(requests, num_blocks=num_blocks)
    df = result.requests
    assert df["output_tokens"].tolist() == [r[2] for r in rows]
    assert (df["cached_tokens"] <= df["prompt_tokens"] - 1).all()
    assert (df["cached_tokens"] % 16 == 0).all()
    assert (df.loc[~carry, "cached_tokens"] == 0).all()
    assert (result.steps["kv_used_blocks"] <= num_blocks).all()
    # every prompt token is either cached or prefilled (more when preemptions recompute)
    computed = result.steps["prefill_tokens"].sum() + result.steps["decode_tokens"].sum()
    needed = (df["prompt_tokens"] + df["output_tokens"] - 1 - df["cached_tokens"]).sum()
    assert computed >= needed


# -- scenario and CLI ---------------------------------------------------------------------------
def test_prefix_chat_scenario_hits_and_is_faster() -> None:
    result = runner.run("scenarios/prefix_chat.yaml")
    s = result.summary
    assert 0.5 < s["prefix_cache_hit_rate"] < 1.0
    assert s["prefix_cache_saved_tokens"] == result.sim.requests["cached_tokens"].sum()
    groups = [
        g.model_copy(update={"enable_prefix_caching": False}) for g in result.scenario.replicas
    ]
    without = runner.run(result.scenario.model_copy(update={"replicas": groups}))
    assert "prefix_cache_hit_rate" not in without.summary
    assert s["mean_ttft_ms"] < without.summary["mean_ttft_ms"]
    assert s["total_input_tokens"] == without.summary["total_input_tokens"]


def test_bench_serve_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = (
        "bench", "serve", "--hardware", "h100_sxm", "--model", "llama-3.1-8b",
        "--num-prompts", "50", "--request-rate", "5", "--random-input-len", "128",
        "--random-output-len", "16", "--random-prefix-len", "256",
    )  # fmt: skip
    code, out, _ = run_cli(capsys, *args, "--enable-prefix-caching")
    assert code == 0 and "Prefix cache hit rate (%):" in out
    code, out, _ = run_cli(capsys, *args, "--enable-prefix-caching", "--json")
    summary = json.loads(out)
    # 49 of 50 prompts find the 256 shared tokens (16 blocks) cached: 49 * 256 tokens
    assert summary["prefix_cache_saved_tokens"] == 49 * 256
    assert summary["prefix_cache_hit_rate"] == pytest.approx(49 * 256 / (50 * 384))
    code, out, _ = run_cli(capsys, *args, "--no-enable-prefix-caching")
    assert code == 0 and "Prefix cache" not in out
    code, _, err = run_cli(
        capsys, *args[:6], "--dataset-name", "sharegpt", "--random-prefix-len", "8"
    )
    assert code == 2 and "random_prefix_len" in err


def test_bench_throughput_prefix_len(capsys: pytest.CaptureFixture[str]) -> None:
    args = (
        "bench", "throughput", "--hardware", "h100_sxm", "--model", "llama-3.1-8b",
        "--num-prompts", "64", "--input-len", "64", "--output-len", "16", "--prefix-len", "1024",
        "--json",
    )  # fmt: skip
    _, out, _ = run_cli(capsys, *args, "--no-enable-prefix-caching")
    cold = json.loads(out)
    _, out, _ = run_cli(capsys, *args, "--enable-prefix-caching")
    warm = json.loads(out)
    assert cold["total_num_tokens"] == warm["total_num_tokens"] == 64 * (1024 + 64 + 16)
    assert warm["requests_per_second"] > cold["requests_per_second"]
    _, out, _ = run_cli(capsys, *args)  # vLLM V1 caches prefixes unless told not to
    assert json.loads(out) == warm


def test_scenario_field_round_trips() -> None:
    scenario = runner.bench_scenario(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        workload=runner.WorkloadSpec.model_validate(
            {"dataset": {"name": "random"}, "num_prompts": 4, "prefix": {"tokens": 32}}
        ),
        engine_args=EngineArgs(enable_prefix_caching=True),
    )
    assert scenario.replicas[0].enable_prefix_caching
    assert scenario.workload.prefix is not None and scenario.workload.prefix.tokens == 32
