"""The `llmsim` command line: the contract's commands and JSON keys, and bad input of every kind
exiting 2 with exactly one line on stderr and no traceback.

Most tests call `simulator.cli.main` in-process (fast); a few run `python -m simulator` end to
end to check the entry point, the exit status and the real stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from clitools import run_cli

import simulator
from simulator.costmodel.single_ops import op_json
from simulator.runs import latency, runner
from simulator.specs.loader import MODELS_DIR

ROOT = Path(__file__).resolve().parents[1]

REPO = Path(__file__).resolve().parents[1]
HARDWARE_DIR = REPO / "hardware_specs"
OP_KEYS = {"latency_s", "bound", "flops", "bytes"}


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = run_cli(capsys, *args)
    assert (code, err) == (0, "")
    return json.loads(out)


def run_subprocess(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "simulator", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )


def assert_one_error_line(err: str) -> None:
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("llmsim: error: ")
    assert err.strip() != "llmsim: error:"


# -- hardware / models ----------------------------------------------------------------------------
def test_hardware_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "hardware", "list")
    assert code == 0
    for hw in ("h100_sxm", "mi300x", "rtx_4090"):
        assert hw in out
    ids = [row["id"] for row in run_json(capsys, "hardware", "list", "--json")]
    assert ids == simulator.list_hardware()


def test_hardware_show_json(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "hardware", "show", "h100_sxm", "--json")
    assert data["id"] == "h100_sxm"
    assert data["peak_flops_per_s"]["bf16"] == 989.4e12
    assert data["peak_flops_per_s"]["fp8"] == 1978.9e12
    assert data["memory_capacity_bytes"] == 81559 * 1024**2
    assert data["memory_bandwidth_bytes_per_s"] == 3.35e12
    assert data["power"]["parked_w"] == 125.0


def test_hardware_show_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "hardware", "show", "h100_sxm")
    assert code == 0
    assert "H100" in out
    assert "TFLOP/s" in out
    assert "70 W idle, 125 W parked between steps" in out


def test_hardware_show_says_where_the_efficiency_factors_come_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    h200 = run_json(capsys, "hardware", "show", "h200_sxm", "--json")["provenance"]
    assert h200["attention_from"] == "h100_sxm" and h200["base"] is None
    assert h200["collective_from"] == "h100_sxm"
    # its calibration fits both anew (aiconfigurator's H200 tables): H100's are the prior
    assert h200["calibrated_over"] == ["attention_from", "collective_from"]
    assert (
        run_json(capsys, "hardware", "show", "gh200", "--json")["provenance"]["calibrated_over"]
        == []
    )
    assert h200["calibration"].endswith("calibration/h200_sxm.yaml")
    assert h200["file"].endswith("hardware_specs/h200_sxm.yaml")
    b200 = run_json(capsys, "hardware", "show", "b200", "--json")["provenance"]
    assert b200["calibration"].endswith("calibration/b200.yaml")  # its GEMMs alone
    _, text, _ = run_cli(capsys, "hardware", "show", "h200_sxm")
    line = " ".join(text.split("efficiency:")[1].split())
    assert "fitted factors from" in line and "attention from h100_sxm" in line
    assert "collectives from h100_sxm (the prior: the calibration fits its own)" in line
    assert "GEMM libraries cublas-13.1" in line
    mi300x = run_json(capsys, "hardware", "show", "mi300x", "--json")["provenance"]
    assert mi300x["calibration"] is None
    _, text, _ = run_cli(capsys, "hardware", "show", "mi300x")
    assert "as the spec writes them" in text


def test_models_show_json(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "models", "show", "llama-3.1-8b", "--json")
    assert data["id"] == "llama-3.1-8b"
    assert data["num_params"] == 8_030_261_248
    assert data["num_active_params"] == data["num_params"]
    assert data["kv_bytes_per_token"] == 131_072  # 2 x 8 x 128 x 32 layers x 2 B
    assert data["hidden_size"] == 4096
    assert data["attention"]["num_kv_heads"] == 8


def test_models_show_json_of_a_moe_model(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "models", "show", "mixtral-8x7b", "--json")
    assert data["num_active_params"] < data["num_params"]


def test_models_show_accepts_a_config_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "config.json"
    path.write_text((MODELS_DIR / "llama-2-7b.json").read_text(encoding="utf-8"), encoding="utf-8")
    data = run_json(capsys, "models", "show", str(path), "--json")
    assert data["num_params"] == simulator.load_model("llama-2-7b").num_params


def test_models_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "models", "list")
    assert code == 0
    assert "deepseek-v3" in out


# -- op -------------------------------------------------------------------------------------------
OP_COMMANDS: dict[str, tuple[list[str], Callable[[], object]]] = {
    "gemm": (
        ["op", "gemm", "--hardware", "h100_sxm", "--m", "4096", "--n", "4096", "--k", "4096"],
        lambda: simulator.gemm_cost(hardware="h100_sxm", m=4096, n=4096, k=4096),
    ),
    "attention": (
        [
            "op",
            "attention",
            "--hardware",
            "h100_sxm",
            "--phase",
            "decode",
            "--batch-size",
            "8",
            "--seq-len",
            "4096",
            "--num-heads",
            "32",
            "--num-kv-heads",
            "8",
            "--head-dim",
            "128",
        ],
        lambda: simulator.attention_cost(
            hardware="h100_sxm",
            phase="decode",
            batch_size=8,
            seq_len=4096,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
        ),
    ),
    "allreduce": (
        [
            *("op", "allreduce", "--hardware", "h100_sxm"),
            *("--num-devices", "8", "--size-bytes", str(16 * 1024**2)),
        ],
        lambda: simulator.allreduce_cost(
            hardware="h100_sxm", num_devices=8, size_bytes=16 * 1024**2
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(OP_COMMANDS))
def test_op_json_has_the_contract_keys(capsys: pytest.CaptureFixture[str], name: str) -> None:
    args, api_call = OP_COMMANDS[name]
    data = run_json(capsys, *args, "--json")
    assert set(data) >= OP_KEYS
    assert data["bound"] in ("compute", "memory", "latency", "network")
    assert data == op_json(api_call())


@pytest.mark.parametrize("name", sorted(OP_COMMANDS))
def test_op_prints_a_readable_line(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, out, _ = run_cli(capsys, *OP_COMMANDS[name][0])
    assert code == 0
    assert "latency" in out
    assert "-bound" in out


# -- bench latency --------------------------------------------------------------------------------
QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
LATENCY = ["bench", "latency", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"]


def test_bench_latency_output_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "latency.json"
    args = ["--batch-size", "4", "--input-len", "256", "--output-len", "16", "--num-iters", "3"]
    code, out, err = run_cli(capsys, *LATENCY, *args, "--output-json", str(path))
    assert (code, err) == (0, "")
    assert "Avg latency" in out  # the readable summary still prints
    data = json.loads(path.read_text(encoding="utf-8"))
    assert {"avg_latency", "latencies", "percentiles", "ttft_s", "tpot_s"} <= set(data)
    expected = simulator.estimate(
        model="llama-3.1-8b", hardware="h100_sxm", batch_size=4, input_len=256, output_len=16
    )
    assert data["avg_latency"] == pytest.approx(expected.latency_s, rel=1e-12)
    assert data["ttft_s"] == pytest.approx(expected.ttft_s, rel=1e-12)
    assert data["tpot_s"] == pytest.approx(expected.tpot_s, rel=1e-12)
    assert data["latencies"] == [data["avg_latency"]] * 3
    assert data["percentiles"]["50"] == pytest.approx(data["avg_latency"])


def test_bench_latency_flags_reach_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    base = run_json(capsys, *LATENCY, "--output-len", "8", "--json")
    eager = run_json(capsys, *LATENCY, "--output-len", "8", "--enforce-eager", "--json")
    tp2 = run_json(capsys, *LATENCY, "--output-len", "8", "-tp", "2", "--json")
    fp8 = run_json(capsys, *LATENCY, "--output-len", "8", "-q", "fp8", "--json")
    assert eager["config"]["enforce_eager"] is True
    assert tp2["config"]["tp"] == 2
    assert fp8["config"]["precision"]["weights"] == "fp8"
    assert tp2["tpot_s"] < base["tpot_s"]
    assert fp8["tpot_s"] < base["tpot_s"]


def test_bench_latency_memory_fraction_means_what_the_engine_says(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--gpu-memory-utilization is SGLang's --mem-fraction-static under --engine sglang: the
    static pool holds weights and KV, so the activations do not come out of the KV cache."""
    args = [*LATENCY, "--output-len", "8", "--gpu-memory-utilization", "0.85"]
    vllm = run_json(capsys, *args, "--json")["memory"]
    sglang = run_json(capsys, *args, "--engine", "sglang", "--json")["memory"]
    assert (vllm["kv_budget"], sglang["kv_budget"]) == ("total", "static")
    static = 0.85 * sglang["capacity_bytes"] - sglang["weights_bytes"] - sglang["reserve_bytes"]
    assert sglang["kv_cache_bytes"] == pytest.approx(static)
    assert vllm["kv_cache_bytes"] == pytest.approx(
        0.85 * vllm["capacity_bytes"]
        - vllm["weights_bytes"]
        - vllm["reserve_bytes"]
        - vllm["activation_bytes"]
    )
    code, out, err = run_cli(capsys, *args, "--engine", "sglang")
    assert (code, err) == (0, "")
    assert "static pool of" in out


