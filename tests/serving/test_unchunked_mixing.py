"""Whole prompts beside running decodes with chunked prefill off (`unchunked_mixed`).

vLLM V1 and TensorRT-LLM's in-flight batching schedule the running decodes first and then
admit whole waiting prompts into the same step while they fit the token budget left; vLLM V0
and SGLang run a step of prompts first and decode only in steps without one. The engine
profile says which (`SchedulerDefaults.unchunked_mixed`) and `default_scheduler` follows it.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pandas as pd
import pytest
from clitools import run_cli
from factories import fixed_group, make_requests

from simulator.errors import SpecError
from simulator.runs import runner
from simulator.serving.cluster import serve
from simulator.serving.group import default_scheduler
from simulator.serving.kv_cache import BlockManager
from simulator.serving.request import Request
from simulator.serving.scheduler import schedule
from simulator.specs import load_engine
from simulator.specs.engine_args import EngineArgs
from simulator.specs.loader import validate
from simulator.specs.serving import SchedulerSpec
from simulator.specs.workload import WorkloadSpec

MIXING = ["vllm", "vllm-0.8", "vllm-0.9", "trtllm"]  # V1 scheduler, in-flight batching
PREFILL_FIRST = ["vllm-0.2", "vllm-0.6", "vllm-0.7", "sglang", "sglang-0.3", "sglang-0.4"]


def unchunked(engine: str, budget: int = 2048) -> SchedulerSpec:
    return default_scheduler(
        load_engine(engine), chunked_prefill=False, max_num_batched_tokens=budget
    )


def one_step(spec: SchedulerSpec, prompt_len: int) -> list[tuple[int, int]]:
    """A request decoding (prompt 100, 5 tokens sampled, the last not yet computed) and one
    waiting with `prompt_len` tokens: the next step's (request id, tokens) pairs."""
    kv = BlockManager(num_blocks=1000, block_size=16, watermark=0.0)
    decoding = Request(id=0, arrival_s=0.0, prompt_len=100, output_len=50)
    assert kv.allocate(decoding, 104)
    decoding.num_computed, decoding.num_output = 104, 5
    waiting = deque([Request(id=1, arrival_s=0.01, prompt_len=prompt_len, output_len=50)])
    plan = schedule(spec, running=[decoding], waiting=waiting, kv=kv)
    return [(req.id, n) for req, n in plan.entries]


@pytest.mark.parametrize("engine", MIXING)
def test_a_prompt_that_fits_shares_the_step_with_the_decodes(engine: str) -> None:
    spec = unchunked(engine)
    assert (spec.kind, spec.chunked_prefill) == ("continuous", False)
    assert one_step(spec, 2000) == [(0, 1), (1, 2000)]  # the decode first, then the prompt
    # one token over the budget the decode left: it waits, whole, for a later step
    assert one_step(spec, 2048) == [(0, 1)]


@pytest.mark.parametrize("engine", PREFILL_FIRST)
def test_prefill_first_engines_keep_prompts_and_decodes_apart(engine: str) -> None:
    spec = unchunked(engine)
    assert (spec.kind, spec.chunked_prefill) == ("prefill_first", False)
    assert one_step(spec, 2000) == [(1, 2000)]  # the decode waits for a step without prompts


def test_default_scheduler_follows_the_profile_field() -> None:
    vllm = load_engine("vllm")
    assert vllm.scheduler.unchunked_mixed
    off = vllm.model_copy(
        update={"scheduler": vllm.scheduler.model_copy(update={"unchunked_mixed": False})}
    )
    assert default_scheduler(vllm, chunked_prefill=False).kind == "continuous"
    assert default_scheduler(off, chunked_prefill=False).kind == "prefill_first"
    # with chunking on, `mixed_prefill` decides, as before
    assert default_scheduler(off).kind == "continuous"
    assert default_scheduler(load_engine("sglang")).kind == "prefill_first"
    # trtllm's chunked prefill is off by default: mixed steps without asking
    assert default_scheduler(load_engine("trtllm")).kind == "continuous"
    # trtllm-0.6 (static session batches, closed batch manager) does not take trtllm's value
    assert not load_engine("trtllm-0.6").scheduler.unchunked_mixed


def test_an_explicit_kind_still_wins() -> None:
    vllm, v0 = load_engine("vllm"), load_engine("vllm-0.6")
    assert default_scheduler(vllm, chunked_prefill=False, kind="prefill_first").kind == (
        "prefill_first"
    )
    assert default_scheduler(v0, chunked_prefill=False, kind="continuous").kind == "continuous"
    spec = unchunked("vllm").model_copy(update={"kind": "prefill_first"})
    assert one_step(spec, 2000) == [(1, 2000)]


