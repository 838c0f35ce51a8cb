"""KV token budgets under speculative decoding: a decode takes 1 + k slots a step and rolls the
rejected back while the budget keeps what it keeps; a verification is no prompt (SnapKV's
selection does not run on it) and H2O scores every query it verifies."""

from __future__ import annotations

import pytest
from clitools import run_cli
from factories import scenario_data, speculative_steps
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.deployment import deployment
from simulator.costmodel.memory import KvHold
from simulator.runs import runner
from simulator.serving.drafter import resolve_drafter
from simulator.serving.kv_cache import BlockManager, PrefixCachingBlockManager
from simulator.specs.deployment import KvEviction
from simulator.specs.loader import validate
from simulator.specs.scenario import Scenario
from simulator.specs.serving import SpeculativeSpec

K = 3  # proposals a step
SIZES = {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "max_context": 8192}


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 600),
    st.integers(1, 300),
    st.sampled_from(["snapkv", "h2o", "streaming"]),
    st.lists(st.integers(0, K), min_size=1, max_size=60),
    st.booleans(),
)
def test_speculative_steps_keep_the_budget_and_balance(
    prompt: int, budget: int, policy: str, accepted: list[int], prefix_caching: bool
) -> None:
    """Each speculative step takes 1 + k slots and rolls the rejected back (as
    `Replica._accepted` does): under a budget the cache never holds more than the plain one,
    never more than what the budget keeps with the step's slots, and is whole again once
    released."""
    cls = PrefixCachingBlockManager if prefix_caching else BlockManager
    eviction = KvEviction(budget_tokens=budget, policy=policy)  # type: ignore[arg-type]
    kv = cls(num_blocks=10_000, block_size=16, hold=KvHold(eviction=eviction))
    plain = cls(num_blocks=10_000, block_size=16)
    for req, twin in speculative_steps(kv, plain, prompt=prompt, accepted=accepted, k=K):
        keeps = eviction.held(req.num_computed + 1 + K, prompt)
        assert req.blocks <= twin.blocks
        assert req.blocks <= -(-keeps // 16)
    kv.release(req)
    assert kv.free == kv.num_blocks


def _verify_s(policy: str | None, ctx: int, *, k: int = K, seqs: int = 1) -> float:
    """GPU seconds of one verification step of `seqs` sequences whose KV (as kept) is `ctx`."""
    budget = {} if policy is None else {"kv_budget": 2048, "kv_eviction": policy}
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm", **budget)
    spec = SpeculativeSpec(method="ngram", num_speculative_tokens=k, acceptance_rate=0.5)
    timer = resolve_drafter(spec, dep).step_timer(**SIZES)
    return timer.kernel_s(chunks=[], decode_contexts=[ctx] * seqs)


@pytest.mark.parametrize("ctx", [513, 2048, 6000])
def test_a_verification_runs_no_snapkv_selection(ctx: int) -> None:
    """SnapKV selects at the end of a prompt: a step verifying proposals over the KV it kept
    costs what the same step costs without a budget (it was priced as a prompt chunk's
    selection once)."""
    assert _verify_s("snapkv", ctx) == _verify_s(None, ctx)


def test_h2o_scores_every_verified_query() -> None:
    """H2O accumulates the attention weights of each query: verifying 1 + k tokens costs more
    over StreamingLLM's ring buffer (which scores nothing) than verifying 1 + 1 does."""
    ctx, seqs = 2048, 8
    four = _verify_s("h2o", ctx, seqs=seqs) - _verify_s("streaming", ctx, seqs=seqs)
    two = _verify_s("h2o", ctx, k=1, seqs=seqs) - _verify_s("streaming", ctx, k=1, seqs=seqs)
    assert four > 1.5 * two > 0


def _run(*, speculate: bool) -> runner.RunResult:
    group: dict[str, object] = {"hardware": "h100_sxm", "kv_budget": 2048}
    if speculate:
        group["speculative"] = {
            "method": "eagle",
            "num_speculative_tokens": K,
            "acceptance_rates": [0.8, 0.7, 0.6],
        }
    data = scenario_data(
        group=group, num_prompts=40, input_len=16000, output_len=256, request_rate=0.5, seed=0
    )
    return runner.run(validate(Scenario, data, source="t"))


def test_a_budget_with_speculation_keeps_its_savings() -> None:
    """Llama-3.1-8B on an H100, 40 prompts of 16,000 tokens with a 2,048-token SnapKV budget and
    an EAGLE head: each running sequence holds at most its budget (and what it generated) with
    a step's slots, nothing is preempted, and decoding is faster than under the budget alone."""
    result = _run(speculate=True)
    steps = result.sim.steps
    per_seq = -(-(2048 + 256 + 1 + K) // 16)
    chunk = 2048 // 16 + 1  # a prompt chunk in flight beyond its kept tokens
    prompt = -(-16000 // 16)  # a prompt held whole until its first decode
    assert (steps["kv_used_blocks"] <= steps["num_seqs"] * per_seq + prompt + chunk).all()
    assert result.summary["preemptions"] == 0
    alone = _run(speculate=False)
    assert result.summary["mean_tpot_ms"] < 0.8 * alone.summary["mean_tpot_ms"]


def test_the_cli_takes_a_budget_with_speculation(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "throughput", "--model", "llama-3.1-8b", "--hardware", "h100_sxm"]
    args += ["--num-prompts", "8", "--input-len", "4096", "--output-len", "64"]
    config = '{"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.5}'
    code, out, _ = run_cli(capsys, *args, "--kv-budget", "512", "--speculative-config", config)
    assert code == 0 and "Throughput:" in out