# -- bad input: exit 2, one line, no traceback ----------------------------------------------------


def _broken_yaml(tmp_path: Path) -> str:
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\nvendor: nvidia\n", encoding="utf-8")
    return str(path)


def _yaml_with_unknown_field(tmp_path: Path) -> str:
    path = tmp_path / "typo.yaml"
    spec = (HARDWARE_DIR / "h100_sxm.yaml").read_text(encoding="utf-8")
    path.write_text(spec + "\nbogus_field: 1\n", encoding="utf-8")
    return str(path)


def _host_bandwidth(tmp_path: Path, value: str) -> str:
    """h100_sxm.yaml with its host memory bandwidth written as `value`."""
    path = tmp_path / "host.yaml"
    spec = (HARDWARE_DIR / "h100_sxm.yaml").read_text(encoding="utf-8")
    path.write_text(
        spec.replace("memory_bw_bytes_per_s: 77 GB/s", f"memory_bw_bytes_per_s: {value}")
    )
    return str(path)


def _infinite_transfer(tmp_path: Path) -> str:
    path = tmp_path / "disagg.yaml"
    text = (QUICKSTART.parent / "disagg_h100.yaml").read_text(encoding="utf-8")
    path.write_text(text.replace("layerwise: true", "layerwise: true, latency_s: .inf"))
    return str(path)


