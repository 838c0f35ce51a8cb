"""Scenarios, `run`, and the bench commands built on them (API and CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clitools import run_cli as cli

from simulator.errors import SpecError
from simulator.runs import runner
from simulator.specs.engine_args import EngineArgs
from simulator.specs.scenario import Scenario, load_scenario
from simulator.specs.workload import WorkloadSpec
from simulator.workload.requests import RandomDataset, RequestTable

# scenarios/ also holds sweep files (sweep_*.yaml) and plan files (plan_*.yaml).
SCENARIOS = sorted(
    p
    for p in (Path(__file__).parents[1] / "scenarios").glob("*.yaml")
    if not p.stem.startswith(("sweep_", "plan_"))
)
SERVE_KEYS = {
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    *(
        f"{stat}_{m}_ms"
        for m in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "std", "p90", "p99")
    ),
}
THROUGHPUT_KEYS = {
    "elapsed_time",
    "num_requests",
    "total_num_tokens",
    "requests_per_second",
    "tokens_per_second",
    "output_tokens_per_second",
}
# the hardware-limit bound and the run's share of it (costmodel.bound)
BOUND_KEYS = {
    "hardware_bound_tok_s",
    "hardware_bound_output_tok_s",
    "hardware_bound_resource",
    "bound_share",
}


def small_workload(n: int = 40, rate: float = 20.0) -> WorkloadSpec:
    return WorkloadSpec(
        dataset=RandomDataset(input_len=256, output_len=32, range_ratio=0.5),
        num_prompts=n,
        request_rate=rate,
    )


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_loads(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.replicas
    assert scenario.name


def test_the_quickstart_runs_and_meets_its_slos() -> None:
    result = runner.run(SCENARIOS[[p.stem for p in SCENARIOS].index("quickstart")])
    assert result.summary["completed"] == 500
    assert set(result.summary) >= SERVE_KEYS
    assert result.summary["request_goodput"] > 0


def test_a_scenario_with_two_replica_groups() -> None:
    scenario = Scenario.model_validate(
        {
            "name": "two-groups",
            "model": "llama-3.1-8b",
            "replicas": [{"hardware": "h100_sxm"}, {"hardware": "a100_sxm_80gb", "count": 2}],
            "router": {"kind": "round_robin"},
            "workload": small_workload(30).model_dump(),
        }
    )
    result = runner.run(scenario)
    assert result.sim.num_replicas == 3
    assert sorted(result.sim.requests["replica"].unique()) == [0, 1, 2]
    assert len(result.memory) == 2


def test_more_replicas_never_raise_latency_at_the_same_load() -> None:
    wl = small_workload(80, rate=40.0)
    one = runner.run(
        runner.bench_scenario(model="llama-3.1-8b", hardware="a100_sxm_80gb", workload=wl)
    )
    two = runner.run(
        runner.bench_scenario(
            model="llama-3.1-8b",
            hardware="a100_sxm_80gb",
            workload=wl,
            engine_args=EngineArgs(data_parallel_size=2),
            router="least_outstanding",
        )
    )
    assert two.summary["mean_e2el_ms"] <= one.summary["mean_e2el_ms"]


def test_throughput_never_exceeds_what_the_roofline_allows() -> None:
    # Output tokens per second cannot beat one decode step of the whole batch per token.
    result, summary = runner.bench_throughput(
        model="llama-3.1-8b", hardware="h100_sxm", input_len=128, output_len=64, num_prompts=64
    )
    assert set(summary) == THROUGHPUT_KEYS | BOUND_KEYS
    steps = result.sim.steps
    fastest = (steps["end_s"] - steps["start_s"]).min()
    assert summary["output_tokens_per_second"] <= 64 / fastest
    assert summary["num_requests"] == 64
    assert summary["total_num_tokens"] == 64 * (128 + 64)


def test_a_scenario_trace_path_is_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("t,p,o\n0,100,10\n0.5,200,20\n")
    (tmp_path / "s.yaml").write_text(
        "name: x\nmodel: llama-3.1-8b\nreplicas: [{hardware: h100_sxm}]\n"
        "workload:\n  dataset: {name: trace, path: t.csv, timestamp_column: t,"
        " prompt_column: p, output_column: o}\n  arrival: trace\n"
    )
    result = runner.run(tmp_path / "s.yaml")
    assert result.sim.requests["prompt_tokens"].tolist() == [100, 200]
    assert result.sim.requests["arrival_s"].tolist() == [0.0, 0.5]


def test_run_serves_the_requests_it_is_given() -> None:
    own = RequestTable(arrival_s=[0.0, 0.0, 2.0], prompt_len=[100, 3000, 50], output_len=[7, 3, 11])
    quickstart = Path(__file__).parents[1] / "scenarios" / "quickstart.yaml"
    result = runner.run(quickstart, requests=own)
    df = result.sim.requests.sort_values("request_id")
    assert df["prompt_tokens"].tolist() == [100, 3000, 50]
    assert df["output_tokens"].tolist() == [7, 3, 11]
    assert df["arrival_s"].tolist() == [0.0, 0.0, 2.0]


def test_requests_longer_than_the_context_are_rejected() -> None:
    wl = WorkloadSpec(dataset=RandomDataset(input_len=4000, output_len=200), num_prompts=3)
    with pytest.raises(SpecError, match="context length 4096"):
        runner.run(runner.bench_scenario(model="llama-2-7b", hardware="h100_sxm", workload=wl))


# -- CLI ------------------------------------------------------------------------------------------
def test_bench_serve_json_has_vllms_keys(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_file = tmp_path / "serve.json"
    code, out, _ = cli(
        capsys,
        "bench",
        "serve",
        "--hardware",
        "h100_sxm",
        "--model",
        "llama-3.1-8b",
        "--num-prompts",
        "50",
        "--request-rate",
        "10",
        "--random-input-len",
        "256",
        "--random-output-len",
        "32",
        "--goodput",
        "ttft:100",
        "tpot:20",
        "--output-json",
        str(out_file),
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    assert set(data) >= SERVE_KEYS
    assert data["completed"] == 50
    assert json.loads(out_file.read_text()) == data
    assert data["request_goodput"] is not None


def test_bench_serve_takes_a_zero_slo_as_vllm_does(capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM's --goodput refuses negative targets only; 0 ms is met by no request
    args = ["bench", "serve", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"]
    args += ["--num-prompts", "10", "--random-input-len", "64", "--random-output-len", "8"]
    code, out, err = cli(capsys, *args, "--goodput", "ttft:0", "tpot:1000", "--json")
    assert code == 0, err
    assert json.loads(out)["request_goodput"] == 0.0


def test_bench_serve_prints_vllms_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(
        capsys,
        "bench",
        "serve",
        "--hardware",
        "h100_sxm",
        "--model",
        "llama-3.1-8b",
        "--num-prompts",
        "20",
        "--random-input-len",
        "128",
        "--random-output-len",
        "16",
        "--max-concurrency",
        "4",
    )
    assert code == 0
    assert "Serving Benchmark Result" in out
    assert "Mean TTFT (ms):" in out


def test_bench_throughput_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(
        capsys,
        "bench",
        "throughput",
        "--hardware",
        "a100_sxm_80gb",
        "--model",
        "llama-3.1-8b",
        "--num-prompts",
        "30",
        "--input-len",
        "256",
        "--output-len",
        "64",
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    # vLLM's keys, then the error bands of the figures (docs/error-bands.md)
    bands = {
        "interval_coverage",
        "interval_source",
        "requests_per_second_interval",
        "tokens_per_second_interval",
        "output_tokens_per_second_interval",
        "elapsed_time_interval",
    }
    assert set(data) == THROUGHPUT_KEYS | BOUND_KEYS | bands
    assert data["num_requests"] == 30


def test_run_writes_its_results(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    quick = SCENARIOS[[p.stem for p in SCENARIOS].index("quickstart")]
    code, out, _ = cli(capsys, "run", str(quick), "--out", str(tmp_path / "r"), "--json")
    assert code == 0
    assert json.loads(out)["completed"] == 500
    assert {p.name for p in (tmp_path / "r").iterdir()} == {
        "summary.json",
        "requests.csv",
        "steps.csv",
        "itl.csv",
        "scenario.json",
        "memory.json",
        "manifest.json",
    }


def test_run_prints_its_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "run", "--schema")
    assert code == 0
    assert "replicas" in json.loads(out)["properties"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("run", "missing.yaml"), "missing.yaml"),
        (
            (
                "bench",
                "serve",
                "--hardware",
                "h100_sxm",
                "--model",
                "llama-3.1-8b",
                "--request-rate",
                "-1",
            ),
            "--request-rate",
        ),
        (
            (
                "bench",
                "serve",
                "--hardware",
                "h100_sxm",
                "--model",
                "llama-3.1-8b",
                "--dataset-name",
                "trace",
            ),
            "dataset_path",
        ),
        (
            (
                "bench",
                "serve",
                "--hardware",
                "h100_sxm",
                "--model",
                "llama-3.1-8b",
                "--goodput",
                "ttft=5",
            ),
            "goodput",
        ),
        (
            (
                "bench",
                "serve",
                "--hardware",
                "h100_sxm",
                "--model",
                "llama-3.1-8b",
                "--max-concurrency",
                "0",
            ),
            "--max-concurrency",
        ),
        (
            ("bench", "throughput", "--hardware", "rtx_4090", "--model", "llama-3.1-70b"),
            "does not fit",
        ),
        (
            ("bench", "serve", "--hardware", "h100_sxm", "--model", "llama-3.1-8b", "--seed", "-1"),
            "--seed",
        ),
        (
            (
                *("bench", "throughput", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"),
                *("--num-prompts", "0"),
            ),
            "--num-prompts",
        ),
        (
            (
                *("bench", "serve", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"),
                *("--preemption-mode", "swap", "--swap-space", "inf"),
            ),
            "--swap-space",
        ),
    ],
)
def test_bad_serving_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], fragment: str
) -> None:
    code, _, err = cli(capsys, *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert fragment in err


def test_a_malformed_scenario_names_file_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nmodel: llama-3.1-8b\nreplicas: [{hardware: h100_sxm, tp: 2}]\n"
        "workload: {dataset: {name: random}, num_prompts: 2}\n"
    )
    code, _, err = cli(capsys, "run", str(bad))
    assert code == 2
    assert "bad.yaml" in err and "replicas.0.tp" in err
    assert len(err.strip().splitlines()) == 1


def test_a_dataset_path_that_is_not_read_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    # (a ShareGPT file is read: tests/serving/test_sharegpt_file.py)
    code, out, err = cli(
        capsys,
        *("bench", "serve", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"),
        *("--dataset-name", "random", "--dataset-path", "ShareGPT_V3.json"),
        *("--tokenizer", "meta-llama/Llama-3.1-8B", "--num-prompts", "5", "--json"),
    )
    assert code == 0 and json.loads(out)["completed"] == 5
    assert err.count("\n") == 2 and "--dataset-path is not read" in err and "random" in err
    assert "no effect on the prediction: --tokenizer" in err


@pytest.mark.parametrize(
    ("group", "top", "named"),
    [
        ("tensor_parallel_size: 3", "", "replicas.0: layout: tensor_parallel_size: "),
        ("power_cap_w: 10", "", "replicas.0: power_cap_w: "),
        ("", "seed: -1\n", ": seed: "),  # the schema's own check
    ],
)
def test_an_impossible_scenario_names_its_file_and_group(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, group: str, top: str, named: str
) -> None:
    bad = tmp_path / "bad.yaml"
    extra = f", {group}" if group else ""
    bad.write_text(
        f"name: x\nmodel: llama-3.1-8b\nreplicas: [{{hardware: h100_sxm{extra}}}]\n"
        f"workload: {{dataset: {{name: random}}, num_prompts: 2}}\n{top}"
    )
    code, _, err = cli(capsys, "run", str(bad))
    assert code == 2
    assert err.startswith(f"llmsim: error: {bad}: ") and named in err
    assert len(err.strip().splitlines()) == 1


def test_swap_preemption_from_the_bench_flags(capsys: pytest.CaptureFixture[str]) -> None:
    # A KV cache of a few thousand tokens (gpu-memory-utilization just above the weights) and
    # long outputs force preemptions; swapping keeps every prompt token computed once.
    args = [
        "bench",
        "throughput",
        "--hardware",
        "h100_sxm",
        "--model",
        "llama-3.1-8b",
        "--num-prompts",
        "24",
        "--input-len",
        "256",
        "--output-len",
        "512",
        "--gpu-memory-utilization",
        "0.25",  # the LLM class's 16384-token steps take 3 GiB of activations
        "--json",
    ]
    code, out, _ = cli(capsys, *args, "--preemption-mode", "swap", "--swap-space", "16")
    assert code == 0
    swap = json.loads(out)
    code, out, _ = cli(capsys, *args, "--preemption-mode", "recompute")
    assert code == 0
    recompute = json.loads(out)
    assert swap["num_requests"] == recompute["num_requests"] == 24
    scenario = runner.bench_scenario(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        workload=WorkloadSpec(
            dataset=RandomDataset(input_len=256, output_len=512),
            num_prompts=24,
            request_rate=float("inf"),
        ),
        engine_args=EngineArgs(gpu_memory_utilization=0.25, preemption_mode="swap", swap_space=16),
    )
    result = runner.run(scenario)
    assert result.summary["preemptions"] > 0
    assert result.sim.steps["prefill_tokens"].sum() == 24 * 256


def test_priority_mix_and_policy_in_a_scenario() -> None:
    workload = WorkloadSpec(
        dataset=RandomDataset(input_len=512, output_len=64),
        num_prompts=300,
        request_rate=60.0,
        priority_mix=[0.2, 0.8],
    )
    scenario = runner.bench_scenario(
        model="llama-3.1-8b",
        hardware="l40s",
        workload=workload,
        engine_args=EngineArgs(scheduling_policy="priority", max_num_seqs=8),
    )
    requests = runner.run(scenario).sim.requests
    share = (requests["priority"] == 0).mean()
    assert 0.1 < share < 0.3
    wait = (requests["first_scheduled_s"] - requests["arrival_s"]).groupby(requests["priority"])
    assert wait.mean()[0] < wait.mean()[1]  # the urgent class waits less
    with pytest.raises(ValueError, match="priority_mix"):
        WorkloadSpec(
            dataset=RandomDataset(input_len=8, output_len=8), num_prompts=2, priority_mix=[0.5]
        )


def test_bench_serve_save_result_as_vllm(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["bench", "serve", "--hardware", "h100_sxm", "--model", "llama-3.1-8b"]
    args += ["--num-prompts", "10", "--request-rate", "5", "--max-concurrency", "4"]
    args += ["--random-input-len", "64", "--random-output-len", "8", "--save-result"]
    # vLLM's default name, in --result-dir: {backend}-{rate}qps-concurrency{C}-{model}-{time}
    code, _, _ = cli(capsys, *args, "--result-dir", str(tmp_path / "runs"))
    assert code == 0
    (saved,) = (tmp_path / "runs").iterdir()
    assert saved.name.startswith("vllm-5.0qps-concurrency4-llama-3.1-8b-")
    data = json.loads(saved.read_text())
    assert set(data) >= SERVE_KEYS and data["completed"] == 10
    assert (data["request_rate"], data["max_concurrency"], data["num_prompts"]) == (5.0, 4, 10)
    # --result-filename names it; without --result-dir it goes to the working directory
    monkeypatch.chdir(tmp_path)
    code, _, _ = cli(capsys, *args, "--result-filename", "mine.json")
    assert code == 0 and json.loads((tmp_path / "mine.json").read_text())["completed"] == 10
