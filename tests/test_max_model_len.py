"""vLLM's --max-model-len: the longest request served, and without chunked prefill the
default step budget (max(max_model_len, the engine's default))."""

from __future__ import annotations

import numpy as np
import pytest
from clitools import run_cli

from simulator import estimate
from simulator.errors import SpecError
from simulator.runs import runner
from simulator.specs import load_model
from simulator.specs.engine_args import EngineArgs
from simulator.specs.scenario import Scenario
from simulator.specs.workload import WorkloadSpec
from simulator.workload.requests import RandomDataset, generate_requests


def scenario(input_len: int, output_len: int = 8, **flags: object) -> Scenario:
    workload = WorkloadSpec(
        dataset=RandomDataset(input_len=input_len, output_len=output_len), num_prompts=4
    )
    return runner.bench_scenario(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        workload=workload,
        engine_args=EngineArgs(**flags),  # type: ignore[arg-type]
    )


def step_budget(sc: Scenario) -> int:
    requests = generate_requests(sc.workload, rng=np.random.default_rng(0))
    group, _, _ = runner.build_group(load_model(sc.model), sc.replicas[0], requests)
    return group.scheduler.max_num_batched_tokens


def test_requests_longer_than_it_are_refused() -> None:
    with pytest.raises(SpecError) as err:
        runner.run(scenario(1000, max_model_len=512))
    assert err.value.field == "workload" and "max_model_len 512" in err.value.reason
    assert runner.run(scenario(500, max_model_len=512)).summary["completed"] == 4


def test_it_cannot_exceed_the_models_context() -> None:
    with pytest.raises(SpecError) as err:
        runner.run(scenario(100, max_model_len=200_000))
    assert err.value.field == "max_model_len"


def test_without_chunked_prefill_it_sets_the_step_budget() -> None:
    # vLLM: max(max_model_len, 8192 for the API server on an H100); default: the context length
    assert step_budget(scenario(100, enable_chunked_prefill=False)) == 131072
    unchunked = scenario(100, enable_chunked_prefill=False, max_model_len=20000)
    assert step_budget(unchunked) == 20000
    assert step_budget(scenario(100, enable_chunked_prefill=False, max_model_len=4096)) == 8192
    assert step_budget(scenario(100, max_model_len=20000)) == 8192  # chunked: the default


def test_bench_latency_checks_its_lengths(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "latency", "--model", "llama-3.1-8b", "--hardware", "h100_sxm",
            "--input-len", "1000", "--output-len", "100"]  # fmt: skip
    code, _, err = run_cli(capsys, *args, "--max-model-len", "512")
    assert code == 2 and "max_model_len" in err
    assert run_cli(capsys, *args, "--max-model-len", "2048")[0] == 0
    code, _, err = run_cli(capsys, *args, "--max-model-len", "200000")  # over the context
    assert code == 2 and "max_model_len: 200000 is longer than llama-3.1-8b's context" in err


def test_bench_latency_takes_its_step_budget_without_chunked_prefill() -> None:
    # 32 prompts of 2048 tokens: one prefill step under the context's budget, waves under 20000
    def latency(**flags: object) -> float:
        kwargs = dict(batch_size=32, input_len=2048, output_len=8, enable_chunked_prefill=False)
        return estimate(model="llama-3.1-8b", hardware="h100_sxm", **kwargs, **flags).latency_s  # type: ignore[arg-type]

    assert latency(max_model_len=20000) == latency(max_num_batched_tokens=20000)
    assert latency(max_model_len=20000) > latency()
