"""Speculative decoding: the config, acceptance draws, verification pricing, the engine's token
arithmetic (hand-computed), the drafter's memory and cost, and the CLI.

The engine cases run on a token-priced step timer, so every number can be checked on paper:
a step takes 5 ms + 10 us per token computed (prefill tokens + (1 + k) per decode)."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from clitools import run_cli
from factories import MS, cost_model_step_s, make_requests, make_scheduler
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import api
from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment, deployment
from simulator.errors import SpecError
from simulator.runs import runner
from simulator.runs.latency import LatencyResult
from simulator.serving.cluster import ReplicaGroup, SimResult, replica_group, serve
from simulator.serving.drafter import resolve_drafter
from simulator.serving.speculative import Acceptance
from simulator.serving.steptime import verify_shape
from simulator.specs.serving import SpeculativeSpec, parse_speculative_config
from simulator.workload.requests import RequestTable


def eagle(k: int = 3, rate: float = 0.7) -> SpeculativeSpec:
    return SpeculativeSpec(method="eagle", num_speculative_tokens=k, acceptance_rate=rate)


# -- the config ---------------------------------------------------------------------------------
def test_vllm_json_parses_with_the_acceptance() -> None:
    spec = parse_speculative_config(
        '{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", '
        '"num_speculative_tokens": 2, "acceptance_rates": [0.8, 0.5]}'
    )
    assert spec is not None
    assert spec.kind == "eagle3"
    assert spec.rates == (0.8, 0.5)
    assert spec.expected_tokens == pytest.approx(1 + 0.8 + 0.8 * 0.5)  # 2.2


def test_the_method_follows_vllm_when_left_out() -> None:
    ngram = parse_speculative_config(
        {"model": "[ngram]", "num_speculative_tokens": 4, "acceptance_rate": 0.5}
    )
    draft = parse_speculative_config(
        {"model": "llama-3.1-8b", "num_speculative_tokens": 4, "acceptance_rate": 0.5}
    )
    assert ngram is not None and ngram.kind == "ngram" and ngram.model is None
    assert draft is not None and draft.kind == "draft_model"
    mtp = parse_speculative_config(
        {"method": "deepseek_mtp", "num_speculative_tokens": 1, "acceptance_rate": 0.9}
    )
    assert mtp is not None and mtp.kind == "mtp"


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"method": "eagle", "num_speculative_tokens": 3}, "acceptance_rate"),
        (
            {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rates": [0.9]},
            "1 values for num_speculative_tokens 3",
        ),
        ({"method": "draft_model", "num_speculative_tokens": 3, "acceptance_rate": 0.5}, "model"),
        (
            {
                "method": "eagle",
                "num_speculative_tokens": 3,
                "acceptance_rate": 0.5,
                "prompt_lookup_max": 4,
            },
            "ngram only",
        ),
        ({"method": "eagle", "num_speculative_tokens": 0, "acceptance_rate": 0.5}, "greater"),
        ({"method": "lookahead", "num_speculative_tokens": 3, "acceptance_rate": 0.5}, "method"),
        ('{"method": "eagle",', "not valid JSON"),
    ],
)
def test_bad_configs_are_spec_errors(config: object, says: str) -> None:
    with pytest.raises(SpecError, match=says):
        parse_speculative_config(config)  # type: ignore[arg-type]


# -- acceptance ---------------------------------------------------------------------------------
def test_acceptance_zero_and_one_are_exact() -> None:
    rng = np.random.default_rng(0)
    none, every = Acceptance(rates=[0.0] * 4, rng=rng), Acceptance(rates=[1.0] * 4, rng=rng)
    assert {none.accept(4) for _ in range(100)} == {0}
    assert {every.accept(4) for _ in range(100)} == {4}
    assert every.accept(2) == 2  # capped at the proposals verified


@settings(max_examples=20, deadline=None)
@given(rates=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5), seed=st.integers(0, 99))
def test_mean_acceptance_matches_the_rates(rates: list[float], seed: int) -> None:
    k = len(rates)
    spec = SpeculativeSpec(method="ngram", num_speculative_tokens=k, acceptance_rates=rates)  # type: ignore[arg-type]
    draws = Acceptance(rates=rates, rng=np.random.default_rng(seed))
    sample = np.array([draws.accept(k) for _ in range(8192)])
    # mean accepted = expected tokens - 1; its standard error is at most k / sqrt(n)
    assert sample.mean() == pytest.approx(spec.expected_tokens - 1, abs=5 * k / math.sqrt(8192))
    same = Acceptance(rates=rates, rng=np.random.default_rng(seed))
    assert [same.accept(k) for _ in range(8192)] == sample.tolist()  # deterministic


# -- the shape of a verification ------------------------------------------------------------------
def test_verify_shape_by_hand() -> None:
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    # 2 sequences with 100 cached tokens (a plain decode would attend to 101) verifying 4:
    # pairs per sequence = 4 * 100 + (1 + 2 + 3 + 4) = 410, KV read = 104 tokens each.
    shape = verify_shape(model=dep.model, num_seqs=2, context=101, tokens=4, logits=8)
    assert float(shape.prefill_tokens) == 8
    assert float(shape.prefill_seqs) == 2
    assert float(shape.prefill_pairs) == 820
    assert float(shape.prefill_kv_tokens) == 208
    assert float(shape.sampled) == 8
    one = verify_shape(model=dep.model, num_seqs=2, context=101, tokens=1, logits=2)
    assert one == BatchShape.decode(batch_size=2.0, context_len=101.0)
    # MLA: 2 decode queries attending to 101 and 102 tokens
    mla_model = deployment(model="deepseek-v3", hardware="h200_sxm", tensor_parallel_size=8).model
    mla = verify_shape(model=mla_model, num_seqs=1, context=101, tokens=2, logits=2)
    assert float(mla.decode_seqs) == 2
    assert float(mla.decode_kv_tokens) == 101 + 102


def exact_verify_step(dep: Deployment, contexts: Sequence[int], q: int) -> float:
    """A verification step from the cost model itself: every sequence's shape summed."""
    parts = [verify_shape(model=dep.model, num_seqs=1, context=c, tokens=q) for c in contexts]
    fields = {f: sum(float(getattr(p, f)) for p in parts) for f in BatchShape.__slots__}
    batch = BatchShape(**(fields | {"sampled": float(q * len(contexts))}))
    return cost_model_step_s(dep, batch, num_seqs=len(contexts))