def _llama_config(tmp_path: Path, *, drop: str = "", **changes: object) -> str:
    """llama-2-7b's config.json with key `drop` removed and `changes` applied, as a file."""
    cfg = json.loads((MODELS_DIR / "llama-2-7b.json").read_text(encoding="utf-8"))
    cfg.pop(drop, None)
    cfg.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return str(path)


GEMM = ["op", "gemm", "--m", "64", "--n", "64", "--k", "64"]
# case -> (argv built from tmp_path, a fragment the error line must contain)
_PARKED_BELOW_IDLE = "base: h100_sxm\npower: {parked_w: 50 W}\n"


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _write_bytes(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


BAD_INPUTS: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "hardware-yaml-not-utf8": (
        lambda p: ["hardware", "show", _write_bytes(p / "hw.yaml", b"name: x\n\xff\xfe\n")],
        "hw.yaml: not UTF-8 text (byte 0xff at offset 8)",
    ),
    "config-not-utf8": (
        lambda p: ["models", "show", _write_bytes(p / "config.json", b'{"a": "\xff"}')],
        "config.json: not UTF-8 text",
    ),
    "scenario-duplicate-key": (
        lambda p: [
            "run",
            _write(p / "s.yaml", "name: s\nmodel: llama-3.1-8b\nmodel: mistral-7b\n"),
        ],
        "s.yaml: line 3: malformed YAML: duplicate key 'model'",
    ),
    "nested-duplicate-key": (
        lambda p: ["run", _write(p / "s.yaml", "workload:\n  seed: 1\n  seed: 2\n")],
        "s.yaml: line 3: malformed YAML: duplicate key 'seed'",
    ),
    "unknown-hardware-id": (lambda p: ["hardware", "show", "h999"], "h999"),
    "unknown-hardware-in-op": (lambda p: [*GEMM, "--hardware", "tpu_v9"], "unknown hardware id"),
    "unknown-model-id": (
        lambda p: ["bench", "latency", "--hardware", "h100_sxm", "--model", "llama-9-1t"],
        "llama-9-1t",
    ),
    "unknown-model-in-show": (lambda p: ["models", "show", "gpt-17"], "unknown model id"),
    "empty-model": (lambda p: ["models", "show", ""], "unknown model id"),  # not ./config.json
    "parked-below-idle": (
        lambda p: ["hardware", "show", _write(p / "parked.yaml", _PARKED_BELOW_IDLE)],
        "parked.yaml: power: parked_w (50 W) must be at least idle_w (70 W)",
    ),
    "malformed-hardware-yaml": (
        lambda p: [*GEMM, "--hardware", _broken_yaml(p)],
        "broken.yaml",
    ),
    "hardware-yaml-unknown-field": (
        lambda p: ["hardware", "show", _yaml_with_unknown_field(p)],
        "bogus_field",
    ),
    "nan-flag": (
        lambda p: ["bench", "serve", *LATENCY[2:], "--request-rate", "nan"],
        "request_rate: must be a number, not NaN",
    ),
    "list-for-a-quantity": (  # an AttributeError traceback before
        lambda p: ["hardware", "show", _host_bandwidth(p, "[1, 2]")],
        "host.memory_bw_bytes_per_s: expected a number or a quantity string, got [1, 2]",
    ),
    "nan-in-yaml": (
        lambda p: ["hardware", "show", _host_bandwidth(p, ".nan")],
        "host: memory_bw_bytes_per_s: must be a number, not NaN",
    ),
    "infinite-kv-transfer-latency": (  # an OverflowError in the summary before
        lambda p: ["run", _infinite_transfer(p)],
        "kv_transfer.latency_s: Input should be a finite number",
    ),
    "tp-not-dividing-heads": (lambda p: [*LATENCY, "-tp", "3"], "tensor_parallel_size"),
    "negative-input-len": (lambda p: [*LATENCY, "--input-len", "-5"], "--input-len"),
    "zero-batch-size": (lambda p: [*LATENCY, "--batch-size", "0"], "--batch-size"),
    "does-not-fit": (
        lambda p: ["bench", "latency", "--hardware", "rtx_4090", "--model", "llama-3.1-405b"],
        "does not fit",
    ),
    "batch-too-large-for-kv": (
        lambda p: [*LATENCY, "--batch-size", "4096", "--input-len", "4096"],
        "--batch-size",
    ),
    "prompt-over-token-budget": (
        lambda p: [
            *LATENCY,
            *("--input-len", "9000", "--no-enable-chunked-prefill"),
            *("--max-num-batched-tokens", "8192"),
        ],
        "max_num_batched_tokens",
    ),
    "gpu-memory-utilization": (
        lambda p: [*LATENCY, "--gpu-memory-utilization", "1.5"],
        "gpu_memory_utilization",
    ),
    "fp8-gemm-on-a100": (
        lambda p: [*GEMM, "--hardware", "a100_sxm_80gb", "--dtype", "fp8"],
        "fp8",
    ),
    "unknown-flag": (lambda p: ["hardware", "list", "--bogus"], "--bogus"),
    "missing-required-option": (
        lambda p: ["op", "gemm", "--hardware", "h100_sxm", "--m", "1", "--n", "1"],
        "--k",
    ),
    "bad-option-value": (lambda p: [*LATENCY, "--batch-size", "many"], "--batch-size"),
    "bad-choice": (lambda p: [*GEMM, "--hardware", "h100_sxm", "--dtype", "fp6"], "fp6"),
    "unknown-command": (lambda p: ["hardware", "delete"], "delete"),
    "config-missing-heads": (
        lambda p: ["models", "show", _llama_config(p, drop="num_attention_heads")],
        "num_attention_heads",
    ),
    "config-missing-heads-in-bench": (
        lambda p: [
            "bench",
            "latency",
            "--hardware",
            "h100_sxm",
            "--model",
            _llama_config(p, drop="num_attention_heads"),
        ],
        "num_attention_heads",
    ),
    "missing-config-file": (
        lambda p: ["models", "show", str(p / "nowhere" / "config.json")],
        "no such file",
    ),
    "data-parallel-in-latency": (lambda p: [*LATENCY, "-dp", "2"], "data_parallel_size"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str
) -> None:
    build, fragment = BAD_INPUTS[case]
    code, out, err = run_cli(capsys, *build(tmp_path))
    assert code == 2
    assert_one_error_line(err)
    assert fragment in err
    assert out == ""


# -- bad input that once escaped as a traceback or was accepted -----------------------------------
def test_config_with_a_non_integer_size_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _llama_config(tmp_path, intermediate_size="big")
    code, _, err = run_cli(capsys, "models", "show", path)
    assert code == 2
    assert_one_error_line(err)
    assert "intermediate_size" in err


def test_config_with_a_malformed_quantization_config_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _llama_config(tmp_path, quantization_config="awq")
    code, _, err = run_cli(capsys, "models", "show", path)
    assert code == 2
    assert_one_error_line(err)


@pytest.mark.parametrize(
    "args",
    [
        [*LATENCY, "--output-len", "4", "--output-json", "{blocked}/latency.json"],
        ["run", str(QUICKSTART), "--out", "{blocked}/run"],
    ],
    ids=["output-json", "run-out"],
)
def test_unwritable_output_path_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str]
) -> None:
    blocked = tmp_path / "a-file"  # a file where a folder is needed
    blocked.write_text("")
    code, _, err = run_cli(capsys, *(a.format(blocked=blocked) for a in args))
    assert code == 2
    assert_one_error_line(err)
    assert str(blocked) in err


