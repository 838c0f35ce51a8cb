"""`llmsim bench` takes a `vllm bench` command line as it is: the percentile flags, ShareGPT's
output length, the client's flags (accepted, no effect), the ramp-up flags, and prints vLLM's
lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.clitools import run_cli

SERVE = ("bench", "serve", "--hardware", "h100_sxm", "--model", "llama-3.1-8b")


def test_metric_percentiles_add_keys_and_percentile_metrics_pick_sections(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = (*SERVE, "--num-prompts", "40", "--request-rate", "4")
    code, out, _ = run_cli(capsys, *args, "--metric-percentiles", "95,99.9", "--json")
    assert code == 0
    summary = json.loads(out)
    for metric in ("ttft", "tpot", "itl", "e2el"):  # vLLM's names, beside p90 and p99
        assert {f"p{q}_{metric}_ms" for q in ("90", "95", "99", "99.9")} <= summary.keys()
    assert summary["p90_ttft_ms"] <= summary["p95_ttft_ms"] <= summary["p99_ttft_ms"]
    code, out, _ = run_cli(capsys, *args, "--percentile-metrics", "ttft,e2el")
    assert code == 0
    assert "Mean TTFT (ms):" in out and "Mean E2EL (ms):" in out
    assert "Mean TPOT (ms):" not in out and "Mean ITL (ms):" not in out
    for bad in (("--metric-percentiles", "101"), ("--percentile-metrics", "ttft,foo")):
        code, _, err = run_cli(capsys, *args, *bad)
        assert code == 2 and len(err.strip().splitlines()) == 1


def test_the_rate_and_concurrency_lines_and_sharegpt_output_len(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(
        capsys, *SERVE, "--num-prompts", "20", "--request-rate", "4", "--max-concurrency", "8"
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[3].startswith("Maximum request concurrency:") and lines[3].split()[-1] == "8"
    assert lines[4].startswith("Request rate configured (RPS):") and "4.00" in lines[4]
    code, out, _ = run_cli(capsys, *SERVE, "--num-prompts", "20")  # rate inf: neither line
    assert "Request rate configured" not in out and "Maximum request concurrency" not in out
    sharegpt = ("--dataset-name", "sharegpt", "--num-prompts", "20", "--json")
    full = ("--sharegpt-output-len", "100", "--ignore-eos")  # no request stops at EOS
    code, out, _ = run_cli(capsys, *SERVE, *sharegpt, *full)
    assert code == 0 and json.loads(out)["total_output_tokens"] == 20 * 100
    code, _, err = run_cli(capsys, *SERVE, "--sharegpt-output-len", "100")
    assert code == 2 and "sharegpt_output_len" in err


def test_vllm_client_flags_are_accepted_with_a_note_and_typos_are_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = (*SERVE, "--num-prompts", "10", "--json")
    _, plain, _ = run_cli(capsys, *base)
    client = ("--backend", "vllm", "--endpoint=/v1/completions", "--ignore-eos", "--port", "8000")
    code, out, err = run_cli(capsys, *base, *client)
    assert code == 0 and json.loads(out) == json.loads(plain)
    # --ignore-eos is bench serve's own option, a no-op with random prompts (vLLM sets it)
    assert err.count("\n") == 1 and "--backend, --endpoint, --port" in err
    for bad in (("--num-promts", "10"), ("--backend",), ("stray",)):
        code, _, err = run_cli(capsys, *base, *bad)
        assert code == 2 and len(err.strip().splitlines()) == 1
    more = ("--served-model-name", "m", "--request-id-prefix", "x-", "--append-result", "--profile")
    code, out, err = run_cli(capsys, *base, *more)
    assert code == 0 and json.loads(out) == json.loads(plain) and "--served-model-name" in err
    latency = ("bench", "latency", "--hardware", "h100_sxm", "--model", "llama-3.1-8b")
    code, _, err = run_cli(capsys, *latency, "--num-iters-warmup", "5", "--num-iters", "3")
    assert code == 0 and "--num-iters-warmup" in err


def test_throughput_prints_the_token_totals(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("bench", "throughput", "--hardware", "h100_sxm", "--model", "llama-3.1-8b")
    code, out, _ = run_cli(
        capsys, *args, "--num-prompts", "20", "--input-len", "300", "--output-len", "40"
    )
    assert code == 0
    assert out.splitlines()[1:3] == [
        "Total num prompt tokens:  6000",
        "Total num output tokens:  800",
    ]
    assert all(
        line.startswith(("Error bands", "Hardware-limit bound")) for line in out.splitlines()[3:]
    )


def test_serve_reports_vllms_peak_output_token_throughput(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = (*SERVE, "--num-prompts", "60", "--request-rate", "6")
    code, out, _ = run_cli(capsys, *args, "--json")
    summary = json.loads(out)
    # at least the mean rate over the run, at most every token of the run in one second
    assert summary["output_throughput"] <= summary["max_output_tokens_per_s"]
    assert summary["max_output_tokens_per_s"] <= summary["total_output_tokens"]
    _, text, _ = run_cli(capsys, *args)
    assert "Peak output token throughput (tok/s):" in text
    spec = '{"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.7}'
    code, out, _ = run_cli(capsys, *args, "--speculative-config", spec, "--json")
    assert code == 0 and "max_output_tokens_per_s" not in json.loads(out)  # steps lack it


def test_ramp_up_flags_run_save_vllms_keys_and_refuse_what_vllm_refuses(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    base = (*SERVE, "--num-prompts", "200")
    ramp = ("--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "20")
    code, out, _ = run_cli(capsys, *base, *ramp, "--json")
    assert code == 0
    slow = json.loads(run_cli(capsys, *base, "--request-rate", "1", "--json")[1])
    fast = json.loads(run_cli(capsys, *base, "--request-rate", "20", "--json")[1])
    assert fast["duration"] < json.loads(out)["duration"] < slow["duration"]
    code, _, _ = run_cli(capsys, *base, *ramp, "--save-result", "--result-dir", str(tmp_path))
    (saved,) = tmp_path.glob("vllm-ramp-up-linear-1qps-20qps-llama-3.1-8b-*.json")
    got = json.loads(saved.read_text())
    assert (got["ramp_up_strategy"], got["ramp_up_start_rps"], got["ramp_up_end_rps"]) == (
        "linear", 1, 20,
    )  # fmt: skip
    assert got["request_rate"] == "inf"
    for bad in (
        ("--ramp-up-strategy", "linear"),  # no rates
        (*ramp, "--request-rate", "5"),
        ("--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "0", "--ramp-up-end-rps", "4"),
        ("--ramp-up-strategy", "linear", "--ramp-up-start-rps", "9", "--ramp-up-end-rps", "4"),
    ):
        code, _, err = run_cli(capsys, *base, *bad)
        assert code == 2 and len(err.strip().splitlines()) == 1, bad
