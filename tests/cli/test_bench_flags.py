"""The bench commands pass their engine flags on through one `EngineArgs`, built from the
parsed values by parameter name (`simulator.cli.bench_flags.engine_args`): every field must be
a flag of `bench throughput` and `bench serve`, with the field's default, and a flag's value
must arrive in the scenario."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import typer
from clitools import one_line_error, run_cli

from simulator.cli import app, main
from simulator.runs import runner
from simulator.specs.engine_args import EngineArgs
from simulator.specs.scenario import Scenario
from simulator.specs.workload import WorkloadSpec
from simulator.workload.requests import RandomDataset

FIELDS = [field.name for field in dataclasses.fields(EngineArgs)]
SPEC = '{"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.6}'
BENCH = ["--hardware", "h100_sxm", "--model", "llama-3.1-8b"]
# Every engine flag away from its default, in three sets: the simulator does not model KV
# offloading or async scheduling with DP attention or pipeline micro-batching, and multi-step
# scheduling is vLLM V0's. (The workload is too small to matter.)
FLAGS = [
    *("--engine", "vllm", "-tp", "2", "-pp", "2", "-dp", "3", "--dtype", "bfloat16"),
    *("--quantization", "fp8", "--kv-cache-dtype", "fp8", "--enforce-eager"),
    *("--max-model-len", "4096"),
    *("--gpu-memory-utilization", "0.8", "--max-num-seqs", "16"),
    *("--max-num-batched-tokens", "1024", "--no-enable-chunked-prefill"),
    *("--scheduling-policy", "priority", "--preemption-mode", "swap", "--swap-space", "8"),
    *("--speculative-config", SPEC, "--cpu-offload-gb", "1"),
    *("--offload-config", '{"transfer": "sync"}'),
    *("--enable-expert-parallel", "--pipeline-micro-batching", "--overlap-tp-comm"),
]
EXPECTED = EngineArgs(
    engine="vllm",
    tensor_parallel_size=2,
    pipeline_parallel_size=2,
    data_parallel_size=3,
    dtype="bfloat16",
    quantization="fp8",
    kv_cache_dtype="fp8",
    enforce_eager=True,
    max_model_len=4096,
    gpu_memory_utilization=0.8,
    max_num_seqs=16,
    max_num_batched_tokens=1024,
    enable_chunked_prefill=False,
    scheduling_policy="priority",
    preemption_mode="swap",
    swap_space=8.0,
    speculative_config=SPEC,
    cpu_offload_gb=1.0,
    offload_config='{"transfer": "sync"}',
    enable_expert_parallel=True,
    pipeline_micro_batching=True,
    overlap_tp_comm=True,
)
KV_FLAGS = [
    *("--enable-prefix-caching", "--kv-offloading-size", "2", "--kv-offloading-backend", "lmcache"),
    "--async-scheduling",  # not with DP attention or micro-batching, which time their own steps
]
KV_EXPECTED = EngineArgs(
    enable_prefix_caching=True,
    kv_offloading_size=2.0,
    kv_offloading_backend="lmcache",
    async_scheduling=True,
)
MULTI_STEP_FLAGS = ["--engine", "vllm-0.6", "--num-scheduler-steps", "4"]  # V0 only
MULTI_STEP_FLAGS += ["--host-cpu", "epyc-9654", "--no-multi-step-stream-outputs"]
MULTI_STEP_EXPECTED = EngineArgs(
    engine="vllm-0.6",
    num_scheduler_steps=4,
    host_cpu="epyc-9654",
    multi_step_stream_outputs=False,
)
BUDGET_FLAGS = ["--kv-budget", "512", "--kv-eviction", "h2o"]  # turns prefix caching off
BUDGET_FLAGS += ["-cp", "2", "--nano-batches", "2"]
BUDGET_EXPECTED = EngineArgs(
    kv_budget=512, kv_eviction="h2o", context_parallel_size=2, nano_batches=2
)
LORA_FLAGS = ["--enable-lora", "--max-loras", "4", "--max-lora-rank", "32", "--max-cpu-loras", "8"]
LORA_EXPECTED = EngineArgs(enable_lora=True, max_loras=4, max_lora_rank=32, max_cpu_loras=8)
# ShadowKV's and SwiftKV's fields are mappings, each made of several flags
SPARSE_FLAGS = ["--shadowkv", "--shadowkv-budget", "1024", "--shadowkv-chunk", "16"]
SPARSE_FLAGS += ["--swiftkv-layers", "0.5", "--acrosskv", "2"]
SPARSE_EXPECTED = EngineArgs(
    shadowkv={"budget": 1024, "chunk": 16}, swiftkv={"skip_fraction": 0.5, "across": 2}
)
PD_FLAGS = ["--pd-partition", "static:0.6"]  # intra-GPU P/D partitioning (Nexus)
PD_EXPECTED = EngineArgs(pd_partition="static:0.6")
POOL_FLAGS = ["-dp", "2", "--kv-pool", "distributed"]  # Infinite-LLM's pooled KV
POOL_EXPECTED = EngineArgs(data_parallel_size=2, kv_pool="distributed")
MAPPED = {
    "shadowkv": ("shadowkv_on", "shadowkv_rank", "shadowkv_budget", "shadowkv_chunk"),
    "swiftkv": ("swiftkv_layers", "acrosskv"),
}
CASES = [
    (FLAGS, EXPECTED),
    (LORA_FLAGS, LORA_EXPECTED),
    (KV_FLAGS, KV_EXPECTED),
    (MULTI_STEP_FLAGS, MULTI_STEP_EXPECTED),
    (BUDGET_FLAGS, BUDGET_EXPECTED),
    (SPARSE_FLAGS, SPARSE_EXPECTED),
    (PD_FLAGS, PD_EXPECTED),
    (POOL_FLAGS, POOL_EXPECTED),
]


class Captured(Exception):  # carries a value out of the command
    def __init__(self, value: Any) -> None:
        self.value = value


def bench_params(name: str) -> dict[str, Any]:
    """The parsed parameters of `llmsim bench NAME`, by name."""
    group: Any = typer.main.get_command(app)
    return {p.name: p for p in group.commands["bench"].commands[name].params}


@pytest.mark.parametrize("command", ["throughput", "serve"])
def test_every_engine_arg_is_a_flag_with_its_default(command: str) -> None:
    params = bench_params(command)
    for field in dataclasses.fields(EngineArgs):
        if field.name in MAPPED:  # off (None) unless their flags are given
            assert field.default is None and set(MAPPED[field.name]) <= set(params)
            assert all(params[name].default in (None, False) for name in MAPPED[field.name])
            continue
        assert field.name in params, f"bench {command} has no flag for {field.name}"
        default = params[field.name].default
        assert getattr(default, "value", default) == field.default, field.name


def test_the_cases_set_every_field_away_from_its_default() -> None:
    changed = {
        f for _, args in CASES for f in FIELDS if getattr(args, f) != getattr(EngineArgs(), f)
    }
    assert set(FIELDS) == changed


@pytest.mark.parametrize(("flags", "expected"), CASES)
def test_bench_serve_passes_every_engine_flag_on(
    monkeypatch: pytest.MonkeyPatch, flags: list[str], expected: EngineArgs
) -> None:
    def capture(scenario: Scenario, **_: Any) -> None:
        raise Captured(scenario)

    monkeypatch.setattr(runner, "run", capture)
    with pytest.raises(Captured) as got:
        main(["bench", "serve", *BENCH, "--num-prompts", "4", "--random-input-len", "64", *flags])
    workload = WorkloadSpec(dataset=RandomDataset(input_len=64, output_len=128), num_prompts=4)
    scenario = runner.bench_scenario(
        model="llama-3.1-8b", hardware="h100_sxm", workload=workload, engine_args=expected
    )
    assert got.value.value == scenario


@pytest.mark.parametrize(("flags", "expected"), CASES)
def test_bench_throughput_passes_every_engine_flag_on(
    monkeypatch: pytest.MonkeyPatch, flags: list[str], expected: EngineArgs
) -> None:
    def capture(**kwargs: Any) -> None:
        raise Captured(kwargs)

    monkeypatch.setattr(runner, "bench_throughput", capture)
    with pytest.raises(Captured) as got:
        main(["bench", "throughput", *BENCH, "--num-prompts", "4", "--seed", "5", *flags])
    assert got.value.value["engine_args"] == expected
    assert got.value.value["seed"] == 5


@pytest.mark.parametrize(
    ("command", "flags", "named"),
    [
        ("serve", ("-dp", "0"), "--data-parallel-size"),
        ("serve", ("-tp", "0"), "--tensor-parallel-size"),
        ("serve", ("--max-num-seqs", "0"), "--max-num-seqs"),
        ("serve", ("--random-input-len", "0"), "--random-input-len"),
        ("serve", ("--repetition-penalty", "0"), "--repetition-penalty"),
        ("serve", ("--random-range-ratio", "2"), "--random-range-ratio"),
        ("throughput", ("--input-len", "0"), "--input-len"),
        ("throughput", ("--num-prompts", "0"), "--num-prompts"),
    ],
)
def test_a_bad_flag_value_is_named_by_its_flag(
    capsys: pytest.CaptureFixture[str], command: str, flags: tuple[str, ...], named: str
) -> None:
    # the scenario the flags make names its fields (replicas.0.count); the user typed flags
    args = ["bench", command, "--hardware", "h100_sxm", "--model", "llama-3.1-8b"]
    code, out, err = run_cli(capsys, *args, "--num-prompts", "4", *flags)
    assert (code, out, err.count("\n")) == (2, "", 1)
    assert err.startswith(f"llmsim: error: {named}: "), err


def test_kv_budget_flags_run_and_bad_values_are_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["bench", "throughput", *BENCH, "--num-prompts", "8", "--input-len", "2048"]
    code, out, _ = run_cli(capsys, *args, "--output-len", "64", "--kv-budget", "256")
    assert code == 0 and "Throughput:" in out
    code, out, _ = run_cli(capsys, *args, "--kv-cache-dtype", "int2")
    assert code == 0 and "Throughput:" in out
    assert "kv_cache_dtype" in one_line_error(capsys, *args, "--kv-cache-dtype", "int3")
    assert "--kv-eviction" in one_line_error(
        capsys, *args, "--kv-budget", "64", "--kv-eviction", "lru"
    )
    code, out, _ = run_cli(capsys, *args, "--kv-budget", "64", "--enable-prefix-caching")
    assert code == 0 and "Throughput:" in out  # a budget under prefix caching
    code, out, _ = run_cli(
        capsys, *args, "--kv-budget", "64", "--enable-prefix-caching", "--kv-offloading-size", "8"
    )
    assert code == 0 and "Throughput:" in out  # a budget with KV offload tiers
