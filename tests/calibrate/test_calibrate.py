"""The calibration script: reproducible, laid over the hand-written specs, physically sane."""

from __future__ import annotations

import contextlib
import io
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from simulator import calibrate
from simulator.calibrate.check import drift, hardware_drifts
from simulator.calibrate.script import _devices
from simulator.errors import SpecError
from simulator.specs import load_hardware
from simulator.specs.hardware import HardwareSpec
from simulator.specs.loader import _merge, calibrated_engine, calibrated_hardware

CALIBRATED = ("h100_sxm", "a100_sxm_80gb")


@pytest.mark.parametrize("hw_id", CALIBRATED)
def test_the_overlay_replaces_only_fitted_factors(hw_id: str) -> None:
    base = load_hardware(hw_id, calibrated=False)
    fitted = load_hardware(hw_id)
    assert fitted.efficiency != base.efficiency
    # datasheet facts and unfitted factors stay as written
    assert fitted.compute == base.compute
    assert fitted.memory == base.memory
    assert fitted.efficiency.memory.stream_fraction == base.efficiency.memory.stream_fraction
    assert fitted.efficiency.host_link_fraction == base.efficiency.host_link_fraction


def test_devices_without_measurements_have_no_overlay() -> None:
    for hw_id in ("mi300x", "rtx_4090"):
        fitted, written = load_hardware(hw_id), load_hardware(hw_id, calibrated=False)
        assert fitted.model_dump() == written.model_dump()


def test_b200s_overlay_holds_every_family_but_fp4() -> None:
    # Fitted to aiconfigurator's B200 GEMM, attention and NCCL tables, every family as H100's,
    # but fp4's GEMM factors (no fp4 row: calibrate.nvfp4 fits those in b200.yaml).
    fitted, written = load_hardware("b200"), load_hardware("b200", calibrated=False)
    text = calibrate.calibration_path("b200").read_text()
    assert "vLLM 0.19.0's GEMM, FlashInfer and NCCL kernels" in text
    overlay = yaml.safe_load(text)["efficiency"]
    assert set(overlay) == {"kernel_latency_s", "gemm", "memory", "attention", "collective"}
    assert all("fp4" not in v for v in overlay["gemm"].values() if isinstance(v, dict))
    gemm, base = fitted.efficiency.gemm, written.efficiency.gemm
    assert gemm.peak_fraction["fp4"] == base.peak_fraction["fp4"]
    assert gemm.size_curves["fp4"] == base.size_curves["fp4"]
    assert gemm.extra_latency_s["fp4"] == base.extra_latency_s["fp4"]
    assert gemm.peak_fraction["bf16"] != base.peak_fraction["bf16"]
    attention, prior = fitted.efficiency.attention, written.efficiency.attention
    assert prior.decode_fixed_s is None and attention.decode_fixed_s  # the tables' floor
    assert attention.decode_split == prior.decode_split == "fa3"  # the spec's, not fitted
    # B200's small all-reduces are its own, slower than H100's (the spec's prior borrows them)
    h100 = load_hardware("h100_sxm").efficiency.collective
    assert fitted.efficiency.collective.latency_s > h100.latency_s
    prior = load_hardware("h100_sxm", calibrated=False).efficiency.collective
    assert written.efficiency.collective.latency_s == prior.latency_s


def test_the_committed_files_name_their_data() -> None:
    for hw_id in CALIBRATED:
        text = calibrate.calibration_path(hw_id).read_text()
        assert "GENERATED" in text
        assert "simulator/data/measured/aiconfigurator/" in text
        assert set(yaml.safe_load(text)) == {"efficiency"}


@pytest.mark.parametrize("hw_id", CALIBRATED)
def test_fitted_curves_keep_their_elasticity_bound(hw_id: str) -> None:
    # Efficiency may rise between knots only as far as the fit allows (y1 <= y0 (1 + e ln r)),
    # which keeps time monotone in the work; check the committed numbers obey it.
    eff = load_hardware(hw_id).efficiency
    by_path = {
        "gemm.size_curve": 0.9,
        "memory.size_curve": 0.9,
        "attention.prefill_len_curve": 0.5,
        "attention.prefill_parallel_curve": 0.5,
        "attention.decode_len_curve": 0.5,
        "attention.decode_parallel_curve": 0.5,
        "attention.decode_group_curve": 0.0,
        "collective.size_curve": 0.9,
    }
    for path, elasticity in by_path.items():
        group, name = path.split(".")
        points = getattr(getattr(eff, group), name).points
        assert points[-1][1] == 1.0, path
        for (x0, y0), (x1, y1) in pairwise(points):
            assert y1 <= y0 * (1 + elasticity * np.log(x1 / x0)) * (1 + 1e-3), (path, x0, x1)


