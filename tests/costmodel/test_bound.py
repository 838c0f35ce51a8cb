"""The hardware-limit bound (costmodel.bound): every simulated throughput of the same setup is
at most the bound, the share is in (0, 1], and the bound moves the right way with hardware."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator as sim
from simulator.costmodel.bound import hardware_bound
from simulator.costmodel.deployment import deployment
from simulator.runs import runner
from simulator.runs.latency import estimate
from simulator.specs.engine_args import EngineArgs
from tests.clitools import run_cli

# (model, hardware, tp): dense on one GPU, dense tensor parallel, MoE
SETUPS = [
    ("llama-3.1-8b", "h100_sxm", 1),
    ("llama-3.1-70b", "h100_sxm", 4),
    ("mixtral-8x7b", "a100_sxm_80gb", 2),
]
BOUND_KEYS = {
    "hardware_bound_tok_s",
    "hardware_bound_output_tok_s",
    "hardware_bound_resource",
    "bound_share",
}


@pytest.mark.slow
@settings(max_examples=6, deadline=None)
@given(
    setup=st.sampled_from(SETUPS),
    input_len=st.sampled_from([32, 256, 1024]),
    output_len=st.sampled_from([2, 64, 256]),
    num_prompts=st.sampled_from([8, 64]),
)
def test_no_simulated_throughput_exceeds_the_bound(
    setup: tuple[str, str, int], input_len: int, output_len: int, num_prompts: int
) -> None:
    model, hardware, tp = setup
    _, summary = runner.bench_throughput(
        model=model,
        hardware=hardware,
        input_len=input_len,
        output_len=output_len,
        num_prompts=num_prompts,
        engine_args=EngineArgs(tensor_parallel_size=tp),
    )
    assert set(summary) >= BOUND_KEYS
    assert summary["tokens_per_second"] <= summary["hardware_bound_tok_s"]
    assert 0.0 < summary["bound_share"] <= 1.0
    assert summary["hardware_bound_resource"] in {"compute", "memory", "network"}


@settings(max_examples=8, deadline=None)
@given(
    setup=st.sampled_from(SETUPS),
    batch_size=st.sampled_from([1, 8, 64]),
    input_len=st.sampled_from([64, 1024]),
    output_len=st.sampled_from([8, 128]),
)
def test_a_latency_batch_stays_under_the_bound(
    setup: tuple[str, str, int], batch_size: int, input_len: int, output_len: int
) -> None:
    model, hardware, tp = setup
    data = estimate(
        model=model,
        hardware=hardware,
        tensor_parallel_size=tp,
        batch_size=batch_size,
        input_len=input_len,
        output_len=output_len,
        num_iters=1,
    ).as_json(interval_coverage=None)
    assert 0.0 < data["bound_share"] <= 1.0  # type: ignore[operator]


def test_h200_bound_is_at_least_h100s_for_decode_heavy_work() -> None:
    bounds = {
        hw: hardware_bound(deployment(model="llama-3.1-8b", hardware=hw), prompt_len=128,
                           output_len=2048)
        for hw in ("h100_sxm", "h200_sxm")
    }  # fmt: skip
    h100, h200 = bounds["h100_sxm"], bounds["h200_sxm"]
    assert h200.tokens_per_s >= h100.tokens_per_s
    assert h200.batch > h100.batch  # more HBM: more KV room
    # the same peaks bound compute: the bandwidth and KV room are what H200 adds
    assert h200.compute_s == pytest.approx(h100.compute_s)
    assert h200.memory_s < h100.memory_s


def test_the_bound_uses_datasheet_peaks_not_efficiency_curves() -> None:
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    bound = hardware_bound(dep, prompt_len=1, output_len=1, weight_bytes=0.0, kv_capacity_tokens=1)
    flops = 2.0 * (dep.model.num_active_params - dep.model.embedding_params) + 2.0 * (
        dep.model.vocab_size * dep.model.hidden_size
    )
    flops += 4.0 * 32 * 128 * 32 * 0.5  # one prompt token attending to itself (P^2 / 2)
    assert bound.compute_s == pytest.approx(flops / dep.hardware.peak_flops("bf16"))
    assert bound.resource == "compute"


def test_a_tensor_parallel_bound_counts_the_all_reduces() -> None:
    dep = deployment(model="llama-3.1-70b", hardware="h100_sxm", tensor_parallel_size=8)
    bound = hardware_bound(dep, prompt_len=512, output_len=128)
    assert bound.network_s > 0
    single = hardware_bound(deployment(model="llama-3.1-8b", hardware="h100_sxm"),
                            prompt_len=512, output_len=128)  # fmt: skip
    assert single.network_s == 0


def test_lengths_below_one_are_refused() -> None:
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    with pytest.raises(ValueError, match="at least 1"):
        hardware_bound(dep, prompt_len=0, output_len=4)


def test_the_api_names_the_bound() -> None:
    dep = sim.deployment(model="llama-3.1-8b", hardware="h100_sxm")
    assert isinstance(sim.hardware_bound(dep, prompt_len=64, output_len=64), sim.HardwareBound)


def test_run_summary_report_and_cli_carry_the_share(tmp_path: Path) -> None:
    result = runner.run("scenarios/quickstart.yaml")
    s = result.summary
    assert set(s) >= BOUND_KEYS
    assert s["bound_share"] == pytest.approx(
        s["total_token_throughput"] / s["hardware_bound_tok_s"]
    )
    out = runner.save_run(result, tmp_path / "run")
    saved = json.loads((out / "summary.json").read_text())
    assert 0 < saved["bound_share"] <= 1
    from simulator.report.build import write_report

    html = write_report(out, tmp_path / "report.html").read_text()
    assert "share of the bound" in html and "hardware-limit bound" in html


@pytest.mark.parametrize(
    "command",
    [
        ["latency", "--batch-size", "4", "--input-len", "128", "--output-len", "16"],
        ["throughput", "--input-len", "128", "--output-len", "16", "--num-prompts", "8"],
        ["serve", "--random-input-len", "128", "--random-output-len", "16",
         "--num-prompts", "8", "--request-rate", "4"],
    ],
)  # fmt: skip
def test_bench_prints_and_writes_the_share(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    args = ["bench", *command, "--hardware", "h100_sxm", "--model", "llama-3.1-8b"]
    code, printed, err = run_cli(capsys, *args, "--output-json", str(out))
    assert code == 0, err
    assert "Hardware-limit bound:" in " ".join(printed.split())
    data = json.loads(out.read_text())
    assert set(data) >= BOUND_KEYS
    assert 0 < data["bound_share"] <= 1