@pytest.mark.parametrize(
    ("model", "hardware", "tp"),
    [
        ("llama-3.1-8b", "h100_sxm", 1),
        ("mistral-7b", "a100_sxm_80gb", 1),  # sliding window
        ("deepseek-v3", "h200_sxm", 8),  # MLA
    ],
)
def test_the_verification_table_is_within_a_percent(model: str, hardware: str, tp: int) -> None:
    dep = deployment(model=model, hardware=hardware, tensor_parallel_size=tp)
    spec = SpeculativeSpec(method="ngram", num_speculative_tokens=3, acceptance_rate=0.5)
    drafter = resolve_drafter(spec, dep)
    timer = drafter.step_timer(max_num_seqs=128, max_num_batched_tokens=4096, max_context=16384)
    rng = np.random.default_rng(1)
    for _ in range(40):
        contexts = rng.integers(2, 12000, int(rng.integers(1, 100))).tolist()
        want = exact_verify_step(dep, contexts, 4)
        got = timer.mixed(chunks=[], decode_contexts=contexts)
        assert got == pytest.approx(want, rel=0.01)


def test_a_verification_step_costs_more_than_the_plain_decode() -> None:
    # one sequence verifying 3 proposals: the chunk's attention on the prefill kernel's
    # factors would come out below the one-token decode's; the serving table keeps the step
    # above the plain decode of the same sequence (`verify_floor`)
    from simulator.serving.steptime import StepTimer

    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    sizes = {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "max_context": 4096}
    spec = SpeculativeSpec(method="ngram", num_speculative_tokens=3, acceptance_rate=0.0)
    verify = resolve_drafter(spec, dep).step_timer(**sizes)
    plain = StepTimer(dep, **sizes)
    for ctx in (513, 2000):
        assert verify.mixed(chunks=[], decode_contexts=[ctx]) > plain.mixed(
            chunks=[], decode_contexts=[ctx]
        )