def test_merge_recurses_into_mappings() -> None:
    base = {"a": {"b": 1, "c": 2}, "d": 3}
    assert _merge(base, {"a": {"b": 9}}) == {"a": {"b": 9, "c": 2}, "d": 3}


def test_a_malformed_overlay_is_a_one_line_error(tmp_path: Path) -> None:
    from simulator.errors import SpecError

    src = calibrate.calibration_path("h100_sxm").parent.parent / "h100_sxm.yaml"
    (tmp_path / "mygpu.yaml").write_text(src.read_text())
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "mygpu.yaml").write_text("gemm: {}\n")
    with pytest.raises(SpecError, match="only an 'efficiency' mapping"):
        load_hardware(str(tmp_path / "mygpu.yaml"))


def check_device(hw_id: str) -> tuple[int, str]:
    """`python -m simulator.calibrate --check --device hw_id`: its exit status and output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = calibrate.main(["--check", "--device", hw_id])
    return code, out.getvalue()


@pytest.mark.slow
def test_the_script_reproduces_the_committed_calibration() -> None:
    # Refits every device from the bundled data and compares what the committed and refitted
    # factors predict for the fitted rows: `--check` for all devices, one device a process on
    # two cores (the fits are independent; about 2 min of CPU, half of it h100_sxm's).
    devices = sorted(_devices())
    assert {"a100_sxm_80gb", "h100_sxm", "h200_sxm", "b200"} <= set(devices)
    spawn = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    with ProcessPoolExecutor(max_workers=2, mp_context=spawn) as pool:
        results = dict(zip(devices, pool.map(check_device, devices), strict=True))
    failed = {hw_id: out for hw_id, (code, out) in results.items() if code != 0}
    assert not failed, "\n".join(failed.values())


def test_drift_tolerates_a_few_loose_rows_but_not_a_shift() -> None:
    committed = np.full(1000, 1e-3)
    assert drift("f", committed, committed).ok
    loose = committed.copy()
    loose[:5] *= 1.2  # a few tiny GEMMs on a barely constrained knot
    assert drift("f", committed, loose).ok
    assert not drift("f", committed, committed * 1.02).ok  # every row 2% slower
    assert not drift("f", committed, committed[:-1]).ok  # rows added or lost


def _with_attention(hw: HardwareSpec, **update: float) -> HardwareSpec:
    at = hw.efficiency.attention.model_copy(update=update)
    return hw.model_copy(update={"efficiency": hw.efficiency.model_copy(update={"attention": at})})


def test_the_check_compares_predictions_not_numbers() -> None:
    hw = load_hardware("h100_sxm")
    # a knot below every measured size moves with the optimiser and predicts nothing new
    gemm = hw.efficiency.gemm
    fp8 = gemm.size_curves["fp8"]
    other = 171.5 if fp8.points[0][1] != 171.5 else 28250.0  # two environments' refits
    loose = fp8.model_copy(update={"points": [(1e6, other), *fp8.points[1:]]})
    moved = hw.with_gemm(
        gemm.model_copy(update={"size_curves": {**gemm.size_curves, "fp8": loose}})
    )
    assert moved != hw
    assert all(d.ok for d in hardware_drifts(hw, moved, "h100_sxm"))
    # a fitted fraction 5% off moves the rows it was fitted to
    off = _with_attention(hw, prefill_fraction=hw.efficiency.attention.prefill_fraction * 1.05)
    bad = {d.family for d in hardware_drifts(hw, off, "h100_sxm") if not d.ok}
    assert bad == {"attention_prefill"}


@pytest.mark.parametrize("hw_id", CALIBRATED)
def test_a_refit_overlay_builds_the_spec_the_loader_builds(hw_id: str) -> None:
    fitted = yaml.safe_load(calibrate.calibration_path(hw_id).read_text())
    assert calibrated_hardware(hw_id, fitted) == load_hardware(hw_id)


def test_the_engine_overlay_replaces_only_its_overheads() -> None:
    from simulator.specs import load_engine

    base = load_engine("vllm-0.2", calibrated=False)
    fitted = load_engine("vllm-0.2")
    assert fitted.overhead != base.overhead
    assert fitted.scheduler == base.scheduler
    assert fitted.cuda_graphs is False
    text = (calibrate.ENGINES_DIR / "calibration" / "vllm-0.2.yaml").read_text()
    assert "rows of llama-2-70b only" in text and "held out" in text
    # today's engines carry no fitted overlay
    assert load_engine("vllm") == load_engine("vllm", calibrated=False)


@pytest.mark.parametrize("hw_id", CALIBRATED)
def test_the_vidur_gemm_library_is_fitted_with_the_device_and_keeps_its_bound(hw_id: str) -> None:
    eff = load_hardware(hw_id).efficiency
    assert "cublas-12.1" in eff.gemm_libraries  # (H100 holds this project's cublas-13.1 too)
    lib = eff.gemm_libraries["cublas-12.1"]
    assert lib.peak_fraction["fp16"] == lib.peak_fraction["bf16"]  # one 16-bit tensor path
    # the older library reaches less of the peak than vLLM 0.14's on large GEMMs
    assert lib.peak_fraction["fp16"] < eff.gemm.peak_fraction["fp16"]
    assert lib.size_curve is not None
    points = lib.size_curve.points
    assert points[-1][1] == 1.0
    for (x0, y0), (x1, y1) in pairwise(points):
        assert y1 <= y0 * (1 + 0.9 * np.log(x1 / x0)) * (1 + 1e-3), (x0, x1)
    text = calibrate.calibration_path(hw_id).read_text()
    assert "simulator/data/measured/vidur/" in text and "llama-2-70b" in text  # held out


def test_a_device_without_vidur_profiles_gets_no_gemm_library() -> None:
    library, report = calibrate.calibrate_library(load_hardware("b200"))
    assert library is None and report.rows == 0
    assert load_hardware("b200").efficiency.gemm_libraries == {}


def test_a_parameter_no_row_depends_on_is_not_fitted() -> None:
    from simulator.calibrate.fit import _sensitive

    def residuals(x: np.ndarray) -> np.ndarray:  # rows depend on x[0] and x[2] only
        return np.array([x[0] - 1.0, 2.0 * x[0] + x[2]])

    free = _sensitive(residuals, np.array([0.5, 1.0, 0.0]), [(0.0, 1.0), (0.5, 1.5), (-1.0, 1.0)])
    assert free.tolist() == [True, False, True]
    # A100 has no fp8 KV-cache rows: its factor keeps the spec's 1.0, not a bound of the fit
    assert load_hardware("a100_sxm_80gb").efficiency.attention.fp8_kv_factor == 1.0


def test_the_library_tile_is_chosen_by_the_fitted_models_layers() -> None:
    from simulator.calibrate.families import LIBRARY_FAMILY
    from simulator.calibrate.fit import layer_mape
    from simulator.validate.layers import LIBRARY, layers_suite

    hw = load_hardware("h100_sxm")
    groups = LIBRARY_FAMILY.rows(hw, hw.id)
    # layer_mape over the library's fit rows is the `layers_fit` suite's figure
    fit_rows = layers_suite({"h100": hw}).query("suite == 'layers_fit'")
    assert layer_mape(groups, hw.with_gemm_library(LIBRARY)) == pytest.approx(
        fit_rows["ape_pct"].mean(), rel=1e-9
    )
    assert hw.efficiency.gemm_libraries[LIBRARY].tile_m_min == 128


@pytest.mark.parametrize(
    ("refit", "key"),
    [
        (lambda fitted: calibrated_hardware("h100_sxm", fitted), "efficiency"),
        (lambda fitted: calibrated_engine("vllm-0.2", fitted), "overhead"),
    ],
)
def test_a_calibration_holding_other_keys_is_refused(refit: Any, key: str) -> None:
    """A calibration may replace only what is fitted (a device's efficiency, an engine's CPU
    overheads); anything else in it is an error naming the refit."""
    with pytest.raises(SpecError) as info:
        refit({key: {}, "scheduler": {}})
    assert info.value.reason == f"expected only an '{key}' mapping"
    assert info.value.source.endswith("(refit)")
