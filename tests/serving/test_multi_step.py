"""Multi-step scheduling (vLLM V0's --num-scheduler-steps): decode blocks of N steps per
scheduler call. A hand-computed timeline on the paper timer, properties, and the engine and
CLI checks.

The timer (`factories.FixedTimer` plus 1 ms of scheduling CPU per step): a prefill step is
10 ms + 10 us per token; a decode step 5 ms, of which a block pays the 1 ms of CPU once.
"""

from __future__ import annotations

from typing import Any

import pytest
from clitools import run_cli
from factories import MS, FixedTimer, fixed_group, make_requests, make_scheduler, times_ms
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import SpecError
from simulator.runs.runner import bench_scenario, run
from simulator.serving.cluster import SimResult, serve
from simulator.specs.engine_args import EngineArgs
from simulator.specs.scenario import Scenario
from simulator.specs.serving import SchedulerSpec
from simulator.specs.workload import WorkloadSpec
from simulator.workload.requests import RequestTable

SPEC = '{"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.6}'


class SchedulingTimer(FixedTimer):
    def cpu_s(self, num_seqs: int) -> float:
        return 1 * MS


def simulate(requests: RequestTable, scheduler: SchedulerSpec) -> SimResult:
    group = fixed_group(scheduler=scheduler, timer=SchedulingTimer())
    return serve(requests, groups=[group])


def test_an_arrival_waits_for_the_decode_block() -> None:
    # N = 4, prefill-first (vLLM V0). r0 (100-token prompt, 10 out): prefill 0-11 ms; a
    # block of 4 decodes ends at 16 (5 ms, its first step pays the CPU), 20, 24, 28 ms.
    # r1 (50 tokens, 2 out) arrives at 13 ms: one step at a time would admit it at 16 ms;
    # here it waits for the block's end, 28 ms, and prefills alone 28-38.5 ms.
    # A new block: 38.5-43.5 (both; r1's 2nd token, r1 finishes and leaves at once); the
    # block runs on with r0 alone for its 3 other steps (47.5, 51.5, 55.5, no CPU), and the
    # next block's first step (5 ms) gives r0's 10th token at 60.5 ms.
    result = simulate(
        make_requests((0.0, 100, 10), (0.013, 50, 2)),
        make_scheduler(kind="prefill_first", num_scheduler_steps=4),
    )
    df = result.requests
    assert times_ms(df, "first_token_s") == [11.0, 38.5]
    assert times_ms(df, "first_scheduled_s") == [0.0, 28.0]
    assert times_ms(df, "finish_s") == [60.5, 43.5]
    # one step at a time, r1 goes in at the end of the step in progress (16 ms)
    single = simulate(
        make_requests((0.0, 100, 10), (0.013, 50, 2)), make_scheduler(kind="prefill_first")
    )
    assert times_ms(single.requests, "first_scheduled_s") == [0.0, 16.0]


def test_vllm_060_returns_a_blocks_outputs_at_its_end() -> None:
    # The timeline above with `multi_step_stream_outputs` off (vLLM 0.6.0): r1 reaches its
    # 2nd token at 43.5 ms, the first step of its block, and rides on with r0 to the block's
    # end (47.5, 51.5, 55.5 ms: the same steps as above, two sequences each), finishing at
    # 55.5. r0 reaches its 10th token at 60.5 ms, the first step of the next block, and
    # finishes at that block's end, 72.5 ms. First tokens do not move (a prefill step is a
    # block of one).
    result = simulate(
        make_requests((0.0, 100, 10), (0.013, 50, 2)),
        make_scheduler(
            kind="prefill_first", num_scheduler_steps=4, multi_step_stream_outputs=False
        ),
    )
    df = result.requests
    assert times_ms(df, "first_token_s") == [11.0, 38.5]
    assert times_ms(df, "finish_s") == [72.5, 55.5]
    assert df["output_tokens"].tolist() == [10, 2]
    steps = result.steps
    rides = steps[(steps["start_s"] >= 0.0435 - 1e-9) & (steps["end_s"] <= 0.0555 + 1e-9)]
    assert (rides["num_seqs"] == 2).all() and (rides["decode_tokens"] == 1).all()
    # the inter-token sample counts outputs only: one gap per token after the first
    assert result.itl_weight.sum() == pytest.approx(float((df["output_tokens"] - 1).sum()))


