"""This project's own GEMM timings (tools/measure_gpu.py): the data, the `cublas-13.1` library
fitted to them, the engines that run that library; and H200's factors, fitted to
aiconfigurator's H200 tables since they were bundled."""

from __future__ import annotations

import json
from itertools import pairwise

import numpy as np
import pytest

from simulator import calibrate
from simulator.api import gemm_cost
from simulator.specs import load_engine, load_hardware
from simulator.validate import data
from simulator.validate.gemm_library import (
    LIBRARY,
    SUITE,
    device_groups,
    gemm_library_suite,
    library_groups,
)
from simulator.validate.operators import gemm_groups

MEASURED = ("h100_sxm", "h200_sxm")


@pytest.mark.parametrize("folder", MEASURED)
def test_the_bundled_timings_say_how_they_were_taken(folder: str) -> None:
    rows = data.llmsim_gemm(folder)
    assert set(rows["gemm_dtype"]) == {"bfloat16", "fp8"}
    assert (rows["latency_ms"] > 0).all()
    # every (dtype, m, n, k) once: 21 token counts x 14 x 14 weight shapes per dtype
    assert not rows.duplicated(["gemm_dtype", "m", "n", "k"]).any()
    assert len(rows) == 2 * 21 * 14 * 14
    env = json.loads((data.MEASURED_DIR / "llmsim" / folder / "env.json").read_text())
    assert env["cublas"].startswith("13.1") and env["torch"].startswith("2.11")
    assert {"H100": "h100_sxm", "H200": "h200_sxm"}[env["device_name"].split()[1]] == folder
    with pytest.raises(Exception, match="unknown device"):
        data.llmsim_gemm("a100_sxm")


def test_their_fp8_rows_are_the_scaled_gemm_without_the_quantisation_kernel() -> None:
    hw = load_hardware("h100_sxm")
    rows = data.llmsim_gemm("h100_sxm")
    plain = {g.op.dtype: g.op for g in gemm_groups(hw, rows)}
    alone = {g.op.dtype: g.op for g in library_groups(hw, rows)}
    assert np.all(np.asarray(plain["fp8"].pre_bytes) > 0)  # aiconfigurator's rows include it
    assert np.all(np.asarray(alone["fp8"].pre_bytes) == 0)
    assert np.array_equal(alone["fp8"].flops, plain["fp8"].flops)
    assert not np.any(plain["bf16"].pre_bytes) and not np.any(alone["bf16"].pre_bytes)
    assert device_groups(load_hardware("a100_sxm_80gb")) == []  # not measured here


@pytest.mark.parametrize("hw_id", MEASURED)
def test_the_library_is_fitted_on_each_measured_device(hw_id: str) -> None:
    eff = load_hardware(hw_id).efficiency
    lib = eff.gemm_libraries[LIBRARY]
    assert lib.peak_fraction["fp16"] == lib.peak_fraction["bf16"]
    assert lib.peak_fraction["int8"] == lib.peak_fraction["fp8"]
    assert 0.5 < lib.peak_fraction["bf16"] < 0.9 and 0.5 < lib.peak_fraction["fp8"] < 0.9
    assert set(lib.size_curves) == {"fp8"} and set(lib.extra_latency_s) == {"fp8"}
    for curve in (lib.size_curve, lib.size_curves["fp8"]):
        assert curve is not None and curve.points[-1][1] == 1.0
        for (x0, y0), (x1, y1) in pairwise(curve.points):
            assert y1 <= y0 * (1 + 0.9 * np.log(x1 / x0)) * (1 + 1e-3), (x0, x1)
    # the library replaces what it measured and keeps the device's quantisation kernel
    under = eff.gemm_for(LIBRARY)
    assert under.size_curves["fp8"] == lib.size_curves["fp8"]
    assert under.extra_latency_s["fp8"] == lib.extra_latency_s["fp8"]
    assert under.peak_fraction["fp8"] == lib.peak_fraction["fp8"]
    assert under.quant_fraction == eff.gemm.quant_fraction
    text = calibrate.calibration_path(hw_id).read_text()
    assert f"simulator/data/measured/llmsim/{hw_id}/" in text
    assert LIBRARY not in load_hardware("a100_sxm_80gb").efficiency.gemm_libraries


