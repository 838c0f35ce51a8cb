"""The streaming run mode (`outputs: stream`, metrics.stream): the same summary as a full run
from running aggregates and quantile sketches, memory flat in the requests."""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clitools import one_line_error, run_cli
from factories import scenario_data, write_yaml

from simulator.metrics import stream
from simulator.metrics.sketch import DEFAULT_ALPHA
from simulator.metrics.stream import STREAM_ABSENT
from simulator.outputs import MANIFEST
from simulator.runs import runner
from simulator.specs.loader import validate
from simulator.specs.scenario import Scenario

# two replicas, a goodput SLO, arrivals over time: every part of the summary is exercised
DATA = scenario_data(
    input_len=256,
    output_len=64,
    num_prompts=300,
    request_rate=40,
    range_ratio=0.5,
    group={"hardware": "h100_sxm", "count": 2},
    slo={"ttft_ms": 60, "tpot_ms": 12},
)
EXACT = (
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "preemptions",
    "duration",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "prefix_cache_hit_rate",
    "hardware_bound_tok_s",
    "bound_share",
    "simulated_steps",
)
ENERGY = (
    "energy_j",
    "parked_energy_j",
    "avg_power_w_per_gpu",
    "energy_per_output_token_j",
    "cost_usd",
)


def lower(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The order statistic of 0-based rank floor(q (N - 1)) of the weighted sample
    (`np.percentile(np.repeat(values, weights), 100 q, method="lower")`)."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    rank = math.floor(q * (cum[-1] - 1))
    return float(values[order][np.searchsorted(cum, rank, side="right")])


@pytest.fixture(scope="module")
def pair() -> tuple[runner.RunResult, runner.RunResult]:
    scenario = validate(Scenario, DATA, source="test")
    full = runner.run(scenario)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stream, "CHUNK_ROWS", 97)  # fold many chunks mid-run
        streamed = runner.run(scenario, outputs="stream")
    return full, streamed


def test_stream_keeps_no_rows_and_lacks_only_the_per_second_peaks(
    pair: tuple[runner.RunResult, runner.RunResult],
) -> None:
    full, streamed = pair
    assert len(streamed.sim.steps) == 0 and len(streamed.sim.requests) == 0
    assert len(streamed.sim.itl_s) == 0
    a, b = full.as_json(interval_coverage=None), streamed.as_json(interval_coverage=None)
    assert set(a) - set(b) == set(STREAM_ABSENT)
    assert set(b) <= set(a)


def test_counts_means_and_energy_equal_the_full_run(
    pair: tuple[runner.RunResult, runner.RunResult],
) -> None:
    full, streamed = pair
    a, b = full.as_json(interval_coverage=None), streamed.as_json(interval_coverage=None)
    assert b["simulated_steps"] > 10 * 97  # the chunks were folded, not one at the end
    assert a["request_goodput"] is not None and a["request_goodput"] > 0
    for key in (*EXACT, *ENERGY):
        assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), key
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "std"):
            key = f"{stat}_{name}_ms"
            assert b[key] == pytest.approx(a[key], rel=1e-7), key
    assert b["mean_queueing_ms"] == pytest.approx(a["mean_queueing_ms"], rel=1e-9)


def test_percentiles_lie_within_the_sketch_bound_of_the_lower_order_statistic(
    pair: tuple[runner.RunResult, runner.RunResult],
) -> None:
    full, streamed = pair
    req = full.sim.requests
    multi = req[req["output_tokens"] > 1]
    samples: dict[str, tuple[Any, Any]] = {
        "ttft": ((req["first_token_s"] - req["arrival_s"]).to_numpy(), None),
        "e2el": ((req["finish_s"] - req["arrival_s"]).to_numpy(), None),
        "tpot": (
            (
                (multi["finish_s"] - multi["first_token_s"]) / (multi["output_tokens"] - 1)
            ).to_numpy(),
            None,
        ),
        "itl": (full.sim.itl_s, full.sim.itl_weight),
    }
    for name, (values, weights) in samples.items():
        w = np.ones(len(values)) if weights is None else np.asarray(weights, float)
        for q, key in ((0.5, "median"), (0.9, "p90"), (0.99, "p99")):
            exact = lower(np.asarray(values, float), w, q) * 1000.0
            got = float(streamed.summary[f"{key}_{name}_ms"])
            assert abs(got - exact) <= DEFAULT_ALPHA * exact + 1e-12, (name, key, got, exact)
            # and near the full run's "linear" figure: between the order statistic and the next
            assert got == pytest.approx(full.summary[f"{key}_{name}_ms"], rel=0.05)


def peak_bytes(num_prompts: int) -> int:
    data = {**DATA, "workload": {**DATA["workload"], "num_prompts": num_prompts}}
    scenario = validate(Scenario, data, source="test")
    tracemalloc.start()
    try:
        runner.run(scenario, outputs="stream")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_stream_memory_is_flat_in_the_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "CHUNK_ROWS", 500)
    peak_bytes(100)  # the first run fills the process's caches (cost tables, specs)
    # measured peaks at 3,000 and 6,000 requests: 6.96 and 7.05 MB; a full run 12.2 and 21.1 MB
    one, two = peak_bytes(3000), peak_bytes(6000)
    assert two < 1.25 * one, (one, two)


def test_cli_flag_and_scenario_field_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_yaml(
        tmp_path / "s.yaml", {**DATA, "workload": {**DATA["workload"], "num_prompts": 40}}
    )
    code, out, err = run_cli(capsys, "run", str(path), "--outputs", "stream", "--json")
    assert code == 0, err
    flagged = json.loads(out)
    assert not set(STREAM_ABSENT) & set(flagged) and flagged["completed"] == 40
    field = write_yaml(
        tmp_path / "f.yaml",
        {**DATA, "workload": {**DATA["workload"], "num_prompts": 40}, "outputs": "stream"},
    )
    code, _, err = run_cli(capsys, "run", str(field), "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert {p.name for p in (tmp_path / "run").iterdir()} == {
        "summary.json",
        "scenario.json",
        "memory.json",
        MANIFEST,
    }
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["simulated_steps"] == flagged["simulated_steps"] > 0
    assert written["mean_ttft_ms"] == flagged["mean_ttft_ms"]


def test_report_with_stream_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_yaml(tmp_path / "s.yaml", DATA)
    args = ("run", str(path), "--out", str(tmp_path / "run"), "--outputs", "stream", "--report")
    err = one_line_error(capsys, *args)
    assert "--report" in err and "stream" in err
    assert not (tmp_path / "run").exists()


def test_stream_of_a_disaggregated_run_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = {
        **DATA,
        "replicas": [
            {"hardware": "h100_sxm", "role": "prefill"},
            {"hardware": "h100_sxm", "role": "decode"},
        ],
        "outputs": "stream",
    }
    err = one_line_error(capsys, "run", str(write_yaml(tmp_path / "d.yaml", data)))
    assert "outputs" in err and "stream" in err
