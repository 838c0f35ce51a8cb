"""The defaults an engine picks for itself: vLLM's batch limits by device and entrypoint
(EngineArgs.get_batch_defaults), its step budget without chunked prefill, prefix caching on by
default, no V1 watermark; and `bench serve`'s duration and saved result as vLLM writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.costmodel.deployment import deployment
from simulator.errors import SpecError
from simulator.runs import runner
from simulator.runs.latency import estimate
from simulator.serving.group import default_scheduler
from simulator.specs import load_engine
from simulator.specs.engine_args import EngineArgs
from simulator.specs.workload import WorkloadSpec
from simulator.workload.requests import RandomDataset
from tests.clitools import run_cli


def limits(hardware: str, entrypoint: str) -> tuple[int, int]:
    sched = deployment(
        model="llama-3.1-8b", hardware=hardware, entrypoint=entrypoint
    ).engine.scheduler
    return sched.max_num_seqs, sched.max_num_batched_tokens


@pytest.mark.parametrize(
    ("hardware", "server", "offline"),
    [
        ("h100_sxm", (1024, 8192), (1024, 16384)),  # >= 70 GiB, not an A100
        ("h200_sxm", (1024, 8192), (1024, 16384)),
        ("mi300x", (1024, 8192), (1024, 16384)),
        ("a100_sxm_80gb", (256, 2048), (256, 8192)),  # 80 GB, but an A100 (vLLM PR #17885)
        ("l40s", (256, 2048), (256, 8192)),  # 48 GB
        ("rtx_4090", (256, 2048), (256, 8192)),
    ],
)
def test_vllm_picks_its_batch_limits_by_device_and_entrypoint(
    hardware: str, server: tuple[int, int], offline: tuple[int, int]
) -> None:
    assert limits(hardware, "server") == server
    assert limits(hardware, "offline") == offline


@pytest.mark.parametrize(
    ("hardware", "tp", "chunk", "graphs", "fraction"),
    [
        ("rtx_4090", 1, 2048, 24, 0.847),  # 20-35 GiB
        ("rtx_4090", 4, 2048, 80, 0.827),  # tp >= 4 raises the graph batch
        ("l40s", 1, 4096, 32, 0.851),  # < 60 GiB: no 10 GiB floor
        ("l40s", 4, 4096, 160, 0.837),
        ("h100_sxm", 1, 8192, 256, 0.835),  # 13,440 MiB of 81,559 (the profile's own value)
        ("h100_sxm", 8, 8192, 512, 0.818),
        ("h200_sxm", 1, 8192, 256, 0.907),  # < 160 GiB
        ("b200", 1, 16384, 512, 0.857),
        ("mi300x", 8, 16384, 512, 0.862),
    ],
)
def test_sglang_sizes_chunks_graphs_and_static_memory_by_gpu(
    hardware: str, tp: int, chunk: int, graphs: int, fraction: float
) -> None:
    model = "llama-3.1-70b" if tp > 1 else "llama-3.1-8b"
    engine = deployment(
        model=model, hardware=hardware, engine="sglang", tensor_parallel_size=tp
    ).engine
    sched = engine.scheduler
    assert (sched.max_num_batched_tokens, engine.cuda_graph_max_tokens) == (chunk, graphs)
    assert sched.gpu_memory_utilization == fraction


def test_other_engines_keep_their_limits_everywhere() -> None:
    for engine in ("sglang-0.3", "trtllm", "vllm-0.6"):
        profile = load_engine(engine).scheduler  # memory fraction included
        for hardware in ("h100_sxm", "a100_sxm_80gb"):
            dep = deployment(model="llama-3.1-8b", hardware=hardware, engine=engine)
            got = dep.engine.scheduler
            assert (got.max_num_seqs, got.max_num_batched_tokens) == (
                profile.max_num_seqs,
                profile.max_num_batched_tokens,
            )
            assert got.gpu_memory_utilization == profile.gpu_memory_utilization
            assert dep.engine.cuda_graph_max_tokens == load_engine(engine).cuda_graph_max_tokens


def test_the_bench_commands_run_as_vllm_runs_them() -> None:
    workload = WorkloadSpec(dataset=RandomDataset(input_len=64, output_len=8), num_prompts=4)
    serve = runner.bench_scenario(model="llama-3.1-8b", hardware="h100_sxm", workload=workload)
    assert serve.replicas[0].entrypoint == "server"
    result, _ = runner.bench_throughput(
        model="llama-3.1-8b", hardware="h100_sxm", input_len=64, output_len=8, num_prompts=4
    )
    assert result.scenario.replicas[0].entrypoint == "offline"
    # bench latency (the LLM class): the offline step budget sizes the activations
    small = estimate(model="llama-3.1-8b", hardware="h100_sxm", max_num_batched_tokens=8192)
    default = estimate(model="llama-3.1-8b", hardware="h100_sxm")
    assert default.memory.activation_bytes > small.memory.activation_bytes


def test_without_chunked_prefill_a_vllm_step_holds_the_context_length() -> None:
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    context = dep.model.max_position_embeddings  # 131072
    unchunked = default_scheduler(dep.engine, max_model_len=context, chunked_prefill=False)
    assert unchunked.max_num_batched_tokens == context
    chunked = default_scheduler(dep.engine, max_model_len=context)
    assert chunked.max_num_batched_tokens == 8192
    given = default_scheduler(
        dep.engine, max_model_len=context, chunked_prefill=False, max_num_batched_tokens=4096
    )
    assert given.max_num_batched_tokens == 4096
    # so a 10k-token prompt runs unchunked, as in vLLM, unless the budget is set below it
    result = estimate(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        input_len=10_000,
        output_len=4,
        enable_chunked_prefill=False,
    )
    assert result.ttft_s > 0
    with pytest.raises(SpecError, match="max_num_batched_tokens"):
        estimate(
            model="llama-3.1-8b",
            hardware="h100_sxm",
            input_len=10_000,
            output_len=4,
            enable_chunked_prefill=False,
            max_num_batched_tokens=8192,
        )


def test_prefix_caching_and_watermark_defaults_follow_the_engine() -> None:
    workload = WorkloadSpec(dataset=RandomDataset(input_len=64, output_len=8), num_prompts=4)

    def group(**flags: object) -> object:
        return runner.bench_scenario(
            model="llama-3.1-8b",
            hardware="h100_sxm",
            workload=workload,
            engine_args=EngineArgs(**flags),  # type: ignore[arg-type]
        ).replicas[0]

    assert group().prefix_caching  # vLLM V1: on unless turned off
    assert not group(enable_prefix_caching=False).prefix_caching
    assert not group(engine="vllm-0.6").prefix_caching  # V0: off unless turned on
    assert group(engine="vllm-0.6", enable_prefix_caching=True).prefix_caching
    assert group(engine="sglang").prefix_caching  # the radix cache
    assert not group(engine="trtllm-0.6").prefix_caching
    assert default_scheduler(load_engine("vllm")).watermark == 0.0  # V1 keeps none
    assert default_scheduler(load_engine("vllm-0.6")).watermark == 0.01


def test_serve_duration_counts_from_the_start_and_inf_is_saved_as_vllm_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    workload = WorkloadSpec(
        dataset=RandomDataset(input_len=64, output_len=8), num_prompts=10, request_rate=1.0
    )
    result = runner.run(
        runner.bench_scenario(model="llama-3.1-8b", hardware="h100_sxm", workload=workload)
    )
    requests = result.sim.requests
    assert requests["arrival_s"].min() > 0  # the first request waits one gap, as in vLLM
    assert result.summary["duration"] == pytest.approx(requests["finish_s"].max())
    args = ("bench", "serve", "--hardware", "h100_sxm", "--model", "llama-3.1-8b")
    code, _, _ = run_cli(
        capsys, *args, "--num-prompts", "5", "--save-result", "--result-dir", str(tmp_path)
    )
    assert code == 0
    (saved,) = tmp_path.glob("*.json")
    data = json.loads(saved.read_text(), parse_constant=pytest.fail)  # strict JSON
    assert data["request_rate"] == "inf"


def test_engines_show_resolves_the_defaults_on_a_device(
    capsys: pytest.CaptureFixture[str],
) -> None:
    show = ("engines", "show", "vllm", "--json")
    for flags, expected in (
        ((), (256, 8192)),  # the profile's own values
        (("--hardware", "h100_sxm"), (1024, 8192)),
        (("--hardware", "h100_sxm", "--offline"), (1024, 16384)),
        (("--hardware", "a100_sxm_80gb"), (256, 2048)),
    ):
        code, out, _ = run_cli(capsys, *show, *flags)
        sched = json.loads(out)["scheduler"]
        assert code == 0 and (sched["max_num_seqs"], sched["max_num_batched_tokens"]) == expected
    code, _, err = run_cli(capsys, *show, "--offline")
    assert code == 2 and "needs --hardware" in err
