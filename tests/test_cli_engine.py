"""`--engine` on `llmsim op` and the engine lines of `llmsim bench latency`'s breakdown.

Expected values are worked out by hand from the engine profile's numbers (read through
`load_engine`, so that a recalibrated profile moves the expectation with it; the values as of
writing are quoted in the comments: vllm launch_eager_s 8 us, graph_launch_s 20 us, step_s
1 ms, per_seq_s 4 us, graphs up to 512 tokens; llamacpp attention_factor 0.7).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from clitools import run_cli

import simulator
from simulator.api import EngineOpCost
from simulator.costmodel.single_ops import op_json
from simulator.specs import load_engine
from simulator.units import format_seconds

GEMM = ["op", "gemm", "--hardware", "h100_sxm", "--n", "4096", "--k", "4096"]
DECODE_ATTENTION = [
    *("op", "attention", "--hardware", "h100_sxm", "--phase", "decode"),
    *("--seq-len", "4096", "--num-heads", "32", "--num-kv-heads", "8", "--head-dim", "128"),
]
PREFILL_ATTENTION = [
    *("op", "attention", "--hardware", "h100_sxm", "--phase", "prefill", "--batch-size", "1"),
    *("--seq-len", "2048", "--num-heads", "32", "--num-kv-heads", "8", "--head-dim", "128"),
]
ALLREDUCE = ["op", "allreduce", "--hardware", "h100_sxm", "--num-devices", "8"]
ENGINE_KEYS = {
    "kernel_s",
    "launch_overhead_s",
    "kernel_launches",
    "cuda_graph",
    "graph_replay_s",
    "engine",
}


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = run_cli(capsys, *args, "--json")
    assert (code, err) == (0, "")
    return json.loads(out)


# -- llmsim op --engine ---------------------------------------------------------------------------
def test_without_engine_the_op_is_the_bare_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, *GEMM, "--m", "16")
    assert not set(data) & ENGINE_KEYS


def test_eager_gemm_adds_one_launch_per_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    bare = run_json(capsys, *GEMM, "--m", "16")
    data = run_json(capsys, *GEMM, "--m", "16", "--engine", "vllm", "--enforce-eager")
    launch = load_engine("vllm").overhead.launch_eager_s  # 8 us
    assert set(data) >= ENGINE_KEYS | {"latency_s", "bound", "flops", "bytes"}
    assert data["engine"] == "vllm" and data["cuda_graph"] is False
    assert data["kernel_launches"] == 1.0
    assert data["kernel_s"] == pytest.approx(bare["latency_s"], rel=1e-12)
    assert data["launch_overhead_s"] == pytest.approx(launch, rel=1e-12)
    # 15.8 us of kernel + 8 us of launch
    assert data["latency_s"] == pytest.approx(bare["latency_s"] + launch, rel=1e-12)
    assert data["graph_replay_s"] == 0.0


def test_fp8_gemm_launches_its_activation_quantiser_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = run_json(
        capsys, *GEMM, "--m", "16", "--dtype", "fp8", "--engine", "vllm", "--enforce-eager"
    )
    assert data["kernel_launches"] == 2.0  # W8A8: quantise the activations, then the GEMM
    assert data["launch_overhead_s"] == pytest.approx(
        2 * load_engine("vllm").overhead.launch_eager_s, rel=1e-12
    )


def test_a_graphed_op_pays_no_launch_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, *GEMM, "--m", "16", "--engine", "vllm")
    assert data["cuda_graph"] is True
    assert data["launch_overhead_s"] == 0.0
    assert data["latency_s"] == data["kernel_s"]
    # the replay is reported, once per step: 20 us
    assert data["graph_replay_s"] == pytest.approx(load_engine("vllm").overhead.graph_launch_s)


def test_steps_above_the_graph_limit_run_eagerly(capsys: pytest.CaptureFixture[str]) -> None:
    limit = load_engine("vllm").cuda_graph_max_tokens  # 512 tokens
    at_limit = run_json(capsys, *GEMM, "--m", str(limit), "--engine", "vllm")
    above = run_json(capsys, *GEMM, "--m", str(limit + 1), "--engine", "vllm")
    assert at_limit["cuda_graph"] is True and above["cuda_graph"] is False
    assert above["launch_overhead_s"] == pytest.approx(load_engine("vllm").overhead.launch_eager_s)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm", "llamacpp"])
@pytest.mark.parametrize(
    "op",
    [
        [*GEMM, "--m", "1"],
        [*DECODE_ATTENTION, "--batch-size", "1"],
        [*ALLREDUCE, "--size-bytes", "8192"],
    ],
    ids=["gemm", "attention", "allreduce"],
)
def test_eager_costs_more_launch_than_graphs(
    capsys: pytest.CaptureFixture[str], engine: str, op: list[str]
) -> None:
    graphs = run_json(capsys, *op, "--engine", engine)
    eager = run_json(capsys, *op, "--engine", engine, "--enforce-eager")
    assert graphs["cuda_graph"] is True  # one token: every one of these engines captures it
    assert eager["launch_overhead_s"] > graphs["launch_overhead_s"]
    assert eager["latency_s"] > graphs["latency_s"]
    assert eager["kernel_s"] == graphs["kernel_s"]


def test_attention_takes_the_engines_attention_factor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bare = run_json(capsys, *PREFILL_ATTENTION)
    vllm = run_json(capsys, *PREFILL_ATTENTION, "--engine", "vllm")
    llamacpp = run_json(capsys, *PREFILL_ATTENTION, "--engine", "llamacpp")
    factor = load_engine("llamacpp").attention_factor  # 0.7
    assert load_engine("vllm").attention_factor == 1.0
    assert vllm["compute_s"] == pytest.approx(bare["compute_s"], rel=1e-12)
    # efficiency x 0.7: compute time / 0.7 (a 2048-token prefill is compute-bound)
    assert llamacpp["compute_s"] == pytest.approx(bare["compute_s"] / factor, rel=1e-12)
    assert llamacpp["bound"] == "compute"
    assert llamacpp["kernel_s"] > vllm["kernel_s"]


def test_allreduce_under_an_engine(capsys: pytest.CaptureFixture[str]) -> None:
    bare = run_json(capsys, *ALLREDUCE, "--size-bytes", str(1 << 20))
    eager = run_json(
        capsys, *ALLREDUCE, "--size-bytes", str(1 << 20), "--engine", "trtllm", "--enforce-eager"
    )
    assert eager["kernel_s"] == pytest.approx(bare["latency_s"], rel=1e-12)
    assert eager["launch_overhead_s"] == pytest.approx(
        load_engine("trtllm").overhead.launch_eager_s
    )


def test_api_twin_matches_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    cost = simulator.gemm_cost(hardware="h100_sxm", m=16, n=4096, k=4096, engine="sglang")
    assert isinstance(cost, EngineOpCost)
    assert run_json(capsys, *GEMM, "--m", "16", "--engine", "sglang") == op_json(cost)


def test_readable_op_line_shows_kernel_launch_and_total(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, *GEMM, "--m", "16", "--engine", "vllm", "--enforce-eager")
    assert code == 0
    text = " ".join(out.split())
    assert "under vllm (eager, 1 kernel launch)" in text
    assert f"launch {format_seconds(load_engine('vllm').overhead.launch_eager_s)}" in text


@pytest.mark.parametrize(
    "args",
    [
        [*GEMM, "--m", "16", "--engine", "vllm-9"],
        [*GEMM, "--m", "16", "--enforce-eager"],
    ],
    ids=["unknown-engine", "eager-without-engine"],
)
def test_bad_engine_flags_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "engine" in err


def test_unknown_engine_in_the_api_is_a_spec_error() -> None:
    with pytest.raises(simulator.SpecError, match="unknown engine"):
        simulator.allreduce_cost(hardware="h100_sxm", num_devices=2, size_bytes=1, engine="tgi")


# -- llmsim bench latency: the engine's lines ----------------------------------------------------
BENCH = [
    *("bench", "latency", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"),
    *("--batch-size", "8", "--input-len", "32", "--output-len", "16"),
]


def engine_lines(data: dict[str, Any], phase: str) -> dict[str, dict[str, Any]]:
    return {r["op"]: r for r in data["breakdown"] if r["phase"] == phase and r["kind"] == "engine"}


def test_bench_latency_breakdown_has_the_engine_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = run_json(capsys, *BENCH, "--engine", "vllm")
    ov = load_engine("vllm").overhead
    assert {r["engine"] for r in data["breakdown"]} == {"vllm"}
    for phase in ("prefill", "decode"):
        lines = engine_lines(data, phase)
        # 8 x 32 = 256 prompt tokens and 8 decode tokens: both steps fit the 512-token graphs
        assert set(lines) == {"cpu_step", "cpu_per_seq", "launch_graph"}
        assert lines["cpu_step"]["total_s"] == pytest.approx(ov.step_s)  # 1 ms
        assert lines["cpu_per_seq"]["count"] == 8
        assert lines["cpu_per_seq"]["total_s"] == pytest.approx(8 * ov.per_seq_s)  # 32 us
        assert lines["launch_graph"]["total_s"] == pytest.approx(ov.graph_launch_s)  # 20 us
        rows = [r for r in data["breakdown"] if r["phase"] == phase]
        assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    # one prefill step: its rows add up to TTFT
    prefill = [r for r in data["breakdown"] if r["phase"] == "prefill"]
    assert sum(r["total_s"] - r["hidden_s"] for r in prefill) == pytest.approx(data["ttft_s"])


def test_bench_latency_eager_launches_every_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    graphs = run_json(capsys, *BENCH, "--engine", "vllm")
    eager = run_json(capsys, *BENCH, "--engine", "vllm", "--enforce-eager")
    launch = engine_lines(eager, "decode")["launch_eager"]
    gpu_kernels = sum(
        r["count"] for r in eager["breakdown"] if r["phase"] == "decode" and r["kind"] != "engine"
    )
    assert launch["count"] == gpu_kernels
    assert launch["total_s"] == pytest.approx(
        gpu_kernels * load_engine("vllm").overhead.launch_eager_s
    )
    assert launch["total_s"] > engine_lines(graphs, "decode")["launch_graph"]["total_s"]
    # the launches overlap GPU work: only what exceeds it adds to the step
    gpu_s = sum(
        r["total_s"] for r in eager["breakdown"] if r["phase"] == "decode" and r["kind"] != "engine"
    )
    assert launch["hidden_s"] == pytest.approx(min(launch["total_s"], gpu_s))


def test_bench_latency_table_names_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, *BENCH, "--engine", "sglang", "--enforce-eager")
    assert code == 0
    assert "engine sglang" in out
    assert "cpu_step" in out and "launch_eager" in out


# -- an engine profile of the user's own, on a shipped base --------------------------------------
def test_own_profile_on_a_base_runs_from_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`--engine my.yaml` holding `base: vllm` and a slower step: the breakdown's CPU line is
    the file's step time, every other engine line vLLM's."""
    path = tmp_path / "slow-vllm.yaml"
    path.write_text("base: vllm\noverhead:\n  step_s: 5 ms\n", encoding="utf-8")
    data = run_json(capsys, *BENCH, "--engine", str(path))
    assert {r["engine"] for r in data["breakdown"]} == {"slow-vllm"}
    lines = engine_lines(data, "decode")
    assert lines["cpu_step"]["total_s"] == pytest.approx(5e-3)
    ov = load_engine("vllm").overhead
    assert lines["cpu_per_seq"]["total_s"] == pytest.approx(8 * ov.per_seq_s)
    assert lines["launch_graph"]["total_s"] == pytest.approx(ov.graph_launch_s)


def test_own_profile_with_an_unknown_base_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "fork.yaml"
    path.write_text("base: vllm-9\n", encoding="utf-8")
    code, out, err = run_cli(capsys, *BENCH, "--engine", str(path))
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith(f"llmsim: error: {path}: base: unknown engine")
    assert "(known: llamacpp, " in err