@pytest.mark.parametrize("command", ["run", "plan", "sweep"])
def test_out_naming_a_file_exits_2_before_running(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    # the check comes first: nothing is simulated for results that could not be written
    def no_run(*_: object, **__: object) -> None:
        raise AssertionError("ran")

    monkeypatch.setattr(runner, "run", no_run)
    target = tmp_path / "results"
    target.write_text("kept")
    file = {"run": QUICKSTART, "plan": "plan_chat.yaml", "sweep": "sweep_rate.yaml"}[command]
    code, out, err = run_cli(capsys, command, str(QUICKSTART.parent / file), "--out", str(target))
    assert (code, out) == (2, "")
    assert_one_error_line(err)
    assert f"{target}: is a file; give a folder to write into" in err
    assert target.read_text() == "kept"


def test_zero_num_iters_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, *LATENCY, "--output-len", "4", "--num-iters", "0")
    assert code == 2
    assert_one_error_line(err)


def test_negative_max_num_seqs_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, *LATENCY, "--output-len", "4", "--max-num-seqs", "-1")
    assert code == 2
    assert_one_error_line(err)


# -- end to end through `python -m simulator` -----------------------------------------------------
def test_help_exits_0() -> None:
    proc = run_subprocess("--help")
    assert proc.returncode == 0
    assert "bench" in proc.stdout
    assert proc.stderr == ""


