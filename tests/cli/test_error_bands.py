"""Error bands in what `llmsim bench latency|throughput|serve` and `llmsim run` write and print:
`K_interval`, `interval_coverage`, `interval_source` where validation data backs the hardware
and engine, `interval_note` (and a printed reason) where it does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from simulator.cli import bench, scenarios
from simulator.metrics.bands import DEFAULT_COVERAGE, load_residuals
from simulator.runs import runner
from simulator.runs.latency import estimate
from tests.clitools import run_cli

LATENCY = ("bench", "latency", "--model", "llama-3.1-8b", "--batch-size", "4")
LATENCY += ("--input-len", "128", "--output-len", "16", "--num-iters", "3")
SMALL = ("--num-prompts", "24", "--input-len", "64", "--output-len", "16")
THROUGHPUT = ("bench", "throughput", "--model", "llama-3.1-8b", *SMALL)
SERVE = ("bench", "serve", "--model", "llama-3.1-8b", "--num-prompts", "24")
SERVE += ("--random-input-len", "64", "--random-output-len", "16")
UNBACKED = ("--hardware", "rtx_4090", "--engine", "llamacpp")
NOTE = "no end-to-end validation rows for rtx_4090 under llamacpp"


def bands_of(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k.startswith("interval") or k.endswith("_interval")}


def json_of(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, err = run_cli(capsys, *args, "--json")
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def check_band(data: dict[str, Any], key: str) -> None:
    low, high = data[f"{key}_interval"]
    assert 0 < low < high, key


def test_the_unbacked_pair_of_these_tests_has_no_rows() -> None:
    assert not any(r.device == "rtx_4090" for r in load_residuals())


# -- bench latency --------------------------------------------------------------------------------
def test_bench_latency_json_has_a_band_per_figure_for_h100_under_vllm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = json_of(capsys, *LATENCY, "--hardware", "h100_sxm")
    for key in ("avg_latency", "ttft_s", "tpot_s"):
        check_band(data, key)
    assert data["interval_coverage"] == 0.8
    # TPOT offline has no rows of its own: every served decode step (serving, curves, energy)
    assert data["interval_source"] == [
        "e2e_energy",
        "e2e_latency",
        "e2e_serving",
        "e2e_serving_curve",
    ]
    assert "interval_note" not in data
    # a wider coverage gives a wider band around the same figure
    wide = json_of(capsys, *LATENCY, "--hardware", "h100_sxm", "--interval-coverage", "0.9")
    assert wide["avg_latency"] == data["avg_latency"] and wide["interval_coverage"] == 0.9
    assert wide["avg_latency_interval"][0] < data["avg_latency_interval"][0]
    assert wide["avg_latency_interval"][1] > data["avg_latency_interval"][1]


def test_bench_latency_unbacked_has_a_note_and_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = json_of(capsys, *LATENCY, *UNBACKED)
    assert bands_of(data) == {"interval_note": NOTE}
    code, out, _ = run_cli(capsys, *LATENCY, *UNBACKED)
    assert code == 0
    flat = " ".join(out.split())
    assert flat.count(f"Error bands: none ({NOTE})") == 1
    assert " at 80%" not in flat


def test_bench_latency_prints_the_band_beside_each_figure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "out.json"
    code, out, _ = run_cli(capsys, *LATENCY, "--hardware", "h100_sxm", "--output-json", str(path))
    assert code == 0
    data = json.loads(path.read_text())
    low, high = data["avg_latency_interval"]
    flat = " ".join(out.split())
    assert f"Avg latency: {data['avg_latency']:.6f} seconds [{low:.6f}, {high:.6f}] at 80%" in flat
    assert flat.count(" at 80%") == 3  # latency, TTFT, TPOT
    assert "Error bands: where 80% of the held-out validation rows" in flat


# -- bench throughput -----------------------------------------------------------------------------
def test_bench_throughput_bands_invert_for_the_rates(capsys: pytest.CaptureFixture[str]) -> None:
    data = json_of(capsys, *THROUGHPUT, "--hardware", "h100_sxm")
    rates = ("requests_per_second", "tokens_per_second", "output_tokens_per_second")
    for key in (*rates, "elapsed_time"):
        check_band(data, key)
    # one band of the time to produce the output: the rates' are its inverse
    low, high = (b / data["elapsed_time"] for b in data["elapsed_time_interval"])
    for key in rates:
        assert [b / data[key] for b in data[f"{key}_interval"]] == pytest.approx(
            [1 / high, 1 / low]
        )
    assert data["interval_source"] == ["e2e_energy", "e2e_throughput"]  # H100 under vLLM's own
    code, out, _ = run_cli(capsys, *THROUGHPUT, "--hardware", "h100_sxm")
    assert code == 0
    assert out.startswith("Throughput: ")  # vLLM's lines come first, unchanged
    assert "Error bands at 80%: [" in out and "requests/s" in out.splitlines()[3]


def test_bench_throughput_unbacked(capsys: pytest.CaptureFixture[str]) -> None:
    data = json_of(capsys, *THROUGHPUT, *UNBACKED)
    assert bands_of(data) == {"interval_note": NOTE}


# -- bench serve and run --------------------------------------------------------------------------
SERVE_LATENCIES = [
    f"{s}_{m}_ms" for s in ("mean", "median", "p90", "p99") for m in ("ttft", "tpot", "itl", "e2el")
]
SERVE_RATES = ("request_throughput", "output_throughput", "total_token_throughput")


def test_bench_serve_bands_latencies_and_the_rates_of_an_all_at_once_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = json_of(capsys, *SERVE, "--hardware", "h100_sxm")  # request rate inf: all at t=0
    for key in (*SERVE_LATENCIES, *SERVE_RATES):
        check_band(data, key)
    assert "std_ttft_ms_interval" not in data and "duration_interval" not in data
    assert data["interval_coverage"] == 0.8
    assert set(data["interval_source"]) == {
        "e2e_energy",
        "e2e_serving",
        "e2e_serving_curve",
        "e2e_throughput",
    }
    # at a request rate, the arrivals set the throughputs below the knee: no band, and why
    paced = json_of(capsys, *SERVE, "--hardware", "h100_sxm", "--request-rate", "4")
    for key in SERVE_LATENCIES:
        check_band(paced, key)
    assert not any(f"{key}_interval" in paced for key in SERVE_RATES)
    assert any("throughputs" in c for c in paced["interval_caveats"])


def test_bench_serve_prints_bands_beside_vllms_figures(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run_cli(
        capsys, *SERVE, "--hardware", "h100_sxm", "--save-result", "--result-dir", str(tmp_path)
    )
    assert code == 0
    (saved,) = tmp_path.glob("*.json")
    data = json.loads(saved.read_text())  # --save-result carries the bands too
    low, high = data["mean_ttft_ms_interval"]
    line = next(x for x in out.splitlines() if x.startswith("Mean TTFT (ms):"))
    assert line == "{:<40} {:<10.2f}".format("Mean TTFT (ms):", data["mean_ttft_ms"]) + (
        f"  [{low:.2f}, {high:.2f}] at 80%"
    )
    assert "Error bands: where 80%" in out


def test_bench_serve_unbacked(capsys: pytest.CaptureFixture[str]) -> None:
    data = json_of(capsys, *SERVE, *UNBACKED)
    assert bands_of(data) == {"interval_note": NOTE}
    code, out, _ = run_cli(capsys, *SERVE, *UNBACKED)
    assert code == 0 and out.count(f"Error bands: none ({NOTE})") == 1
    assert " at 80%" not in out


def test_run_writes_the_bands_and_keeps_every_other_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: s\nmodel: llama-3.1-8b\nreplicas: [{hardware: h100_sxm, engine: vllm}]\n"
        "workload: {dataset: {name: random, input_len: 64, output_len: 16}, num_prompts: 20,"
        " request_rate: 4}\n"
    )
    code, _, _ = run_cli(capsys, "run", str(scenario), "--out", str(tmp_path / "out"))
    assert code == 0
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    for key in SERVE_LATENCIES:
        check_band(saved, key)
    result = runner.run(scenario)
    plain = result.as_json(interval_coverage=None)
    assert not bands_of(plain)
    assert {k: v for k, v in result.as_json().items() if k in plain} == plain
    assert bands_of(result.as_json()) == result.intervals()


def test_a_disaggregated_run_is_not_backed(tmp_path: Path) -> None:
    scenario = tmp_path / "d.yaml"
    scenario.write_text(
        "name: d\nmodel: llama-3.1-8b\nreplicas:\n"
        "  - {hardware: h100_sxm, role: prefill}\n  - {hardware: h100_sxm, role: decode}\n"
        "kv_transfer: {kind: auto}\n"
        "workload: {dataset: {name: random, input_len: 64, output_len: 8}, num_prompts: 10,"
        " request_rate: 4}\n"
    )
    result = runner.run(scenario)
    assert result.intervals() == {
        "interval_note": "no end-to-end validation rows for disaggregated serving"
    }


# -- Python API -----------------------------------------------------------------------------------
def test_the_api_results_carry_the_same_bands() -> None:
    result = estimate(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        batch_size=2,
        input_len=64,
        output_len=8,
        num_iters=2,
    )
    bands = result.intervals(coverage=0.5)
    assert bands["interval_coverage"] == 0.5
    assert set(bands) >= {"avg_latency_interval", "ttft_s_interval", "tpot_s_interval"}
    assert bands_of(result.as_json(interval_coverage=0.5)) == bands
    assert not bands_of(result.as_json(interval_coverage=None))


def test_the_cli_default_coverage_is_the_bands_default() -> None:
    commands = (bench.bench_latency_cmd, bench.bench_throughput_cmd, bench.bench_serve_cmd)
    for command in (*commands, scenarios.run_cmd):
        hints = get_type_hints(command, include_extras=True)
        assert "interval_coverage" in hints
    assert DEFAULT_COVERAGE == 0.8  # the flags' default, written out in simulator/cli
