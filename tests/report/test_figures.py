"""The figure functions on small hand-made tables: their traces, axes and SLO lines."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from simulator.errors import SpecError
from simulator.report import (
    batch_size,
    cost_frontier,
    fleet_replicas,
    kv_usage,
    latency_cdf,
    op_breakdown,
    power_trace,
    queue_length,
    rate_latency,
    roofline,
    throughput_latency_pareto,
)
from simulator.report.costfigures import plan_slo_ms
from simulator.report.figures import MAX_REPLICA_TRACES, pareto_mask
from simulator.specs import load_hardware


# -- factories ----------------------------------------------------------------------------------
def make_requests() -> pd.DataFrame:
    """Three finished requests (TTFT 100, 200, 300 ms; E2E 1.1, 2.2, 3.3 s; the third has one
    output token, so no TPOT) and one that never got a token."""
    return pd.DataFrame(
        {
            "request_id": [0, 1, 2, 3],
            "replica": [0, 0, 0, 0],
            "arrival_s": [0.0, 1.0, 2.0, 3.0],
            "first_scheduled_s": [0.05, 1.0, 2.2, np.nan],
            "first_token_s": [0.1, 1.2, 2.3, np.nan],
            "finish_s": [1.1, 3.2, 5.3, np.nan],
            "prompt_tokens": [100, 200, 300, 400],
            "output_tokens": [11, 21, 1, 0],
        }
    )


def make_steps(replicas: int = 1, steps: int = 4) -> pd.DataFrame:
    rows = [
        {
            "replica": r,
            "start_s": float(i),
            "end_s": float(i + 1),
            "num_seqs": i + 1,
            "prefill_tokens": 0,
            "decode_tokens": i + 1,
            "kv_used_blocks": 10 * (i + 1),
        }
        for r in range(replicas)
        for i in range(steps)
    ]
    return pd.DataFrame(rows)


def make_results() -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for hw, scale in (("h100_sxm", 1.0), ("mi300x", 1.5)):
        for rate in (2, 4, 8):
            rows.append(
                {
                    "run_id": f"{hw}-{rate}",
                    "workload.request_rate": rate,
                    "hardware": hw,
                    "status": "ok",
                    "error": "",
                    "median_ttft_ms": 10.0 * rate * scale,
                    "p99_ttft_ms": 20.0 * rate * scale,
                    "median_tpot_ms": 1.0 * rate * scale,
                    "p99_tpot_ms": 2.0 * rate * scale,
                    "output_throughput": 100.0 * rate,
                }
            )
    rows.append({"run_id": "bad", "workload.request_rate": 16, "hardware": "h100_sxm"})
    rows[-1].update(status="error", error="boom")
    return pd.DataFrame(rows)


def vlines(fig: go.Figure) -> list[float]:
    return sorted(s.x0 for s in fig.layout.shapes if s.x0 == s.x1)


def hlines(fig: go.Figure) -> list[float]:
    return sorted(s.y0 for s in fig.layout.shapes if s.y0 == s.y1)


# -- a run ----------------------------------------------------------------------------------------
def test_latency_cdf_has_a_panel_per_metric_and_the_slo_lines() -> None:
    itl = pd.DataFrame({"itl_s": [0.01, 0.02], "weight": [3.0, 1.0]})
    fig = latency_cdf(make_requests(), itl=itl, slo={"ttft_ms": 500, "tpot_ms": 50})
    ttft, tpot, itl_trace, e2el = fig.data
    assert ttft.x.tolist() == pytest.approx([100.0, 200.0, 300.0])  # the unfinished one is out
    assert ttft.y.tolist() == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert tpot.x.tolist() == pytest.approx([100.0])  # 1000 ms / 10 and 2000 ms / 20
    assert tpot.y.tolist() == [1.0]
    assert itl_trace.x.tolist() == pytest.approx([10.0, 20.0])
    assert itl_trace.y.tolist() == pytest.approx([0.75, 1.0])
    assert e2el.x.tolist() == pytest.approx([1100.0, 2200.0, 3300.0])
    assert fig.layout.xaxis.title.text == "time to first token (ms)"
    assert fig.layout.yaxis3.title.text == "fraction of tokens"
    assert vlines(fig) == [50.0, 500.0]


def test_latency_cdf_without_itl_or_slo() -> None:
    fig = latency_cdf(make_requests())
    assert len(fig.data) == 3
    assert vlines(fig) == []


def test_latency_cdf_names_a_missing_column() -> None:
    with pytest.raises(SpecError, match="finish_s"):
        latency_cdf(make_requests().drop(columns="finish_s"))


def test_kv_usage_as_a_share_of_capacity() -> None:
    fig = kv_usage(make_steps(), capacity_blocks=200)
    assert fig.data[0].y.tolist() == [5.0, 10.0, 15.0, 20.0]
    assert fig.layout.yaxis.title.text == "KV cache in use (%)"
    per_replica = kv_usage(make_steps(replicas=2), capacity_blocks={0: 100, 1: 400})
    assert per_replica.data[1].y.tolist() == [2.5, 5.0, 7.5, 10.0]
    blocks = kv_usage(make_steps())
    assert blocks.data[0].y.tolist() == [10.0, 20.0, 30.0, 40.0]
    assert blocks.layout.xaxis.title.text == "time (s)"


def test_kv_usage_needs_a_capacity_for_every_replica() -> None:
    with pytest.raises(SpecError, match="capacity"):
        kv_usage(make_steps(replicas=2), capacity_blocks={0: 100})


def test_long_runs_are_binned_with_their_peaks() -> None:
    fig = batch_size(make_steps(steps=4), max_points=2)
    mean, peak = fig.data
    assert mean.y.tolist() == [1.5, 3.5]  # bins [0, 2) and [2, 4): steps of 1 s each
    assert peak.y.tolist() == [2.0, 4.0]
    assert "max per bin" in peak.name


def test_many_replicas_are_drawn_as_mean_and_max() -> None:
    steps = make_steps(replicas=MAX_REPLICA_TRACES + 1)
    steps.loc[steps["replica"] == 0, "num_seqs"] += 9  # replica 0 runs 9 more sequences
    fig = batch_size(steps)
    assert [t.name for t in fig.data] == [f"mean of {MAX_REPLICA_TRACES + 1}", "max"]
    assert fig.data[0].y.tolist() == pytest.approx([2.0, 3.0, 4.0, 5.0])
    assert fig.data[1].y.tolist() == pytest.approx([10.0, 11.0, 12.0, 13.0])


def test_queue_length_counts_requests_not_yet_scheduled() -> None:
    fig = queue_length(make_requests())
    (trace,) = fig.data
    # events: 0 +1, 0.05 -1, 1.0 +1 -1, 2.0 +1, 2.2 -1, 3.0 +1 (never scheduled)
    assert trace.x.tolist() == [0.0, 0.05, 1.0, 2.0, 2.2]
    assert trace.y.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert fig.layout.yaxis.title.text == "requests waiting"


# -- a sweep --------------------------------------------------------------------------------------
def test_rate_latency_draws_each_series_and_the_slos() -> None:
    fig = rate_latency(make_results(), by=["hardware"], slo={"ttft_ms": 100, "tpot_ms": 10})
    assert len(fig.data) == 2 * 2 * 2  # hardware x (median, p99) x (TTFT, TPOT)
    first = fig.data[0]
    assert first.name == "hardware: h100_sxm median"
    assert first.x.tolist() == [2, 4, 8]  # the error row is left out
    assert first.y.tolist() == [20.0, 40.0, 80.0]
    assert hlines(fig) == [10.0, 100.0]
    assert fig.layout.xaxis.title.text == "offered request rate (req/s)"
    assert fig.layout.yaxis2.title.text == "TPOT (ms)"


def test_rate_latency_falls_back_on_the_achieved_rate() -> None:
    results = make_results().drop(columns="workload.request_rate")
    with pytest.raises(SpecError, match="request_throughput"):
        rate_latency(results)
    results["request_throughput"] = 1.0
    assert rate_latency(results).layout.xaxis.title.text == "achieved request throughput (req/s)"


def test_pareto_mask_keeps_the_points_nothing_beats() -> None:
    # (throughput, latency): (1, 1) and (2, 2) are beaten by (2, 1); (3, 3) is not.
    mask = pareto_mask(np.array([1.0, 2.0, 3.0, 2.0]), np.array([1.0, 2.0, 3.0, 1.0]))
    assert mask.tolist() == [False, False, True, True]


def test_throughput_latency_pareto() -> None:
    fig = throughput_latency_pareto(make_results(), by=["hardware"], slo_ms=12.0)
    names = [t.name for t in fig.data]
    assert names == ["hardware: h100_sxm", "hardware: mi300x", "Pareto frontier"]
    front = fig.data[-1]
    # h100 reaches each throughput at lower p99 TPOT (4, 8, 16 ms against 6, 12, 24 ms)
    assert front.x.tolist() == [4.0, 8.0, 16.0]
    assert front.y.tolist() == [200.0, 400.0, 800.0]
    assert vlines(fig) == [12.0]
    assert fig.layout.yaxis.title.text == "output throughput (output tokens/s)"


# -- operators and plans ------------------------------------------------------------------------
def make_op_costs() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "phase": ["prefill", "prefill", "decode", "decode"],
            "op": ["up_proj", "cpu_step", "up_proj", "cpu_step"],
            "kind": ["gemm", "engine", "gemm", "engine"],
            "dtype": ["bf16", "", "bf16", ""],
            "flops": [4e12, 0.0, 4e9, 0.0],
            "bytes": [1e9, 0.0, 1e9, 0.0],
            "total_s": [0.008, 0.002, 0.0004, 0.002],
            "hidden_s": [0.0, 0.0, 0.0, 0.0],
            "bound": ["compute", "cpu", "memory", "cpu"],
        }
    )


def test_roofline_places_ops_under_the_device_roofs() -> None:
    hw = load_hardware("h100_sxm")
    fig = roofline(make_op_costs(), hw)
    roof, prefill, decode = fig.data
    assert max(roof.y) == pytest.approx(hw.peak_flops("bf16"))
    ridge = hw.peak_flops("bf16") / hw.memory.bandwidth_bytes_per_s
    assert min(roof.x) < ridge < max(roof.x)
    assert prefill.x.tolist() == [4000.0] and prefill.y.tolist() == pytest.approx([5e14])
    assert decode.x.tolist() == [4.0] and decode.y.tolist() == pytest.approx([1e13])
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "arithmetic intensity" in fig.layout.xaxis.title.text


def test_op_breakdown_stacks_to_the_step_time() -> None:
    fig = op_breakdown(make_op_costs())
    assert fig.layout.barmode == "stack"
    per_phase = np.sum([t.y for t in fig.data], axis=0)
    assert per_phase.tolist() == pytest.approx([10.0, 2.4])
    assert fig.data[0].x[0] == "prefill step (10.00 ms)"


def make_probes() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "layout": ["a", "a", "b"],
            "rate": [1.0, 2.0, 1.0],
            "feasible": ["True", "False", "True"],
            "usd_per_million_output_tokens": [2.0, 1.0, 3.0],
            "p99_tpot_ms": [20.0, 70.0, 10.0],
        }
    )


def test_cost_frontier_marks_what_misses_the_slos() -> None:
    pareto = make_probes().iloc[[0, 2]]
    fig = cost_frontier(make_probes(), metric="p99_tpot_ms", pareto=pareto, slo_ms=60.0)
    names = [t.name for t in fig.data]
    assert names == ["a", "a (misses SLOs)", "b", "frontier"]
    assert fig.data[1].marker.symbol == "circle-open"
    assert fig.data[-1].x.tolist() == [10.0, 20.0]
    assert vlines(fig) == [60.0]
    assert fig.layout.xaxis.title.text == "p99 TPOT (ms)"


def test_plan_slo_matches_the_frontier_percentile() -> None:
    slo = {"tpot_ms": {"p": 99.0, "max": 50.0}, "ttft_ms": {"p": 90.0, "max": 800.0}}
    assert plan_slo_ms(slo, "p99_tpot_ms") == 50.0
    assert plan_slo_ms(slo, "p99_ttft_ms") is None
    assert plan_slo_ms(slo, "p90_ttft_ms") == 800.0


def test_fleet_replicas_draws_each_count_as_steps() -> None:
    fleet = pd.DataFrame(
        {
            "time_s": [0.0, 5.0, 7.5, 30.0],
            "serving": [1, 1, 2, 1],
            "loading": [0, 1, 0, 0],
            "draining": [0, 0, 0, 1],
            "wanted": [1, 2, 2, 1],
        }
    )
    fig = fleet_replicas(fleet)
    names = [t.name for t in fig.data]
    assert names == ["serving", "loading weights", "draining", "wanted by the autoscaler"]
    assert all(t.line.shape == "hv" for t in fig.data)  # a count holds until the next row
    assert list(fig.data[0].y) == [1, 1, 2, 1] and list(fig.data[1].x) == [0.0, 5.0, 7.5, 30.0]
    with pytest.raises(SpecError, match="wanted"):
        fleet_replicas(fleet.drop(columns="wanted"))


def test_power_trace_draws_the_draw_the_budget_and_the_caps() -> None:
    power = pd.DataFrame(
        {
            "time_s": [0.25, 0.5, 0.75, 1.0],
            "draw_w": [1500.0, 2600.0, 2100.0, 1400.0],
            "window_w": [1500.0, 2050.0, 2066.7, 2033.3],
            "capped_replicas": [0, 0, 2, 2],
        }
    )
    fig = power_trace(power, budget_w=2000.0)
    names = [t.name for t in fig.data]
    assert names == ["fleet draw (sampled)", "windowed mean", "budget", "replicas capped"]
    assert list(fig.data[2].y) == [2000.0, 2000.0] and list(fig.data[2].x) == [0.25, 1.0]
    assert fig.data[3].line.shape == "hv" and list(fig.data[3].y) == [0, 0, 2, 2]
    assert len(power_trace(power).data) == 3  # no budget line without one
    with pytest.raises(SpecError, match="capped_replicas"):
        power_trace(power.drop(columns="capped_replicas"))