# -- the engine, on a token-priced timer ----------------------------------------------------------
class TokenTimer:
    """5 ms + 10 us per token computed; decodes compute `verify_tokens` each."""

    penalises = False  # no sampling penalties (`StepTimer.penalises`)

    def __init__(self, verify_tokens: int) -> None:
        self.q = verify_tokens

    def decode_run(
        self, *, num_seqs: int, total_context: float, steps: int, outputs: tuple[int, int] = (0, 0)
    ) -> np.ndarray:
        return np.full(steps, 5 * MS + 0.01 * MS * num_seqs * self.q)

    def decode_ends(
        self, *, start: float, num_seqs: int, total_context: float, steps: int
    ) -> list[float] | None:
        return None  # no short-run path (`StepTimer.decode_ends`): the replica sums decode_run

    def mixed(
        self,
        *,
        chunks: Sequence[tuple[int, int, bool]],
        decode_contexts: Sequence[int],
        outputs: tuple[int, int] = (0, 0),
    ) -> float:
        return 5 * MS + 0.01 * MS * (sum(c[0] for c in chunks) + self.q * len(decode_contexts))


def simulate(
    requests: RequestTable,
    *,
    spec: SpeculativeSpec | None,
    num_blocks: int = 1000,
    max_num_batched_tokens: int = 2048,
    seed: int = 0,
) -> SimResult:
    k = spec.num_speculative_tokens if spec else 0
    scheduler = make_scheduler(
        max_num_batched_tokens=max_num_batched_tokens, num_speculative_tokens=k
    )
    group = ReplicaGroup(
        scheduler=scheduler,
        timer=TokenTimer(1 + k),  # type: ignore[arg-type]
        num_blocks=num_blocks,
        block_size=16,
        speculative=spec,
    )
    return serve(requests, groups=[group], seed=seed)


def test_every_proposal_accepted() -> None:
    # k = 3, all accepted: prefill of 90 tokens (5.9 ms) samples token 1; each decode step
    # verifies 4 tokens (5.04 ms) and yields 4: tokens 5, 9, then 10 (capped at the output).
    # KV (16-token blocks, 4 lookahead slots): 90 -> 6 blocks; step 1 holds 94 -> 6, keeps
    # 94 computed; step 2 holds 98 -> 7; step 3 holds 102 -> 7 (freed when it finishes, after
    # the step: the steps table counts what the step held).
    result = simulate(make_requests((0.0, 90, 10)), spec=eagle(k=3, rate=1.0))
    steps = result.steps
    assert steps["decode_tokens"].tolist() == [0, 4, 4, 4]
    assert steps["kv_used_blocks"].tolist() == [6, 6, 7, 7]
    assert (steps["end_s"] - steps["start_s"]).to_numpy() / MS == pytest.approx(
        [5.9, 5.04, 5.04, 5.04]
    )
    req = result.requests.iloc[0]
    assert req["output_tokens"] == 10
    assert req["finish_s"] / MS == pytest.approx(5.9 + 3 * 5.04)
    # one ITL gap per streamed chunk (step), as vllm bench serve measures it
    assert result.itl_weight.sum() == 3
    assert sorted(result.itl_s / MS) == pytest.approx([5.04] * 3)


def test_no_proposal_accepted() -> None:
    # k = 3, none accepted: each decode step still verifies 4 tokens but yields 1: nine
    # decode steps for tokens 2..10. Slots for computed + 4 tokens: the 7th block is taken
    # when 97 slots are needed (decode 4: 93 computed + 4), three steps before plain decoding
    # would (decode 7: 96 computed + 1); the last step still holds its 7.
    result = simulate(make_requests((0.0, 90, 10)), spec=eagle(k=3, rate=0.0))
    steps = result.steps
    assert steps["decode_tokens"].tolist() == [0] + [4] * 9
    assert steps["kv_used_blocks"].tolist() == [6, 6, 6, 6, 7, 7, 7, 7, 7, 7]
    assert result.requests["output_tokens"].tolist() == [10]


