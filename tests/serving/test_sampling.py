"""Sampling parameters: greedy by default; a temperature makes vLLM draw from every sampling
sequence's distribution each step (`EngineSpec.random_sample`), a top-p sort its logits
(`top_p`), a top-k alone take a top-k of them (`top_k`), all fitted to this project's timings
of vLLM's sampler (suite `sampler`); penalties make it count every sampling sequence's tokens
over the vocabulary on the GPU and pad its output tokens on the host (`EngineSpec.penalties`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clitools import run_cli

import simulator as sim
from simulator.runs.runner import bench_scenario, bench_throughput, build_group, run
from simulator.serving.steptime import StepTimer, sampler_passes
from simulator.specs import load_engine, load_hardware, load_model
from simulator.specs.engine_args import EngineArgs
from simulator.specs.workload import OFFLINE_BENCH_SAMPLING, SamplingSpec, WorkloadSpec
from simulator.workload.requests import generate_requests


@pytest.mark.parametrize(
    "spec, passes",
    [
        ({}, set()),  # greedy: vllm bench serve's default
        ({"temperature": 0.8}, {"random_sample"}),  # a draw over the whole vocabulary
        ({"temperature": 0.0, "top_p": 0.9, "top_k": 5}, set()),  # greedy ignores both
        ({"temperature": 0.8, "top_p": 0.95}, {"random_sample", "top_p"}),
        ({"temperature": 1.0, "top_k": 50}, {"random_sample", "top_k"}),  # torch.topk, no sort
        ({"temperature": 1.0, "top_k": 50, "top_p": 0.9}, {"random_sample", "top_p"}),  # sorts
        ({"temperature": 1.0, "top_k": 0}, {"random_sample"}),  # 0 or -1: off
        ({"repetition_penalty": 1.1, "logprobs": 2}, {"penalties", "logprobs"}),
    ],
)
def test_which_sampler_passes_run(spec: dict[str, float], passes: set[str]) -> None:
    sampling = SamplingSpec.model_validate(spec)
    # vLLM's own pick (fp32 cast, argmax, int32 cast) runs whatever the sampling
    assert set(sampler_passes(load_engine("vllm"), sampling)) == {"greedy_pick", *passes}
    assert sampler_passes(load_engine("sglang"), sampling) == {}  # none priced there


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


def test_top_p_adds_the_draw_and_the_sort_of_the_batch_to_every_step() -> None:
    # 256 sequences of Llama-3.1-8B (vocabulary 128256) decode together: each step draws from
    # and sorts 256 x 128256 fp32 logits, the passes' bytes at H100's streaming rate (~5 ms)
    engine = load_engine("vllm")
    assert engine.random_sample is not None and engine.top_p is not None
    greedy = _itl_ms("vllm")
    drawn = _itl_ms("vllm", temperature=0.8)
    sorted_ = _itl_ms("vllm", temperature=0.8, top_p=0.95)
    assert drawn - greedy == pytest.approx(_streamed_ms(engine.random_sample.bytes_per_logit),
                                           rel=0.1)  # fmt: skip
    assert sorted_ - drawn == pytest.approx(_streamed_ms(engine.top_p.bytes_per_logit), rel=0.05)
    top_k = _itl_ms("vllm", temperature=0.8, top_k=50)
    assert drawn < top_k < sorted_  # a top-k alone does not sort


def test_vllms_offline_benchmarks_draw_at_temperature_one() -> None:
    """`vllm bench latency` and `vllm bench throughput` sample at temperature 1.0: their
    predictions pay the draw every step; `vllm bench serve` stays greedy by default."""
    engine = load_engine("vllm")
    work = engine.random_sample
    assert work is not None and OFFLINE_BENCH_SAMPLING.samples_randomly
    greedy = engine.model_copy(update={"random_sample": None})
    shape = {"model": "llama-3.1-8b", "hardware": "h100_sxm", "batch_size": 256,
             "input_len": 128, "output_len": 64}  # fmt: skip
    extra_ms = (sim.estimate(engine=engine, **shape).tpot_s
                - sim.estimate(engine=greedy, **shape).tpot_s) * 1e3  # fmt: skip
    assert extra_ms == pytest.approx(_streamed_ms(work.bytes_per_logit, kernels=work.kernels),
                                     rel=0.1)  # fmt: skip
    result, _ = bench_throughput(model="llama-3.1-8b", hardware="h100_sxm", input_len=64,
                                 output_len=16, num_prompts=8)  # fmt: skip
    assert result.scenario.workload.sampling == OFFLINE_BENCH_SAMPLING
    assert not SamplingSpec().samples_randomly  # bench serve's default


def test_speculative_decoding_samples_every_verified_position(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With a drafter, vLLM's passes run over the logits of all k + 1 verified positions:
    bench latency's verification steps and the serving timer's both pay them."""
    engine = load_engine("vllm")
    greedy = engine.model_copy(update={"random_sample": None})
    config = {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.0}
    shape = {"model": "llama-3.1-8b", "hardware": "h100_sxm", "batch_size": 64,
             "input_len": 128, "output_len": 32, "speculative_config": config}  # fmt: skip
    extra_ms = (sim.estimate(engine=engine, **shape).tpot_s
                - sim.estimate(engine=greedy, **shape).tpot_s) * 1e3  # fmt: skip
    work = engine.random_sample
    assert work is not None
    rows = _streamed_ms(work.bytes_per_logit, seqs=64 * 4, kernels=work.kernels)
    assert extra_ms == pytest.approx(rows, rel=0.1)  # 64 sequences x 4 positions
    drafted = {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.5}
    args = ["bench", "serve", "--model", "llama-3.1-8b", "--hardware", "h100_sxm",
            "--num-prompts", "64", "--max-num-seqs", "64", "--json",
            "--speculative-config", json.dumps(drafted)]  # fmt: skip
    plain = json.loads(run_cli(capsys, *args)[1])["median_itl_ms"]
    sorted_ = json.loads(run_cli(capsys, *args, "--temperature", "0.8", "--top-p", "0.9")[1])
    assert sorted_["median_itl_ms"] > plain


