"""The `ops_amd` suites: MI300X's 8-bit GEMMs (AMD aiter's timings), fitted and held out."""

from __future__ import annotations

from functools import cache

import numpy as np
import pandas as pd
import pytest

from simulator.calibrate.amd import fit_mi300x_a8w8
from simulator.calibrate.fit import predict
from simulator.specs import load_hardware
from simulator.specs.hardware import HardwareSpec
from simulator.validate import data
from simulator.validate.amd import (
    DEVICE,
    FIT_SUITE,
    LIBRARY,
    SUITE,
    amd_suite,
    device_groups,
    fitted_mask,
)
from simulator.validate.summary import run_validation

# mi300x.yaml's 8-bit GEMM peak fraction before these rows: AMD's MAF 1,273 / 2,614.9
DATASHEET_PEAK_8BIT = 0.49


def datasheet_spec() -> HardwareSpec:
    hw = load_hardware(DEVICE)
    gemm = hw.efficiency.gemm
    peaks = dict(gemm.peak_fraction) | {"fp8": DATASHEET_PEAK_8BIT, "int8": DATASHEET_PEAK_8BIT}
    return hw.with_gemm(gemm.model_copy(update={"peak_fraction": peaks}))


@cache
def rows() -> pd.DataFrame:
    return amd_suite()


def shapes(df: pd.DataFrame) -> set[tuple[int, int, int]]:
    return set(zip(df["m"], df["n"], df["k"], strict=True))


def test_the_bundled_table_is_read_and_split_by_model_without_a_shared_shape() -> None:
    table = data.aiter_gemm(DEVICE)
    assert len(table) == 427 and set(table["gemm_dtype"]) == {"int8"}
    df = rows()
    fit, held = df[df["suite"] == FIT_SUITE], df[df["suite"] == SUITE]
    assert len(fit) == 144 and len(held) == 283
    assert fit["fitted"].all() and not held["fitted"].any()
    assert not shapes(fit) & shapes(held)
    # no (n, k) of a fitted row is held out either: the split is by model, not by row
    assert not set(zip(fit["n"], fit["k"], strict=True)) & set(
        zip(held["n"], held["k"], strict=True)
    )
    assert fitted_mask(fit).all() and not fitted_mask(held).any()


def test_the_figures_are_the_cost_models_predictions_under_the_library() -> None:
    df = rows()
    hw = load_hardware(DEVICE).with_gemm_library(LIBRARY)
    assert hw.efficiency.gemm != load_hardware(DEVICE).efficiency.gemm  # the library is there
    for fitted, suite in ((True, FIT_SUITE), (False, SUITE)):
        groups = device_groups(hw, fitted=fitted)
        got = df[df["suite"] == suite]["predicted_s"].to_numpy()
        np.testing.assert_allclose(got, predict(groups, hw))
        assert groups[0].op.pre_bytes == 0.0  # the scaled GEMM alone
    assert np.all(df["ape_pct"] >= 0) and np.all(df["measured_s"] > 0)


def test_the_library_reproduces_the_fitted_rows_and_improves_the_held_out_ones() -> None:
    df = rows()
    fit = df[df["suite"] == FIT_SUITE]
    held = df[df["suite"] == SUITE]
    assert fit["ape_pct"].mean() < 12.0  # 10.2 when fitted
    assert abs(np.median(fit["predicted_s"] / fit["measured_s"] - 1.0)) < 0.05
    before = amd_suite(datasheet_spec(), library=None)  # the datasheet's 8-bit factors
    assert before[before["suite"] == FIT_SUITE]["ape_pct"].mean() > 20.0  # 25.8
    assert held["ape_pct"].mean() < before[before["suite"] == SUITE]["ape_pct"].mean() - 5.0


def test_the_devices_own_8bit_peak_is_the_fastest_measured_gemm() -> None:
    table = data.aiter_gemm(DEVICE)
    tflops = 2 * table["m"] * table["n"] * table["k"] / (table["latency_ms"] / 1e3) / 1e12
    hw = load_hardware(DEVICE)
    assert hw.efficiency.gemm.peak_fraction["fp8"] == pytest.approx(
        tflops.max() / (hw.peak_flops("fp8") / 1e12), abs=0.001
    )


@pytest.mark.slow  # a least-squares fit of the size curve (~1 min on a busy core)
def test_a_refit_predicts_the_fitted_rows_as_the_spec_does() -> None:
    library, fitted, report = fit_mi300x_a8w8()
    assert report.rows == 144 and report.mape_after_pct < report.mape_before_pct - 5.0
    spec = load_hardware(DEVICE)
    committed = spec.efficiency.gemm_libraries[LIBRARY]
    assert library.peak_fraction["fp8"] == pytest.approx(committed.peak_fraction["fp8"], rel=0.02)
    groups = device_groups(spec, fitted=True)
    refit = predict(groups, fitted)
    ours = predict(groups, spec.with_gemm_library(LIBRARY))
    assert np.max(np.abs(refit / ours - 1.0)) < 0.02


def test_run_validation_reports_both_suites_with_their_fitted_flags() -> None:
    summary, df = run_validation(["ops_amd", "ops_amd_fit"])
    assert set(summary["suites"]) == {SUITE, FIT_SUITE}
    assert summary["suites"][FIT_SUITE]["fitted"] and not summary["suites"][SUITE]["fitted"]
    assert set(summary["suites"][SUITE]["by_device"]) == {DEVICE}
    assert len(df) == 427