workloads = st.lists(
    st.tuples(st.floats(0.0, 0.2, allow_nan=False), st.integers(1, 300), st.integers(1, 40)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None)
@given(
    rows=workloads,
    steps=st.sampled_from([1, 2, 4, 8, 10]),
    kind=st.sampled_from(["continuous", "prefill_first"]),
    stream=st.booleans(),
)
def test_every_request_finishes_once_with_its_tokens(
    rows: list[tuple[float, int, int]], steps: int, kind: str, stream: bool
) -> None:
    rows.sort()
    result = simulate(
        make_requests(*rows),
        make_scheduler(
            kind=kind,
            max_num_batched_tokens=512,
            num_scheduler_steps=steps,
            multi_step_stream_outputs=stream,
        ),
    )
    df = result.requests.sort_values("request_id")
    assert df["output_tokens"].tolist() == [r[2] for r in rows]
    assert (df["first_token_s"] >= df["arrival_s"]).all()
    assert (df["finish_s"] >= df["first_token_s"]).all()
    assert result.itl_weight.sum() == pytest.approx(float((df["output_tokens"] - 1).sum()))


def scenario(engine: str, steps: int, **engine_args: Any) -> Scenario:
    workload = WorkloadSpec(
        dataset={"name": "random", "input_len": 256, "output_len": 64},
        num_prompts=40,
        request_rate=8.0,
    )
    return bench_scenario(
        model="llama-3.1-8b",
        hardware="a100_sxm_80gb",
        workload=workload,
        engine_args=EngineArgs(engine=engine, num_scheduler_steps=steps, **engine_args),
        seed=0,
    )


def test_only_an_engine_with_multi_step_scheduling_takes_it() -> None:
    with pytest.raises(SpecError, match="multi-step"):
        run(scenario("vllm", 10))
    ten = run(scenario("vllm-0.6", 10))
    one = run(scenario("vllm-0.6", 1))
    # arrivals wait for the decode block: a higher median TTFT
    assert ten.summary["median_ttft_ms"] > one.summary["median_ttft_ms"]


@pytest.mark.parametrize(
    ("engine_args", "field"),
    [
        ({"speculative_config": SPEC}, "num_scheduler_steps"),
        ({"pipeline_parallel_size": 2, "pipeline_micro_batching": True}, "num_scheduler_steps"),
    ],
)
def test_multi_step_is_refused_where_it_is_not_modelled(
    engine_args: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError, match="multi-step scheduling") as exc:
        run(scenario("vllm-0.6", 4, **engine_args))
    assert exc.value.field == field
    run(scenario("vllm-0.6", 1, **engine_args))  # one step per scheduler call: allowed


def test_block_outputs_lengthen_tpot_by_a_blocks_tail() -> None:
    """Requests that finish inside a block wait for its end: TPOT rises, by less than a whole
    block's steps over the 63 gaps of a 64-token output, and every request still completes."""
    streamed = run(scenario("vllm-0.6", 10))
    held = run(scenario("vllm-0.6", 10, multi_step_stream_outputs=False))
    rise = held.summary["mean_tpot_ms"] / streamed.summary["mean_tpot_ms"] - 1
    assert 0.0 < rise < 10 / 63
    assert held.summary["completed"] == streamed.summary["completed"]


def test_the_cli_flag(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("bench", "serve", "--model", "llama-3.1-8b", "--hardware", "a100_sxm_80gb")
    load = ("--num-prompts", "20", "--random-input-len", "128", "--random-output-len", "16")
    code, _, err = run_cli(capsys, *args, *load, "--num-scheduler-steps", "8")
    assert code == 2 and "num_scheduler_steps" in err and "vllm-0.6" in err
    code, out, _ = run_cli(
        capsys, *args, *load, "--engine", "vllm-0.6", "--num-scheduler-steps", "8"
    )
    assert code == 0 and "TTFT" in out
    code, out, _ = run_cli(
        capsys,
        *args,
        *load,
        "--engine",
        "vllm-0.6",
        "--num-scheduler-steps",
        "8",
        "--no-multi-step-stream-outputs",
    )
    assert code == 0 and "TTFT" in out