def test_h200_is_fitted_to_its_own_aiconfigurator_tables_not_h100s() -> None:
    # aiconfigurator's H200 tables (vLLM 0.14.0's kernels, as H100's): the GEMM, attention,
    # quantisation-kernel and collective factors are H200's own fit, laid over what its spec
    # borrows from H100 SXM (`attention_from`, `collective_from`, which a spec of one's own
    # copied from it still follows)
    base = load_hardware("h200_sxm", calibrated=False)
    fitted = load_hardware("h200_sxm")
    h100 = load_hardware("h100_sxm").efficiency
    assert (
        base.efficiency.attention
        == load_hardware("h100_sxm", calibrated=False).efficiency.attention
    )
    assert fitted.efficiency.attention != h100.attention
    assert fitted.efficiency.collective != h100.collective
    assert fitted.efficiency.gemm.quant_fraction != h100.gemm.quant_fraction
    peaks, written = fitted.efficiency.gemm.peak_fraction, base.efficiency.gemm.peak_fraction
    assert peaks["bf16"] != written["bf16"] and peaks["fp8"] != written["fp8"]
    assert peaks["fp16"] == peaks["bf16"] and peaks["int8"] == peaks["fp8"]
    assert fitted.efficiency.memory.stream_fraction == base.efficiency.memory.stream_fraction
    assert (fitted.compute, fitted.memory) == (base.compute, base.memory)
    text = calibrate.calibration_path("h200_sxm").read_text()
    assert "simulator/data/measured/aiconfigurator/h200_sxm/" in text
    assert "simulator/data/measured/llmsim/h200_sxm/" in text  # the cublas-13.1 library


def test_the_suite_is_the_fitted_rows_of_both_devices() -> None:
    df = gemm_library_suite()
    assert set(df["suite"]) == {SUITE} and df["fitted"].all()
    assert set(df["device"]) == set(MEASURED)
    assert len(df) == 2 * len(data.llmsim_gemm("h100_sxm"))
    # the fit leaves each device within a loose bound of its committed error (11-13%)
    for _, rows in df.groupby("device"):
        assert rows["ape_pct"].mean() < 25.0


def test_tensorrt_llm_runs_the_measured_library_where_the_device_has_it() -> None:
    assert load_engine("trtllm").gemm_library == LIBRARY
    assert load_engine("trtllm-0.6").gemm_library is None  # TensorRT's own tactics

    def seconds(hardware: str, engine: str, dtype: str, m: int) -> float:
        cost = gemm_cost(hardware=hardware, engine=engine, dtype=dtype, m=m, n=8192, k=8192)
        return float(np.ravel(cost.kernel.time_s)[0])

    lib = load_hardware("h100_sxm").with_gemm_library(LIBRARY)
    alone = gemm_cost(hardware=lib, m=512, n=8192, k=8192)  # bf16: no quantisation either way
    assert seconds("h100_sxm", "trtllm", "bf16", 512) == pytest.approx(float(alone.time_s[0]))
    # cuBLASLt's fp8 GEMM alone, as measured, against the factors fitted to vLLM's fp8 rows
    # (CUTLASS after the quantisation kernel); both engines fuse the quantisation away
    assert seconds("h100_sxm", "trtllm", "fp8", 512) < seconds("h100_sxm", "vllm", "fp8", 512)
    # no measurements of it on B200: the device's own factors for both engines
    assert seconds("b200", "trtllm", "bf16", 512) == seconds("b200", "vllm", "bf16", 512)
    # TensorRT-LLM 0.5-0.6's engines keep the device's factors
    old = seconds("h100_sxm", "trtllm-0.6", "bf16", 512)
    assert old == seconds("h100_sxm", "vllm", "bf16", 512)


def test_h200s_overlay_builds_the_spec_the_loader_builds() -> None:
    import yaml

    from simulator.specs.loader import calibrated_hardware

    fitted = yaml.safe_load(calibrate.calibration_path("h200_sxm").read_text())
    # what H100's overlay holds: every family aiconfigurator's tables fit, and the library
    h100 = yaml.safe_load(calibrate.calibration_path("h100_sxm").read_text())
    assert set(fitted["efficiency"]) == set(h100["efficiency"])
    assert calibrated_hardware("h200_sxm", fitted) == load_hardware("h200_sxm")