def test_hardware_show_json_end_to_end() -> None:
    proc = run_subprocess("hardware", "show", "h100_sxm", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert {"peak_flops_per_s", "memory_capacity_bytes", "memory_bandwidth_bytes_per_s"} <= set(
        data
    )


def test_op_gemm_json_end_to_end() -> None:
    proc = run_subprocess(*GEMM, "--hardware", "h100_sxm", "--json")
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)) >= OP_KEYS


def test_op_gemm_prices_block_scaled_fp8_apart() -> None:
    # H100, m = 4, 7168 x 2048: aiconfigurator times vLLM's per-tensor fp8 layer at 17.8 us and
    # its 128 x 128 block-scaled one at 31.1 us; the calibrated factors say about the same
    args = ("op", "gemm", "--hardware", "h100_sxm", "--m", "4", "--n", "7168", "--k", "2048")
    plain, blocked = (
        json.loads(run_subprocess(*args, "--dtype", "fp8", *extra, "--json").stdout)
        for extra in ((), ("--block-scaled",))
    )
    assert plain["latency_s"] == pytest.approx(17.8e-6, rel=0.15)
    assert blocked["latency_s"] == pytest.approx(31.1e-6, rel=0.15)
    assert blocked["bytes"] == plain["bytes"] and blocked["flops"] == plain["flops"]
    bad = run_subprocess(*args, "--block-scaled")  # bf16 has no block scales
    assert bad.returncode == 2 and "block" in bad.stderr
    assert_one_error_line(bad.stderr)


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "latency", "--hardware", "h100_sxm", "--model", "llama-9-1t"],
        ["bench", "latency", "--hardware", "rtx_4090", "--model", "llama-3.1-405b"],
        ["op", "gemm", "--hardware", "h100_sxm", "--m", "1"],
    ],
    ids=["unknown-model", "does-not-fit", "missing-option"],
)
def test_bad_input_end_to_end(args: list[str]) -> None:
    proc = run_subprocess(*args)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr)
    assert proc.stdout == ""


