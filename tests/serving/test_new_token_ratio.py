"""SGLang's admission by new_token_ratio and its retraction (serving/scheduler.py)."""

from __future__ import annotations

from collections import deque

import numpy as np
from factories import fixed_group, make_requests, make_scheduler, times_ms

from simulator.serving.cluster import SimResult, serve
from simulator.serving.group import default_scheduler
from simulator.serving.kv_cache import BlockManager
from simulator.serving.request import Request
from simulator.serving.scheduler import AdmissionState, schedule
from simulator.specs.engine import NewTokenRatio
from simulator.specs.loader import load_engine
from simulator.specs.serving import SchedulerSpec
from simulator.workload.requests import RequestTable

SGLANG_03 = NewTokenRatio(
    init_ratio=0.7, min_ratio=0.1, decay=0.001, retract_decode_steps=20, clip_max_new_tokens=4096
)
SGLANG_05 = SGLANG_03.model_copy(
    update={"min_ratio": 0.098, "decay": 0.001003, "retract_until_next_step": True}
)


def sglang_like(admission: NewTokenRatio | None = SGLANG_03) -> SchedulerSpec:
    return make_scheduler(kind="prefill_first", admission=admission, max_num_seqs=64)


def run(requests: RequestTable, scheduler: SchedulerSpec, *, tokens: int) -> SimResult:
    group = fixed_group(scheduler=scheduler, num_blocks=tokens, block_size=1)
    return serve(requests, groups=[group])


def test_the_profiles_carry_the_ratios_read_from_sglang() -> None:
    assert default_scheduler(load_engine("sglang-0.3")).admission == SGLANG_03
    adm = default_scheduler(load_engine("sglang-0.4")).admission
    assert adm is not None and (adm.init_ratio, adm.min_ratio) == (0.7, 0.098)
    assert adm.decay == round((0.7 - 0.098) / 600, 6)
    assert default_scheduler(load_engine("sglang")).admission == SGLANG_05
    assert default_scheduler(load_engine("vllm")).admission is None


def test_with_tight_kv_sglang_admits_fewer_than_a_prompt_fit_scheduler() -> None:
    # 1000 KV tokens, eight requests of 50 + 200 tokens at t=0. vLLM-style admission needs the
    # prompts' 400 tokens: all eight start. SGLang's asks 50 + 200 below the room: 1000, 750,
    # 500, then 250 is not below 250: three start.
    requests = make_requests(*[(0.0, 50, 200)] * 8)
    plain = run(requests, sglang_like(None), tokens=1000)
    ratio = run(requests, sglang_like(), tokens=1000)
    assert plain.steps["prefill_tokens"].iloc[0] == 400
    assert ratio.steps["prefill_tokens"].iloc[0] == 150
    # the others join as the running requests' reserve (remaining x ratio) shrinks
    assert ratio.requests["output_tokens"].tolist() == [200] * 8
    assert ratio.requests["preemptions"].sum() == 0 < plain.requests["preemptions"].sum()


def test_a_decode_step_without_room_retracts_the_fewest_outputs_and_reestimates() -> None:
    kv = BlockManager(num_blocks=113, block_size=1, watermark=0.0)
    a = Request(id=0, arrival_s=0.0, prompt_len=50, output_len=100)
    b = Request(id=1, arrival_s=0.0, prompt_len=50, output_len=100)
    for req, out in ((a, 10), (b, 5)):  # a decoded 10 tokens, b 5: 113 tokens, none free
        req.num_output = out
        kv.allocate(req, 50 + out - 1)
        req.num_computed = 50 + out - 1
    state = AdmissionState(0.5)
    waiting: deque[Request] = deque([Request(id=2, arrival_s=0.0, prompt_len=40, output_len=40)])
    running = [a, b]
    plan = schedule(sglang_like(), running=running, waiting=waiting, kv=kv, state=state)
    assert plan.preempted == [b] and running == [a] and list(waiting)[-1] is b
    assert b.num_computed == 0 and b.preemptions == 1
    assert state.ratio == (10 + 20 * 1) / 100  # (decoded + 20 x left) / their max_new_tokens
    assert plan.entries == [(a, 1)]
    plan = schedule(sglang_like(), running=running, waiting=waiting, kv=kv, state=state)
    assert not plan.preempted and state.ratio == 0.3 - 0.001  # room again: it decays


def test_sglang_05_retracts_until_the_next_step_fits_03_until_20_tokens_each() -> None:
    def full_pool() -> tuple[BlockManager, list[Request]]:
        # prompts 50, 50, 10 with 30, 20, 10 outputs: 79 + 69 + 19 = 167 tokens, none free
        kv = BlockManager(num_blocks=167, block_size=1, watermark=0.0)
        running = []
        for i, (prompt, out) in enumerate(((50, 30), (50, 20), (10, 10))):
            req = Request(id=i, arrival_s=0.0, prompt_len=prompt, output_len=100)
            req.num_output = out
            assert kv.allocate(req, prompt + out - 1)
            req.num_computed = prompt + out - 1
            running.append(req)
        return kv, running

    kv, running = full_pool()
    state = AdmissionState(0.5)
    plan = schedule(sglang_like(SGLANG_05), running=running, waiting=deque(), kv=kv, state=state)
    # 0.5: one retraction (the fewest outputs) frees 19 tokens, the next step's 2 fit
    assert [r.id for r in plan.preempted] == [2] and [r.id for r in running] == [0, 1]
    assert state.ratio == (30 + 20 + 20 * 2) / 200
    kv, running = full_pool()
    plan = schedule(sglang_like(), running=running, waiting=deque(), kv=kv, state=state)
    # 0.3/0.4: on until 20 free tokens per request left: 19 < 40, then 88 >= 20
    assert [r.id for r in plan.preempted] == [2, 1] and [r.id for r in running] == [0]
    assert state.ratio == (30 + 20) / 100


def test_when_outputs_outgrow_the_pool_sglang_retracts_and_every_request_finishes() -> None:
    # A fast decay lets many requests in; their outputs then outgrow 600 KV tokens.
    fast = SGLANG_03.model_copy(update={"decay": 0.2})
    requests = make_requests(*[(0.0, 50, 300)] * 6)
    result = run(requests, sglang_like(fast), tokens=600)
    assert result.requests["preemptions"].sum() > 0
    assert result.requests["output_tokens"].tolist() == [300] * 6
    assert result.steps["kv_used_blocks"].max() <= 600


def test_with_ample_kv_the_ratio_changes_nothing() -> None:
    rng = np.random.default_rng(0)
    n = 40
    requests = RequestTable(
        arrival_s=np.sort(rng.uniform(0, 0.5, n)),
        prompt_len=rng.integers(20, 400, n),
        output_len=rng.integers(5, 200, n),
    )
    plain = run(requests, sglang_like(None), tokens=200_000)
    ratio = run(requests, sglang_like(), tokens=200_000)
    for column in ("first_token_s", "finish_s"):
        assert times_ms(ratio.requests, column) == times_ms(plain.requests, column)
    assert ratio.requests["preemptions"].sum() == 0
