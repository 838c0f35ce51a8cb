"""The `e2e_energy` suite: ML.ENERGY v3.0's vLLM runs, their requests, the benchmark's steady
window and the three figures per run, and a guard on the held-out error."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from simulator.runs.energy import PowerModel
from simulator.specs import load_hardware, load_model
from simulator.validate import data, run_validation
from simulator.validate.energy import (
    COLUMNS,
    FIT_SUITE,
    POWER_FIT,
    PROMPT_MEAN_TOKENS,
    SIMULATED_BATCHES,
    SUITE,
    Window,
    duty_split,
    duty_table,
    e2e_energy_suite,
    fit_power,
    output_lengths,
    prompt_lengths,
    run_requests,
    steady_window,
)
from simulator.validate.energy import main as energy_main
from simulator.validate.frame import COLUMNS as FRAME_COLUMNS
from simulator.validate.summary import SUITE_NAMES


def runs() -> pd.DataFrame:
    return data.read_measured("e2e/energy.csv", COLUMNS)


def test_bundled_runs_name_known_ids_and_hold_their_histograms() -> None:
    df = runs()
    assert len(df) == 130 and set(df["source"]) == {"M1"}
    assert set(df["hardware"]) == {"h100_sxm", "b200"}
    for model in df["model"].unique():
        load_model(model)
    assert (df["engine"] == "vllm-0.11").all() and df["async_scheduling"].astype(bool).all()
    for _, row in df.iterrows():
        lengths = output_lengths(row)
        assert len(lengths) == row["num_prompts"]  # one length per published request
        assert lengths.min() >= 1 and lengths.max() <= row["output_len_max"]
        # the run's mean output stays within the bins' resolution of the histogram's
        assert row["avg_batch_size"] <= row["max_num_seqs"]
    # a run's own figures are consistent: 7 GPU-rows of ~1 kW at most
    per_gpu = df["avg_power_w"] / df["tensor_parallel"]
    tdp = df["hardware"].map(lambda h: load_hardware(h).power.tdp_w)
    assert (per_gpu < tdp).all() and (per_gpu > 0.3 * tdp).all()


def test_output_lengths_spread_each_bin_evenly() -> None:
    row = pd.Series({"output_len_min": 2.0, "output_len_max": 12.0, "output_len_counts": "2 0 1"})
    # bins [2, 5.33), [5.33, 8.67), [8.67, 12]: two at 1/4 and 3/4 of the first, one mid-third
    assert output_lengths(row).tolist() == [3, 4, 10]


def test_prompt_lengths_have_the_stated_mean() -> None:
    drawn = prompt_lengths(200_000, np.random.default_rng(1))
    assert drawn.mean() == pytest.approx(PROMPT_MEAN_TOKENS, rel=0.02)
    assert drawn.min() >= 1


def test_run_requests_arrive_at_once_with_the_published_outputs() -> None:
    row = runs().iloc[0]
    reqs = run_requests(row)
    assert len(reqs) == row["num_prompts"] and (reqs.arrival_s == 0).all()
    assert sorted(reqs.output_len.tolist()) == sorted(output_lengths(row).tolist())


def test_steady_window_is_the_benchmarks() -> None:
    # 6 requests, batch 2: starts once 2 have a first token (t = 2), ends once all but
    # 2 + 1 = 3 have finished (the 3rd finish, t = 30)
    requests = pd.DataFrame(
        {"first_token_s": [1, 2, 5, 6, 8, 9], "finish_s": [10, 20, 30, 40, 50, 60]}
    )
    assert steady_window(requests, 2) == (2.0, 30.0)
    with pytest.raises(ValueError, match="no steady state"):
        steady_window(requests.iloc[:3], 2)


@pytest.mark.slow
def test_suite_rows_are_three_figures_per_simulated_run() -> None:
    df = e2e_energy_suite()
    assert list(df.columns[: len(FRAME_COLUMNS)]) == FRAME_COLUMNS
    assert set(df["suite"]) == {SUITE, FIT_SUITE}
    simulated = runs()[runs()["max_num_seqs"].isin(SIMULATED_BATCHES)]
    assert len(df) == 3 * len(simulated)
    assert (df.groupby("kind").size() == len(simulated)).all()
    for col in ("predicted_s", "measured_s", "ape_pct", "window_s"):
        assert np.isfinite(df[col].to_numpy(dtype=float)).all(), col
    # power rows are fractions of the TDP, per GPU
    power = df[df["kind"] == "power"]
    assert ((power["predicted_s"] > 0.05) & (power["predicted_s"] <= 1.0 + 1e-9)).all()
    itl = df[df["kind"] == "itl"]
    assert ((itl["measured_s"] > 1e-3) & (itl["measured_s"] < 0.5)).all()


def test_registered_as_a_suite() -> None:
    assert SUITE in SUITE_NAMES


# MAPE per device as committed (docs/validation.md's table); a change that doubles it fails.
COMMITTED_MAPE_PCT = {"h100_sxm": 10.6, "b200": 27.6}


@pytest.mark.slow
def test_no_device_doubles_its_committed_error() -> None:
    summary, _ = run_validation([SUITE])
    for device, committed in COMMITTED_MAPE_PCT.items():
        got = summary["suites"][SUITE]["by_device"][device]["mape_pct"]
        assert got < 2 * committed, (device, got, committed)


@pytest.mark.slow
def test_h100_power_shape_is_what_its_fit_rows_give() -> None:
    # the committed hardware_specs/h100_sxm.yaml values are the fit's (rounded to 3 places)
    fitted = fit_power("h100_sxm")
    power = load_hardware("h100_sxm").power
    for name, value in fitted.items():
        assert getattr(power, name) == pytest.approx(value, abs=6e-4), name


@pytest.mark.slow
def test_fit_rows_are_their_own_suite() -> None:
    df = e2e_energy_suite()
    fit = df[df["suite"] == FIT_SUITE]
    assert fit["fitted"].all() and not df[df["suite"] == SUITE]["fitted"].any()
    assert set(fit["kind"]) == {"power"} and set(fit["device"]) == {"h100_sxm"}
    assert set(fit["checkpoint"]) == {c for _, c in POWER_FIT}
    held = df[(df["suite"] == SUITE) & (df["kind"] == "power") & (df["device"] == "h100_sxm")]
    assert len(held) and not set(held["checkpoint"]) & {c for _, c in POWER_FIT}


# -- the time split a run's power implies ---------------------------------------------------------
def _model() -> PowerModel:
    return PowerModel.from_hardware(load_hardware("b200"))


def _window(busy_s: float, span_s: float, tokens: float) -> Window:
    """Two equal steps at full memory and no compute utilisation, `busy_s` in all."""
    return Window(
        busy=np.array([busy_s / 2, busy_s / 2]),
        u_compute=np.zeros(2),
        u_memory=np.ones(2),
        span=span_s,
        tokens=tokens,
    )


def test_duty_split_reads_the_measured_power_as_steps_and_waits() -> None:
    model, window = _model(), _window(busy_s=0.9, span_s=1.0, tokens=1000.0)
    busy_w = float(model.power_w(u_compute=0.0, u_memory=1.0))
    assert busy_w > model.parked_w
    # measured: a quarter of the time at the steps' draw, the rest parked, 4x the time a token
    measured_w = 0.25 * busy_w + 0.75 * model.parked_w
    split = duty_split(window, model, measured_w=measured_w, measured_s_per_token=4e-3)
    assert split.sim_duty == pytest.approx(0.9)
    assert split.sim_busy_s == pytest.approx(0.9e-3) and split.sim_wait_s == pytest.approx(0.1e-3)
    assert split.busy_w == pytest.approx(busy_w)
    assert split.duty == pytest.approx(0.25)
    assert split.busy_s == pytest.approx(1e-3) and split.wait_s == pytest.approx(3e-3)
    # the device's own work is 1.11x the priced; the time lost waits: 30x the simulated wait
    assert split.kernel_ratio == pytest.approx(1e-3 / 0.9e-3)
    assert split.wait_ratio == pytest.approx(30.0)


def test_duty_split_clips_and_refuses_a_run_without_power_signal() -> None:
    model, window = _model(), _window(busy_s=1.0, span_s=1.0, tokens=10.0)
    over = duty_split(window, model, measured_w=model.tdp_w * 2, measured_s_per_token=0.1)
    under = duty_split(window, model, measured_w=0.0, measured_s_per_token=0.1)
    assert (over.duty, under.duty) == (1.0, 0.0)
    assert over.wait_ratio == float("inf")  # the simulated run never waits
    flat = dataclasses.replace(
        model, active_fraction=0.0, memory_fraction=0.0, compute_fraction=0.0
    )
    with pytest.raises(ValueError, match="parked"):
        duty_split(window, flat, measured_w=500.0, measured_s_per_token=0.1)
    with pytest.raises(ValueError, match="no steps"):
        duty_split(_window(0.0, 1.0, 10.0), model, measured_w=500.0, measured_s_per_token=0.1)


def test_duty_entry_point_refuses_bad_arguments_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert energy_main(["--duty"]) == 2
    assert energy_main(["--duty", "mi300x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "energy.csv: hardware: no runs on 'mi300x'" in err[1]


@pytest.mark.slow
def test_b200_split_separates_host_waits_from_device_work() -> None:
    """The bundled B200 runs as docs/validation.md reads them: the simulation never waits; the
    dense Llamas keep the GPU busy (duty >= 0.9), their work within 10% of the priced at batch
    8 (B200's own attention and all-reduce timings fitted) and 70B's still slower than priced
    at batch 32-128, while Llama 3.1 8B at batch 128 spends most of its window parked."""
    table = duty_table("b200")
    assert len(table) == 32
    assert (table["sim_duty"] > 0.99).all()
    dense = table[table["case"].str.match(r"llama-3\.1-(70|405)b")]
    assert (dense["duty"] >= 0.9).all()
    b8 = dense[dense["case"].str.endswith(" b8")]
    assert len(b8) == 4 and b8["kernel_ratio"].between(1.0, 1.1).all()
    mid = dense[dense["case"].str.match(r"llama-3\.1-70b tp2 b(32|128)$")]
    assert len(mid) == 4 and (mid["kernel_ratio"] > 1.1).all()
    small = table[table["case"] == "llama-3.1-8b tp1 b128"].iloc[0]
    assert small["duty"] < 0.5 and small["wait_us"] > small["busy_us"]


def test_the_fit_suite_asked_alone_brings_its_rows_alone() -> None:
    # one simulation gives both suites; the rows returned are the suite asked for
    _, df = run_validation([FIT_SUITE])
    assert set(df["suite"]) == {FIT_SUITE}
