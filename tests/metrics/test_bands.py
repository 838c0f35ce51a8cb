"""Error bands from validation residuals: quantiles, groups, backing and the output keys."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.metrics import bands
from simulator.metrics.bands import Metric, Residual, Target


def res(
    r: float,
    *,
    family: bands.Family = "ttft",
    regime: bands.Regime = "offline",
    device: str = "h100_sxm",
    device_family: str = "nvidia",
    engine_family: str = "vllm",
    suite: str = "e2e_latency",
    source: str = "S1",
) -> Residual:
    return Residual(
        family=family,
        regime=regime,
        suite=suite,
        source=source,
        device=device,
        device_family=device_family,
        engine_family=engine_family,
        case=f"case {r}",
        log_ratio=r,
    )


H100_VLLM = Target("h100_sxm", "nvidia", "vllm")


# -- quantiles ------------------------------------------------------------------------------------
def test_quantile_at_rank_n_plus_1_p_by_hand() -> None:
    x = [0.3, 0.0, 0.8, 0.1, 0.5, 0.2, 0.7, 0.4, 0.6]  # 0.0 .. 0.8, n = 9
    assert bands.quantile(x, 0.1) == pytest.approx(0.0)  # rank 1.0: the smallest
    assert bands.quantile(x, 0.25) == pytest.approx(0.15)  # rank 2.5: halfway 0.1 -> 0.2
    assert bands.quantile(x, 0.9) == pytest.approx(0.8)  # rank 9.0: the largest
    assert bands.quantile(x, 0.05) == pytest.approx(0.0)  # rank 0.5: clamped
    assert bands.quantile(x, 0.97) == pytest.approx(0.8)  # rank 9.7: clamped
    for p in (0.05, 0.1, 0.25, 0.5, 0.9, 0.97):
        assert bands.quantile(x, p) == pytest.approx(np.quantile(x, p, method="weibull"))


def test_band_of_eleven_rows_at_80_percent_by_hand() -> None:
    # r = 0.01 .. 0.11; rank 12 x 0.1 = 1.2: 0.01 + 0.2 x 0.01; rank 10.8: 0.10 + 0.8 x 0.01
    rows = [res(0.01 * k) for k in range(1, 12)]
    band = bands.group_band(
        rows,
        family="ttft",
        regime="offline",
        device_family="nvidia",
        engine_family="vllm",
        coverage=0.8,
    )
    assert band is not None
    assert (band.low, band.high) == pytest.approx((0.012, 0.108))
    assert band.label == "ttft, offline, nvidia, vllm" and not band.clamped
    assert band.expected_coverage == 0.8


def test_min_group_rows_keeps_the_quantiles_inside_the_range() -> None:
    assert bands.min_group_rows(0.8) == 10  # (10 + 1) x 0.1 >= 1
    assert bands.min_group_rows(0.9) == 19  # (19 + 1) x 0.05 = 1
    assert bands.min_group_rows(0.5) == bands.MIN_GROUP_ROWS
    with pytest.raises(ValueError, match="coverage"):
        bands.check_coverage(1.0)


# -- groups ---------------------------------------------------------------------------------------
def test_a_group_splits_only_where_it_has_enough_rows() -> None:
    nvidia = [res(0.01 * k) for k in range(10)]
    amd = [res(0.5 + 0.01 * k, device="mi300x", device_family="amd") for k in range(5)]
    online = [res(1.0, regime="online") for _ in range(3)]
    rows = nvidia + amd + online
    kw = {"family": "ttft", "coverage": 0.8}
    got = bands.group_band(
        rows, regime="offline", device_family="nvidia", engine_family="vllm", **kw
    )
    assert got is not None and got.label == "ttft, offline, nvidia, vllm" and len(got.rows) == 10
    # five AMD rows are too few: the offline rows of every device
    got = bands.group_band(rows, regime="offline", device_family="amd", engine_family="vllm", **kw)
    assert got is not None and got.label == "ttft, offline" and len(got.rows) == 15
    # three online rows are too few: the whole family
    got = bands.group_band(
        rows, regime="online", device_family="nvidia", engine_family="vllm", **kw
    )
    assert got is not None and got.label == "ttft" and len(got.rows) == 18
    assert (
        bands.group_band(
            rows,
            regime="offline",
            device_family=None,
            engine_family=None,
            family="tpot",
            coverage=0.8,
        )
        is None
    )


def test_a_family_too_small_for_the_coverage_gives_its_range_and_says_so() -> None:
    rows = [res(0.1 * k, family="tpot", regime="online") for k in range(8)]
    band = bands.group_band(
        rows,
        family="tpot",
        regime="online",
        device_family="nvidia",
        engine_family="vllm",
        coverage=0.8,
    )
    assert band is not None and band.clamped
    assert (band.low, band.high) == pytest.approx((0.0, 0.7))
    assert band.expected_coverage == pytest.approx(7 / 9)
    out = bands.intervals(
        {"tpot_s": 1.0},
        metrics=bands.LATENCY_METRICS,
        targets=[H100_VLLM],
        regime="online",
        rows=rows,
    )
    assert out["interval_caveats"] == [
        "the TPOT/ITL band rests on 8 validation rows, too few for 80%: it is their range, "
        "expected to cover 78%"
    ]


# -- output keys ----------------------------------------------------------------------------------
ROWS = [res(0.01 * k) for k in range(1, 12)] + [
    res(-0.1 + 0.02 * k, family="throughput", suite="e2e_throughput") for k in range(1, 12)
]


def test_a_time_scales_by_the_band_and_a_rate_by_its_inverse() -> None:
    metrics = {"t": Metric(("ttft",)), "tput": Metric(("throughput",), rate=True)}
    out = bands.intervals(
        {"t": 2.0, "tput": 100.0, "other": 5.0},
        metrics=metrics,
        targets=[H100_VLLM],
        regime="offline",
        rows=ROWS,
    )
    assert out["t_interval"] == pytest.approx([2 * math.exp(0.012), 2 * math.exp(0.108)])
    # throughput r = -0.08 .. 0.12: rank 1.2 -> -0.076, rank 10.8 -> 0.116
    assert out["tput_interval"] == pytest.approx([100 * math.exp(-0.116), 100 * math.exp(0.076)])
    assert "other_interval" not in out
    assert out["interval_coverage"] == 0.8
    assert out["interval_source"] == ["e2e_latency", "e2e_throughput"]
    assert "interval_note" not in out and "interval_caveats" not in out


def test_e2el_takes_the_hull_of_the_ttft_and_tpot_bands() -> None:
    rows = [res(0.01 * k, regime="online") for k in range(1, 12)]
    rows += [res(0.05 * k, family="tpot", regime="online") for k in range(1, 12)]
    keys = ["mean_e2el_ms", "mean_ttft_ms", "p99_itl_ms"]
    out = bands.intervals(
        {"mean_e2el_ms": 10.0, "mean_ttft_ms": 1.0, "p99_itl_ms": 1.0},
        metrics=bands.serve_metrics(keys, all_at_once=False),
        targets=[H100_VLLM],
        regime="online",
        rows=rows,
    )
    # TTFT 0.012 .. 0.108; TPOT 0.06 .. 0.54 (rank 1.2: 0.05 + 0.2 x 0.05; rank 10.8)
    assert out["mean_ttft_ms_interval"] == pytest.approx([math.exp(0.012), math.exp(0.108)])
    assert out["p99_itl_ms_interval"] == pytest.approx([math.exp(0.06), math.exp(0.54)])
    assert out["mean_e2el_ms_interval"] == pytest.approx(
        [10 * math.exp(0.012), 10 * math.exp(0.54)]
    )


def test_an_unbacked_pair_gets_a_note_and_no_band() -> None:
    rtx = Target("rtx_4090", "nvidia", "llamacpp")
    out = bands.intervals(
        {"ttft_s": 1.0}, metrics=bands.LATENCY_METRICS, targets=[rtx], regime="offline", rows=ROWS
    )
    assert out == {"interval_note": "no end-to-end validation rows for rtx_4090 under llamacpp"}
    # the same hardware under an engine family it has no rows for
    sglang = Target("h100_sxm", "nvidia", "sglang")
    out = bands.intervals(
        {"ttft_s": 1.0},
        metrics=bands.LATENCY_METRICS,
        targets=[H100_VLLM, sglang],
        regime="offline",
        rows=ROWS,
    )
    assert out == {"interval_note": "no end-to-end validation rows for h100_sxm under sglang"}
    assert bands.intervals({}, metrics={}, targets=[], regime="offline", rows=ROWS) == {
        "interval_note": "no deployment to look up"
    }


def test_serve_throughputs_have_bands_only_when_every_request_arrives_at_once() -> None:
    keys = [
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "duration",
        "mean_ttft_ms",
        "median_tpot_ms",
        "p99.9_itl_ms",
        "std_ttft_ms",
        "p99_e2el_ms",
    ]
    online = bands.serve_metrics(keys, all_at_once=False)
    assert set(online) == {"mean_ttft_ms", "median_tpot_ms", "p99.9_itl_ms", "p99_e2el_ms"}
    offline = bands.serve_metrics(keys, all_at_once=True)
    assert set(offline) - set(online) == set(bands.SERVE_RATES)
    assert offline["request_throughput"] == Metric(("throughput",), rate=True, regime="offline")


def test_engine_families() -> None:
    assert bands.engine_family("vllm-0.6") == "vllm"
    assert bands.engine_family("trtllm-0.6") == "trtllm"
    assert bands.engine_family("sglang") == "sglang"
    assert bands.engine_family("llamacpp") == "llamacpp"
    assert bands.engine_family("vllmish") == "vllmish"  # not a family: itself


def test_band_text_for_the_printed_figures() -> None:
    data = {"x_interval": [38.0, 61.25], "interval_coverage": 0.8}
    assert bands.band_suffix(data, "x") == "  [38.00, 61.25] at 80%"
    assert bands.band_suffix(data, "y") == ""
    assert bands.band_lines({"interval_note": "why"}) == ["Error bands: none (why)"]


# -- the committed file ---------------------------------------------------------------------------
def test_the_committed_residuals_back_h100_under_vllm_and_not_rtx_4090_under_llamacpp() -> None:
    rows = bands.load_residuals()
    assert {r.family for r in rows} == {"ttft", "tpot", "latency", "throughput"}
    assert bands.backing_note(rows, [H100_VLLM]) is None
    rtx = Target("rtx_4090", "nvidia", "llamacpp")
    assert bands.backing_note(rows, [rtx]) == (
        "no end-to-end validation rows for rtx_4090 under llamacpp"
    )


def test_a_moe_model_is_backed_only_by_moe_rows() -> None:
    """The dense rows of A100 under vLLM do not back a mixture of experts there: a MoE
    deployment gets the note; the committed MoE rows (Qwen3-30B-A3B under TensorRT-LLM on
    B200, under vLLM on H100 and B200; DeepSeek-R1's serving curves) back their pairs alone."""
    from simulator.costmodel.deployment import deployment

    rows = bands.load_residuals()
    moe = bands.deployment_target(
        deployment(model="mixtral-8x7b", hardware="a100_sxm_80gb", tensor_parallel_size=2)
    )
    assert moe.model_family == "moe"
    assert bands.backing_note(rows, [moe]) == (
        "no end-to-end validation rows for MoE models on a100_sxm_80gb under vllm"
    )
    dense = bands.deployment_target(deployment(model="llama-3.1-8b", hardware="a100_sxm_80gb"))
    assert bands.backing_note(rows, [dense]) is None
    h100 = bands.deployment_target(
        deployment(model="mixtral-8x7b", hardware="h100_sxm", tensor_parallel_size=2)
    )
    assert bands.backing_note(rows, [h100]) is None  # the ML.ENERGY runs of Qwen3-30B-A3B
    b200 = Target("b200", "nvidia", "trtllm", "moe")
    assert bands.backing_note(rows, [b200]) is None
    assert {
        r.model_family for r in bands.backing_rows(hardware="b200", engine="trtllm", family="moe")
    } == {"moe"}


def test_reading_the_committed_file_imports_no_validation_suite() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from simulator.metrics import bands; bands.load_residuals(); "
        "print(any(m.startswith('simulator.validate') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
