"""Scheduling one batch ahead (SGLang's overlap scheduler, `SchedulerSpec.schedule_ahead`,
serving/replica.py): a request that arrives during a step joins the batch after the next one,
so its first token comes one step later than with the batch formed at the step's end; profiles
of releases that run the overlap loop set it, and no other profile moves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from simulator.runs import runner
from simulator.specs import load_engine
from simulator.specs.loader import validate
from simulator.specs.scenario import Scenario
from tests.factories import scenario_data


@pytest.mark.parametrize(
    ("engine", "ahead"),
    [("sglang", True), ("sglang-0.4", True), ("sglang-0.3", False), ("vllm", False)],
)
def test_the_profiles_of_overlap_loops_schedule_ahead(engine: str, ahead: bool) -> None:
    assert load_engine(engine).scheduler.schedule_ahead is ahead


def _trace_run(tmp_path: Path, *, ahead: bool) -> runner.RunResult:
    # one long request decoding alone; a second arrives half a second in, mid-step
    trace = tmp_path / "two.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,512,400\n0.5003,256,8\n")
    group: dict[str, Any] = {
        "hardware": "h100_sxm",
        "engine": "sglang-0.4",
        "scheduler": {"schedule_ahead": ahead},
    }
    data = {
        "name": "two",
        "model": "llama-3.1-8b",
        "replicas": [group],
        "workload": {
            "dataset": {"name": "trace", "path": str(trace)},
            "num_prompts": 2,
            "arrival": "trace",
        },
    }
    return runner.run(validate(Scenario, data, source="t"))


def test_an_arrival_mid_step_waits_one_step_more(tmp_path: Path) -> None:
    off, on = _trace_run(tmp_path, ahead=False), _trace_run(tmp_path, ahead=True)
    ttft_off = off.sim.requests.eval("first_token_s - arrival_s").to_numpy()
    ttft_on = on.sim.requests.eval("first_token_s - arrival_s").to_numpy()
    assert ttft_on[0] == ttft_off[0]  # it arrived at an idle engine
    steps = off.sim.steps
    lone = steps[(steps["num_seqs"] == 1) & (steps["end_s"] < 0.5)]
    one_step = float((lone["end_s"] - lone["start_s"]).median())
    # the arrival's batch was formed while the step in progress ran: one decode step more
    assert ttft_on[1] - ttft_off[1] == pytest.approx(one_step, rel=0.05)


def _summary(engine: str, ahead: bool | None, **workload: int) -> dict[str, Any]:
    """A run at 4 requests/s on one H100 with `engine`, its scheduling ahead as the profile
    says (None) or set."""
    group: dict[str, Any] = {"hardware": "h100_sxm", "engine": engine}
    if ahead is not None:
        group["scheduler"] = {"schedule_ahead": ahead}
    data = scenario_data(request_rate=4.0, group=group, seed=0, **workload)  # type: ignore[arg-type]
    return runner.run(validate(Scenario, data, source="t")).summary


def test_at_low_load_the_first_token_comes_about_a_step_later() -> None:
    workload = {"num_prompts": 120, "input_len": 1000, "output_len": 200}
    default, off = (_summary("sglang-0.4", ahead, **workload) for ahead in (None, False))
    step = off["mean_itl_ms"]
    assert 0.5 * step < default["mean_ttft_ms"] - off["mean_ttft_ms"] < 1.5 * step
    assert default["mean_itl_ms"] == pytest.approx(step, rel=0.01)


def test_a_profile_that_forms_its_batch_at_the_step_end_does_not_move() -> None:
    workload = {"num_prompts": 60, "input_len": 500, "output_len": 100}
    assert _summary("vllm", None, **workload) == _summary("vllm", False, **workload)


def test_vllm_async_scheduling_schedules_ahead() -> None:
    engine = load_engine("vllm")
    assert not engine.scheduler.schedule_ahead
    assert engine.with_async_scheduling().scheduler.schedule_ahead
