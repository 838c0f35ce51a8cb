"""The `e2e_serving_curve` suite: published TTFT and ITL against load through the knee."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from simulator.errors import SpecError
from simulator.specs import load_engine, load_hardware, load_model
from simulator.validate import data, run_validation
from simulator.validate.serving_curve import (
    COLUMNS,
    CONCURRENCY_WAVES,
    HARNESS_STEADY_STATE,
    KNEE_FRACTION,
    SATURATED_GAIN,
    SUITE,
    e2e_serving_curve_suite,
    knee,
    random_dataset,
    serving_curve_cases,
    signed_stats,
    steady_ttft_ms,
)
from simulator.validate.summary import SUITE_NAMES, resolve_suites
from tests.clitools import run_cli


def _measured() -> pd.DataFrame:
    return data.read_measured("e2e/serving_curve.csv", COLUMNS)


# -- bundled data ---------------------------------------------------------------------------------
def test_bundled_curves_name_known_ids_a_source_and_a_setup() -> None:
    df = _measured()
    assert len(df) >= 8
    readme = (data.MEASURED_DIR / "e2e" / "README.md").read_text()
    for source in df["source"].unique():
        assert f"## {source}:" in readme, source  # provenance of every row
    for hw in df["hardware"].unique():
        load_hardware(hw)
    for model in df["model"].unique():
        load_model(model)
    for engine in df["engine"].unique():
        load_engine(engine)
    setup = COLUMNS[: COLUMNS.index("statistic") + 1]
    setup = [c for c in setup if c not in ("quantization", "num_prompts", "max_model_len")]
    assert df[setup].notna().all().all()
    assert (df[["ttft_ms", "itl_ms", "output_tokens_per_s", "load"]] > 0).all().all()
    for _, points in df.groupby("curve"):
        assert len(points) >= 4 and points["load"].is_unique
        assert points["load_kind"].nunique() == 1 and points["statistic"].nunique() == 1


def test_curves_are_not_in_the_other_e2e_suites() -> None:
    curves = set(_measured()["source"])
    for name in ("serving", "throughput", "latency", "energy"):
        other = pd.read_csv(data.MEASURED_DIR / "e2e" / f"{name}.csv")
        assert not curves & set(other["source"]), name


# -- the knee -------------------------------------------------------------------------------------
def test_knee_of_a_synthetic_saturating_curve() -> None:
    load = [1, 2, 4, 8, 16, 32]
    tput = [10.0, 20.0, 40.0, 70.0, 100.0, 102.0]  # the last step gains 2%: saturated
    # 90% of 102 = 91.8, between 8 (70) and 16 (100): 8 + 8 * 21.8/30
    assert knee(load, tput) == pytest.approx(8 + 8 * 21.8 / 30)
    assert knee(load, tput, fraction=0.5) == pytest.approx(4 + 4 * 11 / 30)


def test_knee_is_in_the_package_api() -> None:
    import simulator.validate

    assert simulator.validate.knee is knee


def test_knee_of_a_curve_still_rising_is_none() -> None:
    load = [1, 2, 4, 8]
    assert knee(load, [10.0, 20.0, 40.0, 40.0 * (1 + SATURATED_GAIN)]) is None
    assert knee(load, [10.0, 20.0, 40.0, 40.0 * (1 + SATURATED_GAIN) * 0.99]) is not None


def test_knee_at_the_first_point_and_past_the_peak() -> None:
    # saturated from the start: the first load is the knee
    assert knee([1, 2, 3], [100.0, 100.0, 99.0]) == 1.0
    # throughput falls past its peak (overload): the knee is where it first reached 90%
    assert knee([10, 20, 40, 80], [50.0, 100.0, 90.0, 80.0]) == pytest.approx(
        10 + 10 * (KNEE_FRACTION * 100 - 50) / 50
    )


@pytest.mark.parametrize(
    ("load", "tput", "field"),
    [
        ([1], [1.0], "load"),
        ([1, 1], [1.0, 2.0], "load"),
        ([2, 1], [1.0, 2.0], "load"),
        ([1, 2], [1.0, 0.0], "output_tokens_per_s"),
        ([1, 2], [1.0, math.nan], "output_tokens_per_s"),
    ],
)
def test_bad_sweeps_are_spec_errors(load: list[float], tput: list[float], field: str) -> None:
    with pytest.raises(SpecError) as exc:
        knee(load, tput)
    assert exc.value.field == field


def test_bad_rows_are_spec_errors() -> None:
    for column, value in (
        ("load_kind", "qps"),
        ("statistic", "p50"),
        ("dataset", "sharegpt"),
        ("harness", "locust"),
        ("length_spread", "lognormal"),
        ("num_prompts", 0),
        ("num_prompts", 2.5),
    ):
        bad = _measured().head(2).copy()
        bad[column] = value
        with pytest.raises(SpecError) as exc:
            serving_curve_cases(bad)
        assert exc.value.field == column


def test_signed_stats_sign_and_kinds() -> None:
    rows = pd.DataFrame(
        {
            "kind": ["ttft", "ttft", "itl"],
            "predicted_s": [2.0, 1.0, 0.5],
            "measured_s": [1.0, 1.0, 1.0],
            "ape_pct": [100.0, 0.0, 50.0],
        }
    )
    stats = signed_stats(rows)
    assert stats["ttft"]["signed_median_pct"] == pytest.approx(50.0)
    assert stats["itl"]["signed_median_pct"] == pytest.approx(-50.0)  # predicted faster
    assert stats["ttft"]["n"] == 2 and stats["ttft"]["mape_pct"] == pytest.approx(50.0)


def test_steady_ttft_leaves_out_the_opening_wave() -> None:
    # two clients: the first two requests are sent at t=0 and queue; the rest are steady
    requests = pd.DataFrame(
        {
            "request_id": [0, 1, 2, 3, 4],
            "arrival_s": [0.0, 0.0, 1.0, 1.5, 2.0],
            "first_token_s": [0.5, 1.0, 1.2, 1.7, np.nan],  # the last did not finish
        }
    )
    got = steady_ttft_ms(requests, first_wave=2)
    assert got["mean_ttft_ms"] == pytest.approx(200.0)
    assert got["median_ttft_ms"] == pytest.approx(200.0)
    # shuffled rows: the wave is chosen by send time, not by row order
    shuffled = requests.iloc[[3, 0, 2, 1, 4]]
    assert steady_ttft_ms(shuffled, first_wave=2) == got
    with pytest.raises(SpecError, match="after the first 4"):
        steady_ttft_ms(requests, first_wave=4)  # one finished request beyond: none


# -- the suite ------------------------------------------------------------------------------------
@pytest.mark.slow  # the whole suite: about 30 s of simulation, once per process
def test_suite_rows_and_knees() -> None:
    df = e2e_serving_curve_suite()
    measured = _measured()
    assert len(df) == 2 * len(measured)
    assert set(df["kind"]) == {"ttft", "itl"} and (df["suite"] == SUITE).all()
    assert not df["fitted"].any() and df["case"].is_unique
    assert np.isfinite(df[["predicted_s", "measured_s", "ape_pct"]].to_numpy(float)).all()
    knees = df.attrs["knees"]
    assert len(knees) == measured["curve"].nunique()
    for k in knees:
        points = measured[measured["curve"] == k["curve"]]
        assert k["measured_knee"] == knee(points["load"], points["output_tokens_per_s"])
        if k["skipped"] is None:
            want = 100 * (k["predicted_knee"] - k["measured_knee"]) / k["measured_knee"]
            assert k["error_pct"] == pytest.approx(want)
            assert points["load"].min() <= k["predicted_knee"] <= points["load"].max()
        else:
            assert k["error_pct"] is None
    # each point ran the source's published request count, or waves of its concurrency
    for _, row in df.drop_duplicates(["curve", "load"]).iterrows():
        point = measured[(measured["curve"] == row["curve"]) & (measured["load"] == row["load"])]
        published = point["num_prompts"].iloc[0]
        want = CONCURRENCY_WAVES * int(row["load"]) if pd.isna(published) else int(published)
        assert row["simulated_prompts"] == want, row["case"]


@pytest.mark.slow  # the whole suite: about 30 s of simulation, once per process
def test_suite_is_registered_and_runs_by_default() -> None:
    assert SUITE in SUITE_NAMES and SUITE in resolve_suites(None)
    summary, df = run_validation([SUITE])
    entry = summary["suites"][SUITE]
    assert set(entry["by_kind"]) == {"ttft", "itl"}
    assert entry["knees"] == df.attrs["knees"] and entry["knee_fraction"] == KNEE_FRACTION


@pytest.mark.slow  # the whole suite: about 30 s of simulation, once per process
def test_cli_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "validate", "--suite", SUITE, "--json")
    assert code == 0
    entry = json.loads(out)["suites"][SUITE]
    assert entry["fitted"] is False and entry["n"] == 2 * len(_measured())
    assert {"signed_median_pct", "mape_pct"} <= set(entry["by_kind"]["itl"])
    assert all({"measured_knee", "predicted_knee", "error_pct"} <= set(k) for k in entry["knees"])
    code, text, _ = run_cli(capsys, "validate", "--suite", SUITE, "--worst", "0")
    flat = " ".join(text.split())
    assert code == 0 and "signed median" in flat and "knee" in flat


# -- D1: dstack's DeepSeek-R1 sweeps (vLLM and SGLang, MI300X and H200) ---------------------------
D1_CURVES = {
    "dstack-deepseek-r1-mi300x-vllm-tp8-3200/800": ("mi300x", "vllm-0.7"),
    "dstack-deepseek-r1-mi300x-sglang-tp8-3200/800": ("mi300x", "sglang-0.4"),
    "dstack-deepseek-r1-h200-vllm-tp8-3200/800": ("h200_sxm", "vllm-0.7"),
}


def test_d1_curves_load_with_their_published_setup() -> None:
    df = _measured()
    for curve, (hardware, engine) in D1_CURVES.items():
        points = df[df["curve"] == curve].sort_values("load")
        assert list(points["load"]) == [4, 8, 16, 32, 64, 128], curve
        assert set(points["source"]) == {"D1"} and set(points["hardware"]) == {hardware}
        assert set(points["engine"]) == {engine} and set(points["model"]) == {"deepseek-v3"}
        assert set(points["harness"]) == {"sglang.bench_serving"}
        assert (points["num_prompts"] == 500).all() and (points["tensor_parallel"] == 8).all()
        assert (points["input_len"] == 3200).all() and (points["output_len"] == 800).all()
        # every request ran its full 800 tokens: 500 x 800 output tokens in each run
        duration_s = 500 * 800 / points["output_tokens_per_s"]
        assert (duration_s > 0).all()
    # the engine families and vendors the suite covers
    assert {"trtllm", "vllm-0.7", "sglang-0.4"} <= set(df["engine"])
    assert {"h100_sxm", "h200_sxm", "mi300x"} <= set(df["hardware"])


@pytest.mark.slow  # the whole suite: about 30 s of simulation, once per process
def test_d1_knees_are_computed_or_skipped_with_the_reason() -> None:
    knees = {k["curve"]: k for k in e2e_serving_curve_suite().attrs["knees"]}
    measured = _measured()
    for curve in D1_CURVES:
        k = knees[curve]
        points = measured[measured["curve"] == curve].sort_values("load")
        tput = points["output_tokens_per_s"].to_numpy(float)
        if tput[-1] >= tput[-2] * (1 + SATURATED_GAIN):  # still rising: no measured knee
            assert k["measured_knee"] is None
            assert k["skipped"] == "the measured sweep does not reach its knee"
        else:
            assert k["measured_knee"] == pytest.approx(knee(points["load"], tput))
            if k["predicted_knee"] is None:
                assert k["skipped"] == (
                    "the predicted sweep does not reach its knee inside the published loads"
                )
            else:
                assert k["skipped"] is None and k["error_pct"] is not None
    # the two MI300X sweeps still gained 36% and 20% at their last step; H200 vLLM saturated
    assert knees["dstack-deepseek-r1-mi300x-vllm-tp8-3200/800"]["measured_knee"] is None
    assert knees["dstack-deepseek-r1-mi300x-sglang-tp8-3200/800"]["measured_knee"] is None
    h200 = knees["dstack-deepseek-r1-h200-vllm-tp8-3200/800"]["measured_knee"]
    assert h200 is not None and 32 < h200 < 64


def test_harness_decides_whether_the_opening_burst_counts() -> None:
    assert HARNESS_STEADY_STATE == {
        "genai-perf (NIM benchmarking)": True,
        "sglang.bench_serving": False,
    }
    row = _measured().iloc[[2]].copy()  # K1 at concurrency 25: a burst of 25 5000-token prompts
    row["num_prompts"] = 100
    steady = serving_curve_cases(_two_points(row))
    burst = serving_curve_cases(_two_points(row.assign(harness="sglang.bench_serving")))
    ttft = {
        name: float(d.loc[d["kind"] == "ttft", "predicted_s"].iloc[0])
        for name, d in (("steady", steady), ("burst", burst))
    }
    # the opening wave queues its prefills: counted, it raises the mean TTFT
    assert ttft["burst"] > ttft["steady"]
    assert list(steady["simulated_prompts"]) == [100, 100, 200, 200]  # the published counts
    itl = [float(d.loc[d["kind"] == "itl", "predicted_s"].iloc[0]) for d in (steady, burst)]
    assert itl[0] == pytest.approx(itl[1])  # ITL is the whole run's either way


def _two_points(row: pd.DataFrame) -> pd.DataFrame:
    """A one-point curve made into the two points a sweep needs (the second at twice the load)."""
    second = row.assign(load=row["load"] * 2, num_prompts=200)
    return pd.concat([row, second], ignore_index=True)


# -- H1: DataCrunch's SGLang sweep over Poisson rates (Llama 3.3 70B, 4 x H200) ------------------
H1_CURVE = "datacrunch-llama-3.3-70b-h200-sglang-tp4-1024/1024-uniform"


def test_h1_curve_loads_as_a_rate_sweep_with_uniform_lengths() -> None:
    points = _measured().query("curve == @H1_CURVE").sort_values("load")
    assert list(points["load"]) == [1, 2, 4, 8, 16]
    assert set(points["load_kind"]) == {"rate"} and set(points["statistic"]) == {"median"}
    assert set(points["length_spread"]) == {"uniform"} and set(points["engine"]) == {"sglang-0.4"}
    # the published counts: 300 s of arrivals, 200 s at 16 req/s
    assert list(points["num_prompts"]) == [300, 600, 1200, 2400, 3200]


@pytest.mark.slow  # the whole suite: about 30 s of simulation, once per process
def test_h1_runs_its_published_counts_and_skips_its_knee() -> None:
    rows = e2e_serving_curve_suite().query("curve == @H1_CURVE")
    assert set(rows["simulated_prompts"]) == {300, 600, 1200, 2400, 3200}
    k = next(k for k in e2e_serving_curve_suite().attrs["knees"] if k["curve"] == H1_CURVE)
    # the measured sweep still gained 22% at its last step (3515 -> 4288 tokens/s): no knee
    assert k["measured_knee"] is None
    assert k["skipped"] == "the measured sweep does not reach its knee"


def test_uniform_lengths_are_sglang_bench_servings_draw() -> None:
    from simulator.specs.workload import RandomDataset
    from simulator.workload.datasets import random_lengths

    assert random_dataset(5000, 500, "fixed") == {
        "name": "random",
        "input_len": 5000,
        "output_len": 500,
    }
    spec = RandomDataset(**random_dataset(1024, 1024, "uniform"))
    prompt, output = random_lengths(spec, n=200_000, rng=np.random.default_rng(0))
    for lengths in (prompt, output):
        assert lengths.min() == 1 and lengths.max() == 1023
        assert lengths.mean() == pytest.approx(512.5, rel=0.01)  # the harness's: (1 + 1024) / 2
        assert np.mean(lengths <= 256) == pytest.approx(0.25, abs=0.01)  # flat, not peaked
    with pytest.raises(SpecError) as exc:
        random_dataset(1024, 128, "uniform")  # the harness has one ratio for both
    assert exc.value.field == "output_len"
    with pytest.raises(SpecError):
        random_dataset(2, 2, "uniform")
