"""The step timer's tables against the cost model they tabulate, and the recorder's compact
rows against what a run must contain."""

from __future__ import annotations

import platform

import numpy as np
import pytest
from factories import cost_model_step_s

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment, deployment
from simulator.runs import runner
from simulator.serving.replica import Chunk
from simulator.serving.steptime import SHORT_RUN_STEPS, StepTimer
from simulator.specs.engine_args import EngineArgs
from simulator.specs.workload import WorkloadSpec
from simulator.workload.requests import RandomDataset


def exact(dep: Deployment, chunks: list[Chunk], decodes: list[int]) -> float:
    window = dep.model.attention.sliding_window
    batch = BatchShape.mixed(chunks=chunks, decode_context_lens=decodes, window=window)
    return cost_model_step_s(dep, batch, num_seqs=len(chunks) + len(decodes))


@pytest.mark.parametrize(
    ("model", "hardware", "tp"),
    [
        ("llama-3.1-8b", "h100_sxm", 1),
        ("mistral-7b", "a100_sxm_80gb", 1),  # sliding window
        ("mixtral-8x7b", "h100_sxm", 2),  # MoE
        ("deepseek-v3", "h200_sxm", 8),  # MLA
    ],
)
def test_the_timer_is_within_a_percent_of_the_cost_model(
    model: str, hardware: str, tp: int
) -> None:
    dep = deployment(model=model, hardware=hardware, tensor_parallel_size=tp)
    timer = StepTimer(dep, max_num_seqs=128, max_num_batched_tokens=4096, max_context=16384)
    rng = np.random.default_rng(0)
    errors = []
    for _ in range(150):
        chunks = [
            (
                int(rng.integers(1, 1900)),
                int(rng.integers(0, 12000)) * int(rng.random() < 0.5),
                True,
            )
            for _ in range(int(rng.integers(0, 3)))
        ]
        decodes = rng.integers(1, 12000, int(rng.integers(0 if chunks else 1, 100))).tolist()
        want = exact(dep, chunks, decodes)
        errors.append(abs(timer.mixed(chunks=chunks, decode_contexts=decodes) / want - 1))
    assert max(errors) < 0.01


@pytest.mark.parametrize(
    ("model", "context"),
    [("llama-3.1-8b", 1000), ("mistral-7b", 12000)],  # the latter beyond its 4096 window
)
def test_decode_runs_match_single_steps(model: str, context: int) -> None:
    dep = deployment(model=model, hardware="h100_sxm")
    timer = StepTimer(dep, max_num_seqs=64, max_num_batched_tokens=2048, max_context=16384)
    run = timer.decode_run(num_seqs=8, total_context=8.0 * context, steps=5)
    for i, t in enumerate(run):
        step = exact(dep, [], [context + i] * 8)
        assert t == pytest.approx(step, rel=0.01)
        assert timer.mixed(chunks=[], decode_contexts=[context + i] * 8) == pytest.approx(
            step, rel=0.01
        )


@pytest.mark.parametrize("model", ["llama-3.1-8b", "mistral-7b"])
def test_short_decode_runs_give_numpys_floats(model: str) -> None:
    """Short decode runs are timed in plain Python: bit for bit np.interp on the timer's table,
    at grid points, between them, beyond both ends, and past the table's batch sizes (to a
    rounding where numpy's build fuses interp's multiply-add, as ARM compilers may)."""
    exact = platform.machine().lower() in ("x86_64", "amd64")
    dep = deployment(model=model, hardware="h100_sxm")
    timer = StepTimer(dep, max_num_seqs=64, max_num_batched_tokens=2048, max_context=16384)
    grid = timer._ctx_list
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(1, 80))
        steps = int(rng.integers(1, SHORT_RUN_STEPS + 1))
        mean = grid[int(rng.integers(len(grid)))] if rng.random() < 0.3 else rng.uniform(0, 2e4)
        context = float(max(n, round(mean * n)))
        means = (context + n * np.arange(steps, dtype=float)) / n
        want = np.interp(means, timer._ctx_grid, timer._decode[min(n, 64) - 1])
        run = timer.decode_run(num_seqs=n, total_context=context, steps=steps)
        assert run.tolist() == (want.tolist() if exact else pytest.approx(want, rel=1e-12))
    # runs that cross grid points (the step's interval is walked forward, not searched)
    for point in grid[1:]:
        n, steps = 3, SHORT_RUN_STEPS
        context = float(max(n, round((point - 7.5) * n)))
        means = (context + n * np.arange(steps, dtype=float)) / n
        want = np.interp(means, timer._ctx_grid, timer._decode[n - 1])
        run = timer.decode_run(num_seqs=n, total_context=context, steps=steps)
        assert run.tolist() == (want.tolist() if exact else pytest.approx(want, rel=1e-12))


def test_short_decode_ends_are_numpys_cumulative_sums() -> None:
    """A short decode segment's step ends, summed in Python, are bit for bit what numpy's
    cumulative sum of the same durations gives (the replica takes either); long runs are
    left to numpy."""
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    timer = StepTimer(dep, max_num_seqs=64, max_num_batched_tokens=2048, max_context=16384)
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 80))
        steps = int(rng.integers(1, SHORT_RUN_STEPS + 1))
        context = float(max(n, round(rng.uniform(0, 2e4) * n)))
        start = float(rng.uniform(0, 4000))
        run = timer.decode_run(num_seqs=n, total_context=context, steps=steps)
        ends = timer.decode_ends(start=start, num_seqs=n, total_context=context, steps=steps)
        assert ends == (start + np.cumsum(run)).tolist()
    long = SHORT_RUN_STEPS + 1
    assert timer.decode_ends(start=0.0, num_seqs=4, total_context=4e3, steps=long) is None


def test_recorded_rows_account_for_every_token() -> None:
    workload = WorkloadSpec(
        dataset=RandomDataset(input_len=300, output_len=40, range_ratio=0.5),
        num_prompts=200,
        request_rate=20.0,
    )
    scenario = runner.bench_scenario(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        workload=workload,
        engine_args=EngineArgs(data_parallel_size=2),
    )
    sim = runner.run(scenario).sim
    req, steps = sim.requests, sim.steps
    # every token after a request's first is one inter-token gap
    assert sim.itl_weight.sum() == (req["output_tokens"] - 1).sum()
    # every prompt token and every decoded token is computed in some step
    assert steps["prefill_tokens"].sum() == req["prompt_tokens"].sum()
    assert steps["decode_tokens"].sum() == (req["output_tokens"] - 1).sum()
    # a replica's steps follow one another in time
    for _, rows in steps.groupby("replica"):
        assert (rows["start_s"].to_numpy()[1:] >= rows["end_s"].to_numpy()[:-1] - 1e-12).all()
        assert (rows["end_s"] > rows["start_s"]).all()