def test_engines_without_the_passes_pay_nothing() -> None:
    sglang = load_engine("sglang")
    assert sglang.random_sample is None and sglang.top_p is None and sglang.top_k is None
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


def _streamed_ms(bytes_per_logit: float, *, seqs: int = 256, vocab: int = 128256,
                 kernels: int = 0) -> float:  # fmt: skip
    """Milliseconds to stream `bytes_per_logit` per sequence and vocabulary entry at H100's
    streaming rate (0.89 x 3.35 TB/s), and to start `kernels` kernels."""
    hw = load_hardware("h100_sxm")
    stream = hw.memory.bandwidth_bytes_per_s * hw.efficiency.memory.stream_fraction
    start = kernels * hw.efficiency.kernel_latency_s
    return (bytes_per_logit * seqs * vocab / stream + start) * 1e3


def test_penalties_add_their_counts_bytes_to_every_step() -> None:
    # 256 sequences x 128256 vocabulary x 87 B (the vllm profile's count tensors, masks and
    # penalised logits, fitted) = 2.9 GB a step: ~1 ms at H100's streaming rate (0.89 x 3.35
    # TB/s), plus 15 kernels. The outputs (64 tokens) are far too short for the host part to
    # show.
    pen = load_engine("vllm").penalties
    assert pen is not None and 77 <= pen.bytes_per_logit < 100  # the code's 77 B and more
    greedy, penalised = _itl_ms("vllm"), _itl_ms("vllm", repetition_penalty=1.1)
    assert penalised - greedy == pytest.approx(_streamed_ms(pen.bytes_per_logit), rel=0.1)
    assert _itl_ms("sglang", repetition_penalty=1.1) == _itl_ms("sglang")  # not priced there


def test_min_p_adds_its_pass_over_the_logits() -> None:
    # 256 sequences x 128256 vocabulary x 37 B (softmax, max, mask, masked fill; the code's
    # 34 B, fitted) = 1.2 GB a step: 0.4 ms at H100's streaming rate, plus 5 kernels
    work = load_engine("vllm").min_p
    assert work is not None and 34 <= work.bytes_per_logit < 45
    plain = _itl_ms("vllm", temperature=0.8)
    min_p = _itl_ms("vllm", temperature=0.8, min_p=0.1)
    assert min_p - plain == pytest.approx(_streamed_ms(work.bytes_per_logit), rel=0.15)
    assert _itl_ms("vllm", min_p=0.1) == _itl_ms("vllm")  # greedy: not run


def test_logprobs_add_their_pass_greedy_or_not() -> None:
    # 256 sequences x 128256 vocabulary x 64 B (log-softmax, top-k, rank count, fitted) = 2.1
    # GB a step: 0.7 ms at H100's streaming rate, plus 30 kernels
    work = load_engine("vllm").logprobs
    assert work is not None and work.bytes_per_logit > 26  # more than the code's bytes
    assert SamplingSpec.model_validate({"logprobs": 0}).returns_logprobs
    assert not SamplingSpec().returns_logprobs
    extra = _itl_ms("vllm", logprobs=5) - _itl_ms("vllm")
    expected = _streamed_ms(work.bytes_per_logit, kernels=work.kernels)
    assert extra == pytest.approx(expected, rel=0.15)


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
    assert code == 2 and "--repetition-penalty: " in err
