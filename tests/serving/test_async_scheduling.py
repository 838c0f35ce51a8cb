"""Async scheduling (vLLM's --async-scheduling): the next step's CPU work overlaps the GPU.

A step takes max(GPU + the engine's residual, launches + CPU) instead of max(GPU, launches) +
CPU (`costmodel.step.engine_time`); engines without it refuse the flag, and the loops that
time batches themselves (DP attention, pipeline micro-batching) refuse it too.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from clitools import run_cli

from simulator.costmodel.deployment import deployment
from simulator.costmodel.step import engine_time
from simulator.errors import SpecError
from simulator.runs.latency import estimate
from simulator.runs.runner import bench_scenario, run
from simulator.specs import load_engine
from simulator.specs.engine_args import EngineArgs
from simulator.specs.workload import WorkloadSpec

MS = 1e-3


def test_engine_time_overlaps_the_cpu_work_with_the_gpu() -> None:
    eng = load_engine("vllm")
    ov = eng.overhead
    assert ov.async_residual_s is not None
    on = eng.with_async_scheduling()
    cpu = ov.step_s + ov.per_seq_s * 8  # 8 sequences; one graph replay launches the step
    args = {"kernels": 300.0, "num_tokens": 8.0, "num_seqs": 8.0}
    # GPU-bound: the CPU work hides, the residual stays
    slow = engine_time(20 * MS, engine=on, **args)
    assert float(slow) == pytest.approx(20 * MS + ov.async_residual_s)
    assert float(engine_time(20 * MS, engine=eng, **args)) == pytest.approx(20 * MS + cpu)
    # CPU-bound: launches and scheduling in series set the pace
    fast = engine_time(0.1 * MS, engine=on, **args)
    assert float(fast) == pytest.approx(ov.graph_launch_s + cpu)
    # never slower than without (the residual is below the CPU work)
    gpu = np.linspace(0.0, 30 * MS, 61)
    assert np.all(engine_time(gpu, engine=on, **args) <= engine_time(gpu, engine=eng, **args))


def test_engines_without_it_refuse_the_flag() -> None:
    with pytest.raises(SpecError) as err:
        deployment(model="llama-3.1-8b", hardware="h100_sxm", engine="vllm-0.6",
                   async_scheduling=True)  # fmt: skip
    assert err.value.field == "async_scheduling"
    assert "vllm-0.6" in err.value.reason


def _serve(**flags: object) -> dict[str, float]:
    workload = WorkloadSpec.model_validate(
        {"dataset": {"name": "random", "input_len": 256, "output_len": 64}, "num_prompts": 32}
    )
    scenario = bench_scenario(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        workload=workload,
        engine_args=EngineArgs(max_num_seqs=8, **flags),  # type: ignore[arg-type]
    )
    return run(scenario).summary


def test_small_batches_gain_the_cpu_time_of_a_step() -> None:
    # 8 sequences of Llama-3.1-8B on an H100 decode in ~7 ms of GPU time, longer than the
    # profile's ~1 ms of scheduling: with the flag each step sheds that CPU time (minus the
    # residual) and nothing else changes
    eng = load_engine("vllm").overhead
    saved_ms = (eng.step_s + 8 * eng.per_seq_s - (eng.async_residual_s or 0.0)) / MS
    sync, overlapped = _serve(), _serve(async_scheduling=True)
    assert overlapped["median_itl_ms"] == pytest.approx(sync["median_itl_ms"] - saved_ms, abs=0.05)
    assert overlapped["output_throughput"] > sync["output_throughput"]
    assert overlapped["completed"] == sync["completed"] == 32


def test_bench_latency_takes_it_too() -> None:
    base = estimate(model="llama-3.1-8b", hardware="h100_sxm", batch_size=8, output_len=32)
    on = estimate(
        model="llama-3.1-8b", hardware="h100_sxm", batch_size=8, output_len=32,
        async_scheduling=True,
    )  # fmt: skip
    assert on.tpot_s < base.tpot_s


@pytest.mark.parametrize(
    "flags, what",
    [
        (["--pipeline-parallel-size", "2", "--pipeline-micro-batching"], "pipeline"),
        (["--data-parallel-size", "2", "--enable-expert-parallel"], "DP attention"),
    ],
)
def test_loops_that_time_batches_themselves_refuse_it(
    capsys: pytest.CaptureFixture[str], flags: list[str], what: str
) -> None:
    model = "mixtral-8x7b" if "--enable-expert-parallel" in flags else "llama-3.1-8b"
    code, _, err = run_cli(
        capsys, "bench", "serve", "--model", model, "--hardware", "h100_sxm",
        "--num-prompts", "4", "--async-scheduling", *flags,
    )  # fmt: skip
    assert code == 2, err
    assert "async_scheduling" in err and what in err


def test_cli_flag_reaches_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "serve", "--model", "llama-3.1-8b", "--hardware", "h100_sxm",
            "--num-prompts", "16", "--max-num-seqs", "4", "--json"]  # fmt: skip
    sync = json.loads(run_cli(capsys, *args)[1])
    overlapped = json.loads(run_cli(capsys, *args, "--async-scheduling")[1])
    assert overlapped["median_itl_ms"] < sync["median_itl_ms"]