def test_running_out_of_memory_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 5e9 prompts ask numpy for 37 GiB: say so in a line, not a traceback
    def too_big(**_: object) -> None:
        raise MemoryError("Unable to allocate 37.3 GiB for an array")

    monkeypatch.setattr(latency, "estimate", too_big)  # the CLI reads it there
    code, out, err = run_cli(capsys, *LATENCY)
    assert (code, out) == (2, "")
    assert_one_error_line(err)
    assert "out of memory (Unable to allocate 37.3 GiB for an array)" in err


# -- as a new user meets it ---------------------------------------------------------------------
LATENCY_8B = ("bench", "latency", "--hardware", "h100_sxm", "--model", "llama-3.1-8b")


@pytest.mark.parametrize(
    "args,hint",
    [
        (("models", "show", "llama3-8b"), "did you mean 'llama-3.1-8b'"),
        (("hardware", "show", "h100"), "did you mean 'h100_pcie' or 'h100_sxm'?"),
        (
            (*LATENCY_8B, "--engine", "vlm"),
            "did you mean 'vllm'?",
        ),
        (
            ("bench", "serve", *LATENCY_8B[2:], "--num-prompt", "5"),
            "did you mean '--num-prompts'?",
        ),
        (
            (*LATENCY_8B, "--tp", "2"),
            "did you mean '-tp'",
        ),
    ],
)
def test_a_mistyped_id_or_flag_gets_a_suggestion(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], hint: str
) -> None:
    code, _, err = run_cli(capsys, *args)
    assert code == 2
    assert_one_error_line(err)
    assert hint in err


def test_nothing_close_gets_no_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "models", "show", "zzzzzz")
    assert code == 2
    assert "did you mean" not in err


def test_a_hugging_face_id_of_a_bundled_model_is_that_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    by_id = simulator.load_model("meta-llama/Llama-3.1-8B-Instruct")
    assert by_id == simulator.load_model("llama-3.1-8b")
    assert simulator.load_model("META-LLAMA/llama-3.1-8b-instruct").id == "llama-3.1-8b"
    code, out, _ = run_cli(
        capsys, "models", "show", "mistralai/Mixtral-8x7B-Instruct-v0.1", "--json"
    )
    assert code == 0
    assert json.loads(out)["id"] == "mixtral-8x7b"


def test_a_hugging_face_id_is_read_from_the_local_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = tmp_path / "models--acme--tiny-llama" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    config = json.loads((MODELS_DIR / "llama-3.1-8b.json").read_text())
    (snapshot / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert simulator.load_model("acme/tiny-llama").num_layers == 2
    code, _, err = run_cli(capsys, "models", "show", "acme/other")
    assert code == 2
    assert_one_error_line(err)
    assert str(tmp_path) in err and "pass --model path/to/config.json" in err


def test_ids_and_flags_are_never_cut_on_80_columns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    from simulator.cli import common

    monkeypatch.setattr(common.out, "_width", 80)
    _, out, _ = run_cli(capsys, "hardware", "list")
    for hw in simulator.list_hardware():
        assert f" {hw} " in out, hw
    _, out, _ = run_cli(capsys, "models", "list")
    for model in simulator.list_models():
        assert f" {model} " in out, model


def test_help_never_cuts_a_flag_on_80_columns() -> None:
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "simulator", "bench", "serve", "--help"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    for flag in ("--random-input-len", "--random-output-len", "--sharegpt-output-len"):
        assert flag in out, flag
    assert "…" not in out