def test_the_real_cost_model_prices_the_steps() -> None:
    # Llama-3.1-8B on one H100, ngram (no draft cost), k = 2, all accepted: prompt 200,
    # output 10 -> prefill (200 tokens, token 1), then 3 verifications of 3 tokens (tokens
    # 2-4, 5-7, 8-10) at KV lengths (as plain decodes) 201, 204, 207.
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    spec = SpeculativeSpec(method="ngram", num_speculative_tokens=2, acceptance_rate=1.0)
    requests = make_requests((0.0, 200, 10))
    group, _ = replica_group(dep, requests=requests, speculative=spec)
    steps = serve(requests, groups=[group]).steps
    durations = (steps["end_s"] - steps["start_s"]).tolist()
    assert steps["decode_tokens"].tolist() == [0, 3, 3, 3]
    for got, context in zip(durations[1:], (201, 204, 207), strict=True):
        assert got == pytest.approx(exact_verify_step(dep, [context], 3), rel=0.01)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=6),
    k=st.integers(1, 4),
)
def test_zero_acceptance_with_a_free_draft_is_plain_decoding(
    rows: list[tuple[int, int]], k: int
) -> None:
    # Everything arrives at t=0, so the schedule does not depend on time, and the token budget
    # holds every prompt (verifications take budget too, which would split chunks otherwise):
    # the same steps run, each decode yields exactly one token, and a step takes longer only
    # by the k extra tokens each decode verifies (10 us each on this timer).
    prompts, outputs = zip(*rows, strict=True)
    requests = RequestTable(
        arrival_s=np.zeros(len(rows)), prompt_len=np.array(prompts), output_len=np.array(outputs)
    )
    spec = SpeculativeSpec(method="ngram", num_speculative_tokens=k, acceptance_rate=0.0)
    fast = simulate(requests, spec=spec)
    plain = simulate(requests, spec=None)
    assert fast.requests["output_tokens"].tolist() == plain.requests["output_tokens"].tolist()
    a, b = fast.steps, plain.steps
    assert a["num_seqs"].tolist() == b["num_seqs"].tolist()
    assert a["prefill_tokens"].tolist() == b["prefill_tokens"].tolist()
    assert a["decode_tokens"].tolist() == [(1 + k) * d for d in b["decode_tokens"]]
    extra = (a["end_s"] - a["start_s"]) - (b["end_s"] - b["start_s"])
    assert extra.to_numpy() == pytest.approx(0.01 * MS * k * b["decode_tokens"].to_numpy())
    assert fast.itl_weight.sum() == plain.itl_weight.sum()  # one token per chunk


@settings(max_examples=25, deadline=None)
@given(prompt=st.integers(1, 300), output=st.integers(1, 60), k=st.integers(1, 5))
def test_full_acceptance_yields_k_plus_one_per_step(prompt: int, output: int, k: int) -> None:
    spec = SpeculativeSpec(method="ngram", num_speculative_tokens=k, acceptance_rate=1.0)
    steps = simulate(make_requests((0.0, prompt, output)), spec=spec).steps
    decodes = int((steps["decode_tokens"] > 0).sum())
    assert decodes == math.ceil((output - 1) / (k + 1))


def test_runs_repeat_with_the_seed() -> None:
    requests = RequestTable(
        arrival_s=np.linspace(0, 0.05, 6),
        prompt_len=np.full(6, 50),
        output_len=np.full(6, 30),
    )
    spec = eagle(k=4, rate=0.6)
    first, again = simulate(requests, spec=spec), simulate(requests, spec=spec)
    assert first.requests.equals(again.requests)
    other = simulate(requests, spec=spec, seed=1)
    assert not first.requests["finish_s"].equals(other.requests["finish_s"])