@pytest.mark.parametrize("kind", ["continuous", "prefill_first"])
def test_without_chunking_a_step_must_hold_the_longest_request(kind: str) -> None:
    """Either way a prompt goes in whole and a preempted request re-prefills in one step, so a
    request longer than the budget exits 2 (SpecError) rather than waiting forever."""
    spec = SchedulerSpec(
        kind=kind, max_num_seqs=8, max_num_batched_tokens=1024, chunked_prefill=False
    )
    with pytest.raises(SpecError, match="longest request"):
        serve(make_requests((0.0, 1000, 100)), groups=[fixed_group(scheduler=spec)])
    result = serve(make_requests((0.0, 900, 100)), groups=[fixed_group(scheduler=spec)])
    assert len(result.requests) == 1


def test_on_paper_a_prompt_joins_the_running_decodes() -> None:
    """FixedTimer: a step with prompt tokens 10 ms + 10 us per token, decode-only 5 ms.
    r0 (100 tokens, 4 out) prefills 0-11 ms; r1 (100 tokens) arrives at 12 ms, during r0's
    first decode (11-16). Mixing: 16-27 ms holds r0's 3rd token and r1's prompt, then decodes
    at 32 and 37 ms finish r0. Prefill-first: r1 prefills alone 16-27 ms, r0 waits: its 3rd
    token comes at 32 ms, its last at 37 ms, a step later than beside r1."""
    requests = make_requests((0.0, 100, 4), (0.012, 100, 2))
    times = {}
    for kind in ("continuous", "prefill_first"):
        spec = SchedulerSpec(
            kind=kind, max_num_seqs=8, max_num_batched_tokens=2048, chunked_prefill=False
        )
        df = serve(requests, groups=[fixed_group(scheduler=spec)]).requests
        times[kind] = df.sort_values("request_id")[["first_token_s", "finish_s"]] * 1e3
    mixed, apart = times["continuous"], times["prefill_first"]
    assert mixed["first_token_s"].round(6).tolist() == [11.0, 27.0]
    assert mixed["finish_s"].round(6).tolist() == [32.0, 32.0]
    assert apart["first_token_s"].round(6).tolist() == [11.0, 27.0]
    assert apart["finish_s"].round(6).tolist() == [37.0, 32.0]


def steady_run(engine: str, *, rate: float, budget: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """300 fixed-length requests (1024 in, 128 out) at a constant `rate` on Llama-3.1-8B, one
    H100, chunked prefill off: the requests and steps frames."""
    workload = validate(
        WorkloadSpec,
        {
            "dataset": {"name": "random", "input_len": 1024, "output_len": 128},
            "num_prompts": 300,
            "request_rate": rate,
            "arrival": "constant",
        },
        source="test",
    )
    scenario = runner.bench_scenario(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        workload=workload,
        engine_args=EngineArgs(
            engine=engine, enable_chunked_prefill=False, max_num_batched_tokens=budget
        ),
    )
    sim = runner.run(scenario).sim
    return sim.requests.sort_values("request_id"), sim.steps


@pytest.mark.parametrize(("engine", "mixes"), [("vllm", True), ("vllm-0.6", False)])
def test_fixed_length_requests_do_not_march_in_waves_under_v1(engine: str, mixes: bool) -> None:
    """At 40 requests/s with 2048 tokens a step, V0 runs prompt steps of two arrivals and
    stalls every decode meanwhile: later requests get their first tokens in pairs, at the same
    step times. V1 admits each arrival beside the decodes: one first token per step."""
    requests, steps = steady_run(engine, rate=40, budget=2048)
    later = requests.iloc[100:]  # past the start-up
    distinct = later["first_token_s"].round(9).nunique()
    both = (steps["prefill_tokens"] > 0) & (steps["decode_tokens"] > 0)
    if mixes:
        assert distinct == len(later)
        assert both.sum() >= len(requests) - 1  # all but the first prompt join decodes
    else:
        assert distinct <= 0.6 * len(later)
        assert not both.any()


def test_cli_runs_a_profile_that_turns_mixing_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's engine file on `base: vllm` with `unchunked_mixed: false`: its run keeps
    prompts and decodes apart; the shipped vllm mixes them (steps.csv of `llmsim run`)."""
    (tmp_path / "v1-apart.yaml").write_text(
        "base: vllm\nscheduler:\n  unchunked_mixed: false\n", encoding="utf-8"
    )
    mixed_steps = {}
    for engine in ("vllm", str(tmp_path / "v1-apart.yaml")):
        scenario = tmp_path / "s.yaml"
        scenario.write_text(
            "name: knee\nmodel: llama-3.1-8b\n"
            f"replicas:\n  - hardware: h100_sxm\n    engine: {engine}\n"
            "    scheduler: {chunked_prefill: false}\n"
            "workload:\n  dataset: {name: random, input_len: 512, output_len: 32}\n"
            "  num_prompts: 40\n  request_rate: 20\n  arrival: constant\n",
            encoding="utf-8",
        )
        out = tmp_path / Path(engine).stem
        code, _, err = run_cli(capsys, "run", str(scenario), "--out", str(out))
        assert code == 0, err
        steps = pd.read_csv(out / "steps.csv")
        mixed_steps[engine] = int(((steps.prefill_tokens > 0) & (steps.decode_tokens > 0)).sum())
    assert mixed_steps["vllm"] > 0
    assert mixed_steps[str(tmp_path / "v1-apart.yaml")] == 0
