"""Sampling parameters: greedy by default; top-p / top-k with a temperature make vLLM sort
every sampling sequence's logits each step (`EngineSpec.sampler_filter`, from vLLM's own
timings of that path)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clitools import run_cli

from simulator.engine_args import EngineArgs
from simulator.runner import bench_scenario, run
from simulator.serving.workload import SamplingSpec, WorkloadSpec
from simulator.specs import load_engine, load_hardware

H100_BW = 3.35e12


def test_filter_reproduces_the_timings_it_was_written_from() -> None:
    f = load_engine("vllm").sampler_filter
    assert f is not None
    vocab = 131072.0
    got = f.time_s(np.array([128, 256, 512]) * vocab, bandwidth=H100_BW)
    # vLLM PR #40376: 2.318 ms (128) and 6.150 ms (512); PR #32558: 3.812 ms (256)
    np.testing.assert_allclose(got, [2.318e-3, 3.812e-3, 6.150e-3], rtol=0.01)
    assert float(f.time_s(np.array([0.0]), bandwidth=H100_BW)[0]) == 0.0
    # memory-bound: twice the bandwidth, half the time
    half = f.time_s(np.array([512 * vocab]), bandwidth=2 * H100_BW)
    assert float(half[0]) == pytest.approx(6.150e-3 / 2, rel=0.01)


@pytest.mark.parametrize(
    "spec, filters",
    [
        ({}, False),  # greedy: vllm bench serve's default
        ({"temperature": 0.8}, False),  # random sampling over the whole vocabulary
        ({"temperature": 0.0, "top_p": 0.9}, False),  # greedy ignores top-p
        ({"temperature": 0.8, "top_p": 0.95}, True),
        ({"temperature": 1.0, "top_k": 50}, True),
        ({"temperature": 1.0, "top_k": 0}, False),  # 0 or -1: off
    ],
)
def test_which_sampling_filters(spec: dict[str, float], filters: bool) -> None:
    assert SamplingSpec.model_validate(spec).filters is filters


def _itl_ms(engine: str, **sampling: float) -> float:
    workload = WorkloadSpec.model_validate(
        {
            "dataset": {"name": "random", "input_len": 128, "output_len": 64},
            "num_prompts": 256,
            "sampling": sampling,
        }
    )
    scenario = bench_scenario(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        workload=workload,
        engine_args=EngineArgs(engine=engine, max_num_seqs=256),
    )
    return float(run(scenario).summary["median_itl_ms"])


def test_top_p_adds_the_sort_of_the_batch_to_every_step() -> None:
    # 256 sequences of Llama-3.1-8B (vocabulary 128256) decode together: each step sorts
    # 256 x 128256 logits, the filter's time at that size (~3.7 ms on an H100)
    f = load_engine("vllm").sampler_filter
    assert f is not None
    bandwidth = load_hardware("h100_sxm").memory.bandwidth_bytes_per_s
    sort_ms = float(f.time_s(np.array([256 * 128256.0]), bandwidth=bandwidth)[0]) * 1e3
    greedy, top_p = _itl_ms("vllm"), _itl_ms("vllm", temperature=0.8, top_p=0.95)
    assert top_p - greedy == pytest.approx(sort_ms, rel=0.05)


def test_engines_without_the_sort_pay_nothing() -> None:
    assert load_engine("sglang").sampler_filter is None
    assert _itl_ms("sglang", temperature=0.8, top_p=0.95) == _itl_ms("sglang")


def test_bench_serve_takes_vllms_sampling_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "serve", "--model", "llama-3.1-8b", "--hardware", "h100_sxm",
            "--num-prompts", "64", "--max-num-seqs", "64", "--json"]  # fmt: skip
    greedy = json.loads(run_cli(capsys, *args)[1])
    code, out, _ = run_cli(capsys, *args, "--temperature", "0.7", "--top-p", "0.9")
    assert code == 0
    assert json.loads(out)["median_itl_ms"] > greedy["median_itl_ms"]
    code, _, err = run_cli(capsys, *args, "--top-p", "1.5")
    assert code == 2 and "top-p" in err