# -- the drafter: memory and cost -----------------------------------------------------------------
def test_an_eagle_head_costs_one_layer_of_memory() -> None:
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    plan = dep.memory()
    with_head = resolve_drafter(eagle(), dep).memory(plan)
    # one layer's KV: 8 KV heads x 128 x (K, V) x 2 bytes = 4 KiB a token (32 layers: 128 KiB)
    assert with_head.kv_bytes_per_token - plan.kv_bytes_per_token == 4096
    # one decoder layer (attention 4096 x 6144 + 4096 x 4096, MLP 3 x 4096 x 14336, two
    # norms) + the fc (8192 x 4096) + a norm, all 2 bytes a weight
    layer = 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    fc = 2 * 4096 * 4096
    assert with_head.weights_bytes - plan.weights_bytes == 2 * (layer + fc + 4096)


def test_a_draft_model_brings_its_weights_and_kv() -> None:
    dep = deployment(model="llama-3.1-70b", hardware="h100_sxm", tensor_parallel_size=4)
    spec = SpeculativeSpec(
        method="draft_model",
        model="llama-3.1-8b",
        num_speculative_tokens=4,
        acceptance_rate=0.7,
        draft_tensor_parallel_size=1,
    )
    plan = dep.memory()
    more = resolve_drafter(spec, dep).memory(plan)
    assert more.weights_bytes - plan.weights_bytes > 15e9  # the whole 8B draft on one GPU
    assert more.kv_capacity_tokens < plan.kv_capacity_tokens
    bad = spec.model_copy(update={"draft_tensor_parallel_size": 2})
    with pytest.raises(SpecError, match="1 or the target's"):
        resolve_drafter(bad, dep)


# -- bench latency ------------------------------------------------------------------------------
def latency(batch: int, config: dict[str, object] | None) -> LatencyResult:
    return api.estimate(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        batch_size=batch,
        input_len=512,
        output_len=129,
        speculative_config=config,
    )


def test_latency_steps_follow_the_expected_yield() -> None:
    plain = latency(1, None)
    none = latency(1, {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.0})
    every = latency(1, {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 1.0})
    assert len(plain.decode_steps) == len(none.decode_steps) == 128
    assert len(every.decode_steps) == 32  # 128 tokens, 4 a step
    assert (none.decode_steps > plain.decode_steps).all()  # verifying 3 more tokens
    assert none.tpot_s == pytest.approx(none.decode_steps.mean())
    assert every.tpot_s == pytest.approx(every.decode_steps.sum() / 128)
    assert every.ttft_s == plain.ttft_s
    assert every.as_json()["config"]["speculative_tokens_per_step"] == 4.0


def test_the_gain_shrinks_as_the_batch_grows() -> None:
    config = {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.7}
    speedups = [latency(b, None).tpot_s / latency(b, config).tpot_s for b in (1, 16, 64, 256)]
    assert speedups[0] > 1.5
    assert all(a > b for a, b in itertools.pairwise(speedups))


# -- CLI and scenarios --------------------------------------------------------------------------
def test_bench_latency_takes_the_vllm_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys,
        "bench", "latency", "--hardware", "h100_sxm", "--model", "llama-3.1-8b",
        "--batch-size", "2", "--input-len", "128", "--output-len", "33", "--json",
        "--speculative-config",
        '{"method": "eagle", "num_speculative_tokens": 2, "acceptance_rates": [1, 1]}',
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert data["config"]["speculative_config"]["method"] == "eagle"
    assert any(row["op"] == "draft_eagle" for row in data["breakdown"])


def test_a_bad_config_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(
        capsys,
        "bench", "serve", "--hardware", "h100_sxm", "--model", "llama-3.1-8b",
        "--num-prompts", "5", "--speculative-config", '{"method": "eagle"}',
    )  # fmt: skip
    assert code == 2
    assert err.count("\n") == 1 and "--speculative-config" in err


def test_the_example_scenario_runs() -> None:
    result = runner.run(Path(__file__).parents[2] / "scenarios" / "speculative_eagle.yaml")
    assert result.scenario.replicas[0].speculative is not None
    assert result.summary["completed"] == result.scenario.workload.num_prompts
    # tokens arrive in chunks of several: ITL (per chunk) above TPOT (per token)
    assert result.summary["mean_itl_ms"] > result.summary["mean_tpot_ms"]
