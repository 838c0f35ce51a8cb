"""Sampling parameters: greedy by default; top-p / top-k with a temperature make vLLM sort
every sampling sequence's logits each step (`EngineSpec.sampler_filter`, from vLLM's own
timings of that path); penalties make it count every sampling sequence's tokens over the
vocabulary on the GPU and pad its output tokens on the host (`EngineSpec.penalties`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clitools import run_cli

from simulator.engine_args import EngineArgs
from simulator.runner import bench_scenario, build_group, run
from simulator.serving.steptime import StepTimer
from simulator.serving.workload import SamplingSpec, WorkloadSpec, generate_requests
from simulator.specs import load_engine, load_hardware, load_model

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


@pytest.mark.parametrize(
    "spec, penalises",
    [
        ({}, False),
        ({"repetition_penalty": 1.0, "frequency_penalty": 0.0}, False),  # the neutral values
        ({"repetition_penalty": 1.1}, True),  # greedy or not: vLLM applies penalties first
        ({"frequency_penalty": 0.5}, True),
        ({"presence_penalty": -0.5}, True),
    ],
)
def test_which_sampling_penalises(spec: dict[str, float], penalises: bool) -> None:
    assert SamplingSpec.model_validate(spec).penalises is penalises


@pytest.mark.parametrize(
    "spec, filters",
    [
        ({}, False),
        ({"temperature": 0.0, "min_p": 0.1}, False),  # greedy: min-p does not run
        ({"temperature": 0.8, "min_p": 0.0}, False),
        ({"temperature": 0.8, "min_p": 0.1}, True),
    ],
)
def test_which_sampling_runs_min_p(spec: dict[str, float], filters: bool) -> None:
    assert SamplingSpec.model_validate(spec).min_p_filters is filters


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
    code, out, _ = run_cli(capsys, *args, "--temperature", "0.7", "--min-p", "0.05")
    assert code == 0
    assert json.loads(out)["median_itl_ms"] > greedy["median_itl_ms"]
    code, _, err = run_cli(capsys, *args, "--min-p", "1.5")
    assert code == 2 and "min-p" in err
    code, out, _ = run_cli(capsys, *args, "--logprobs", "5")
    assert code == 0
    assert json.loads(out)["median_itl_ms"] > greedy["median_itl_ms"]
    code, _, err = run_cli(capsys, *args, "--logprobs", "21")  # above vLLM's --max-logprobs
    assert code == 2 and "logprobs" in err


def _streamed_ms(bytes_per_logit: float, *, seqs: int = 256, vocab: int = 128256) -> float:
    """Milliseconds to stream `bytes_per_logit` per sequence and vocabulary entry at H100's
    streaming rate (0.89 x 3.35 TB/s)."""
    hw = load_hardware("h100_sxm")
    stream = hw.memory.bandwidth_bytes_per_s * hw.efficiency.memory.stream_fraction
    return bytes_per_logit * seqs * vocab / stream * 1e3


def test_penalties_add_their_counts_bytes_to_every_step() -> None:
    # 256 sequences x 128256 vocabulary x 77 B (the vllm profile's count tensors, masks and
    # penalised logits) = 2.53 GB a step: 0.85 ms at H100's streaming rate (0.89 x 3.35 TB/s),
    # plus 13 kernels. The outputs (64 tokens) are far too short for the host part to show.
    pen = load_engine("vllm").penalties
    assert pen is not None and pen.bytes_per_logit == 77
    greedy, penalised = _itl_ms("vllm"), _itl_ms("vllm", repetition_penalty=1.1)
    assert penalised - greedy == pytest.approx(_streamed_ms(77), rel=0.1)
    assert _itl_ms("sglang", repetition_penalty=1.1) == _itl_ms("sglang")  # not priced there


def test_min_p_adds_its_pass_over_the_logits() -> None:
    # 256 sequences x 128256 vocabulary x 34 B (softmax, max, mask, masked fill) = 1.12 GB a
    # step: 0.37 ms at H100's streaming rate, plus 5 kernels
    work = load_engine("vllm").min_p
    assert work is not None and work.bytes_per_logit == 34
    plain = _itl_ms("vllm", temperature=0.8)
    min_p = _itl_ms("vllm", temperature=0.8, min_p=0.1)
    assert min_p - plain == pytest.approx(_streamed_ms(34), rel=0.15)
    assert _itl_ms("vllm", min_p=0.1) == _itl_ms("vllm")  # greedy: not run


def test_logprobs_add_their_pass_greedy_or_not() -> None:
    # 256 sequences x 128256 vocabulary x 26 B (log-softmax, top-k, rank count) = 0.85 GB a
    # step: 0.29 ms at H100's streaming rate, plus 4 kernels
    work = load_engine("vllm").logprobs
    assert work is not None and work.bytes_per_logit == 26
    assert SamplingSpec.model_validate({"logprobs": 0}).returns_logprobs
    assert not SamplingSpec().returns_logprobs
    extra = _itl_ms("vllm", logprobs=5) - _itl_ms("vllm")
    assert extra == pytest.approx(_streamed_ms(26), rel=0.15)


def _penalised_timer(**args: object) -> StepTimer:
    workload = WorkloadSpec.model_validate(
        {
            "dataset": {"name": "random", "input_len": 128, "output_len": 8192},
            "num_prompts": 8,
            "sampling": {"repetition_penalty": 1.1},
        }
    )
    scenario = bench_scenario(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        workload=workload,
        engine_args=EngineArgs(max_num_seqs=64, **args),  # type: ignore[arg-type]
    )
    requests = generate_requests(workload, rng=np.random.default_rng(0))
    group, _, _ = build_group(
        load_model("llama-3.1-8b"), scenario.replicas[0], requests, sampling=workload.sampling
    )
    return group.timer


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_penalties_host_work_counts_where_it_outlasts_the_gpu(async_scheduling: bool) -> None:
    timer = _penalised_timer(async_scheduling=async_scheduling)
    assert timer.penalises
    pen = load_engine("vllm").penalties
    assert pen is not None
    contexts = [2048] * 64
    gpu = timer.mixed(chunks=[], decode_contexts=contexts)  # no output tokens: no host work
    # 64 sequences with 1000 output tokens each: 64,000 x 22.6 ns + 64 x 1000 x 0.7 ns = 1.5 ms,
    # under the GPU step (~8 ms): hidden
    hidden = timer.mixed(chunks=[], decode_contexts=contexts, outputs=(64_000, 1000))
    assert hidden == pytest.approx(gpu, rel=1e-9)
    # 1.6 M output tokens: 36 ms of padding, the step waits for it after its launches
    tokens, longest = 1_600_000, 25_000
    host = pen.host_s_per_token * tokens + pen.host_s_per_padded * 64 * longest
    slow = timer.mixed(chunks=[], decode_contexts=contexts, outputs=(tokens, longest))
    cpu = timer.cpu_s(64)
    graph = load_engine("vllm").overhead.graph_launch_s
    assert slow == pytest.approx(graph + host + cpu, rel=1e-9)
    # a decode run prices each of its steps as `mixed` does, a token more per sequence each
    run = timer.decode_run(
        num_seqs=64, total_context=64 * 2048.0, steps=3, outputs=(tokens, longest)
    )
    for i in range(3):
        one = timer.mixed(
            chunks=[],
            decode_contexts=[2048 + i] * 64,
            outputs=(tokens + 64 * i, longest + i),
        )
        assert run[i] == pytest.approx(one, rel=1e-6)


def test_bench_serve_takes_vllms_penalty_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "serve", "--model", "llama-3.1-8b", "--hardware", "h100_sxm",
            "--num-prompts", "64", "--max-num-seqs", "64", "--json"]  # fmt: skip
    plain = json.loads(run_cli(capsys, *args)[1])
    for flag, value in (("--repetition-penalty", "1.1"), ("--frequency-penalty", "0.3"),
                        ("--presence-penalty", "0.3")):  # fmt: skip
        code, out, _ = run_cli(capsys, *args, flag, value)
        assert code == 0
        assert json.loads(out)["median_itl_ms"] > plain["median_itl_ms"]
    code, _, err = run_cli(capsys, *args, "--presence-penalty", "2.5")
    assert code == 2 and "presence-penalty" in err
    code, _, err = run_cli(capsys, *args, "--repetition-penalty", "0")
    assert code == 2 and "repetition_penalty" in err
