"""Fitting a family: a parameter vector applied to a hardware spec, and the robust least squares.

Each family is fitted on log(predicted / measured) with soft-L1 loss, the other factors of the
spec held at their current values; the fitted vector is rounded to SIGNIFICANT digits before it
is applied, so that the written YAML reproduces the reported MAPE.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from simulator.calibrate.families import (
    FAMILIES,
    LIBRARY_FAMILY,
    LIBRARY_TILES_M_MIN,
    MEASURED_DEVICE_FAMILY,
    MEASURED_DEVICE_FP8_FAMILY,
    MEASURED_LIBRARY,
    MEASURED_LIBRARY_FAMILIES,
    TILE_MARGIN_PCT,
    Family,
)
from simulator.specs.hardware import (
    ComputeDtype,
    EfficiencySpec,
    GemmEfficiency,
    GemmKey,
    GemmLibrary,
    HardwareSpec,
)
from simulator.specs.loader import load_hardware
from simulator.validate.gemm_library import device_groups
from simulator.validate.layers import LIBRARY
from simulator.validate.operators import Group, op_time

SIGNIFICANT = 4  # digits written to the YAML


def _set(tree: dict[str, Any], path: str, value: float) -> None:
    *parents, leaf = path.split(".")
    node = tree
    for key in parents:
        node = node[key]
    if isinstance(node, list):
        node[int(leaf)][1] = value
    else:
        node[leaf] = value


def _with_curves(eff: dict[str, Any], family: Family) -> None:
    """Give each fitted curve its knots: y = 1 everywhere, except the first knot of the group
    latency curve, which is the base latency (= 1) and stays pinned."""
    for path, xs in family.curves.items():
        *parents, leaf = path.split(".")
        node = eff
        for key in parents:
            node = node[key]
        old = node.get(leaf) or node.get("size_curve") or {"points": [[1.0, 1.0]]}
        node[leaf] = [[x, _curve_at(old, x)] for x in xs]
        if "latency_group" not in path:
            node[leaf][-1][1] = 1.0


def _curve_at(curve: dict[str, Any] | list[Any], x: float) -> float:
    points = curve["points"] if isinstance(curve, dict) else curve
    xs = np.log([p[0] for p in points])
    ys = [p[1] for p in points]
    return float(np.interp(np.log(x), xs, ys))


def _to_spec(eff: dict[str, Any]) -> EfficiencySpec:
    tree = _as_points(eff)
    return EfficiencySpec.model_validate(tree)


def _as_points(node: Any) -> Any:
    """Curves held as [[x, y], ...] lists while fitting become {"points": ...} for the schema."""
    if isinstance(node, dict):
        return {k: _as_points(v) for k, v in node.items()}
    if isinstance(node, list) and node and isinstance(node[0], list):
        return {"points": [list(p) for p in node]}
    return node


# -- fitting ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FitReport:
    family: str
    rows: int
    mape_before_pct: float
    mape_after_pct: float


def print_gemm_fit(
    report: FitReport, factors: GemmEfficiency | GemmLibrary, dtype: ComputeDtype
) -> None:
    """What a device's fitting entry point prints (`python -m simulator.calibrate.amd`,
    `.nvfp4`): the fit's error and `dtype`'s fitted GEMM factors, to copy into its YAML."""
    print(
        f"{report.family}: {report.rows} rows, MAPE {report.mape_before_pct:.2f}% -> "
        f"{report.mape_after_pct:.2f}%"
    )
    for name in ("peak_fraction", "extra_latency_s", "size_curves"):
        print(f"{name}.{dtype}:", getattr(factors, name)[dtype])


def predict(groups: list[Group], hw: HardwareSpec) -> np.ndarray:
    """Predicted seconds of every measured row of `groups` on `hw`."""
    return np.concatenate([op_time(g.op, hw, len(g.rows)) for g in groups])


def _mape(groups: list[Group], hw: HardwareSpec) -> float:
    meas = np.concatenate([g.measured_s for g in groups])
    return float(np.mean(np.abs(predict(groups, hw) - meas) / meas) * 100)


def fit_family(
    hw: HardwareSpec, device: str, family: Family, groups: list[Group] | None = None
) -> tuple[HardwareSpec, FitReport]:
    """Fit one family's parameters on `hw` (other factors held) to its rows (`groups`, default:
    the family's rows on `device`); return the new spec."""
    groups = family.rows(hw, device) if groups is None else groups
    if not groups:
        return hw, FitReport(family.name, 0, float("nan"), float("nan"))
    before = _mape(groups, hw)
    eff = hw.efficiency.model_dump()
    _with_curves(eff, family)
    measured = np.concatenate([g.measured_s for g in groups])
    params = [p for p in family.params if p.applies(hw)]

    def spec_for(x: np.ndarray) -> HardwareSpec:
        steps: dict[str, dict[int, float]] = {}
        for p, v in zip(params, x, strict=True):
            head, _, leaf = p.path.rpartition(".")
            if leaf.startswith("step"):
                steps.setdefault(head, {})[int(leaf[4:])] = float(v)
            else:
                _set(eff, p.path, float(v))
        for path, by_index in steps.items():
            ys = np.exp(-np.cumsum([by_index[i] for i in sorted(by_index, reverse=True)]))
            for i, y in zip(sorted(by_index, reverse=True), ys, strict=True):
                _set(eff, f"{path}.{i}", float(y))  # y[i] = y[i+1] / exp(step i), y[-1] = 1
        return hw.model_copy(update={"efficiency": _to_spec(eff)})

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict(groups, spec_for(x)) / measured)

    x0 = np.clip([p.initial for p in params], [p.lower for p in params], [p.upper for p in params])
    free = _sensitive(residuals, x0, [(p.lower, p.upper) for p in params])
    free |= np.array([".step" in p.path for p in params])  # a curve keeps every step
    spec_for(x0)  # every parameter back at its start
    params = [p for p, f in zip(params, free, strict=True) if f]
    x0 = x0[free]
    lo = np.array([p.lower for p in params])
    hi = np.array([p.upper for p in params])
    steps = np.array([".step" in p.path for p in params])
    fits = [
        least_squares(
            residuals,
            np.clip(np.where(steps, x0 + offset, x0), lo, hi),
            bounds=(lo, hi),
            loss="soft_l1",
            f_scale=0.1,
            x_scale="jac",
            max_nfev=300,
        )
        for offset in family.step_starts
    ]
    fit = min(fits, key=lambda f: f.cost)  # the first of equals: one start fits as before
    fitted = spec_for(_round(fit.x))
    return fitted, FitReport(family.name, len(measured), before, _mape(groups, fitted))


def _sensitive(
    residuals: Callable[[np.ndarray], np.ndarray],
    x0: np.ndarray,
    bounds: list[tuple[float, float]],
) -> np.ndarray:
    """Which parameters move some fitted row: each is moved alone to the far end of its
    bounds. One that moves none (an fp8 KV factor on a device without fp8 KV rows) is not
    fitted and keeps its starting value, not whatever the optimiser leaves at a bound."""
    base = residuals(x0)
    free = np.ones(len(x0), dtype=bool)
    for i, (lower, upper) in enumerate(bounds):
        x = x0.copy()
        x[i] = upper if upper - x0[i] >= x0[i] - lower else lower
        free[i] = bool(np.any(np.abs(residuals(x) - base) > 1e-12))
    return free


def _round(x: np.ndarray) -> np.ndarray:
    return np.array([float(f"{v:.{SIGNIFICANT}g}") for v in x])


def layer_mape(groups: list[Group], hw: HardwareSpec) -> float:
    """MAPE of the per-row sums of `groups` (projection groups over the same profile rows: a
    layer's GEMM time) on `hw`."""
    predicted = predict(groups, hw).reshape(len(groups), -1).sum(axis=0)
    measured = np.sum([g.measured_s for g in groups], axis=0)
    return float(np.mean(np.abs(predicted - measured) / measured) * 100)


def calibrate_library(hw: HardwareSpec) -> tuple[GemmLibrary | None, FitReport]:
    """Fit LIBRARY_FAMILY's GEMM library on the calibrated spec `hw` (its data ceiling kept:
    Vidur's layers hold weights); None where the device has no profile of it. bf16 takes the
    fitted fp16 peak fraction (the same tensor path). The smallest row tile is the one of
    LIBRARY_TILES_M_MIN whose fit best predicts the fitted rows' layers (`layer_mape`: the
    sums a step adds up, where a per-projection MAPE weighs the smallest GEMMs as much as the
    largest), the device's own unless another is better by more than TILE_MARGIN_PCT."""
    own = hw.efficiency.gemm.tile_m_min
    groups = LIBRARY_FAMILY.rows(hw, hw.id)
    if not groups:
        return None, FitReport(LIBRARY_FAMILY.name, 0, float("nan"), float("nan"))
    best: tuple[HardwareSpec, FitReport, float] | None = None
    for tile in sorted(LIBRARY_TILES_M_MIN, key=lambda t: t != own):  # the device's first
        trial = hw.with_gemm(hw.efficiency.gemm.model_copy(update={"tile_m_min": tile}))
        fitted, report = fit_family(trial, hw.id, LIBRARY_FAMILY, groups)
        layers = layer_mape(groups, fitted)
        if best is None or layers < best[2] - TILE_MARGIN_PCT:
            best = fitted, report, layers
    assert best is not None
    fitted, report, _ = best
    gemm = fitted.efficiency.gemm
    peak = gemm.peak_fraction["fp16"]
    library = GemmLibrary(
        peak_fraction={"bf16": peak, "fp16": peak},
        size_curve=gemm.size_curve,
        tile_m_min=gemm.tile_m_min,
    )
    return library, report


def calibrate_measured_library(hw: HardwareSpec) -> tuple[GemmLibrary | None, list[FitReport]]:
    """Fit MEASURED_LIBRARY_FAMILIES' GEMM library (this project's timings of `hw`) on the
    calibrated spec `hw`, its data ceiling kept (the GEMMs ran on random data); None where this
    project has not measured the device. fp16 takes bf16's peak fraction, int8 fp8's (the same
    tensor paths)."""
    reports = []
    fitted = hw
    for family in MEASURED_LIBRARY_FAMILIES:
        fitted, report = fit_family(fitted, hw.id, family)
        reports.append(report)
    if not any(r.rows for r in reports):
        return None, reports
    gemm = fitted.efficiency.gemm
    peaks = {"bf16": gemm.peak_fraction["bf16"], "fp16": gemm.peak_fraction["bf16"]}
    if "fp8" in gemm.size_curves:
        peaks |= {"fp8": gemm.peak_fraction["fp8"], "int8": gemm.peak_fraction["fp8"]}
    library = GemmLibrary(
        peak_fraction=peaks,
        size_curve=gemm.size_curve,
        size_curves={k: v for k, v in gemm.size_curves.items() if k == "fp8"},
        extra_latency_s={k: v for k, v in gemm.extra_latency_s.items() if k == "fp8"},
    )
    return library, reports


def same_tensor_paths(peaks: Mapping[GemmKey, float]) -> dict[GemmKey, float]:
    """`peaks` with fp16 at bf16's fitted fraction (the same tensor-core path) and, where the
    device has both, int8 at fp8's (the same tensor rate; no int8 measurements are bundled)."""
    out = dict(peaks)
    out["fp16"] = out["bf16"]
    if "fp8" in out and "int8" in out:
        out["int8"] = out["fp8"]
    return out


def calibrate_timings(
    hw: HardwareSpec, groups: list[Group]
) -> tuple[EfficiencySpec, list[FitReport]]:
    """The efficiency of `hw` with its own GEMM factors fitted to GEMM timings of the device
    (`groups`: `validate.gemm_library.library_groups` of a tools/measure_gpu.py table):
    MEASURED_DEVICE_FAMILY on the bf16 rows, then MEASURED_DEVICE_FP8_FAMILY on the fp8 rows
    where there are any. fp16 takes bf16's peak fraction, int8 fp8's (the same tensor paths)."""
    reports = []
    for family, dtype in ((MEASURED_DEVICE_FAMILY, "bf16"), (MEASURED_DEVICE_FP8_FAMILY, "fp8")):
        rows = [g for g in groups if g.op.dtype == dtype]
        if rows:
            hw, report = fit_family(hw, hw.id, family, rows)
            reports.append(report)
    peaks = same_tensor_paths(hw.efficiency.gemm.peak_fraction)
    gemm = hw.efficiency.gemm.model_copy(update={"peak_fraction": peaks})
    return hw.efficiency.model_copy(update={"gemm": gemm}), reports


def calibrate(hw_id: str, device: str | None) -> tuple[EfficiencySpec, list[FitReport]]:
    """Fit every family in order on the hand-written spec of `hw_id` (no overlay), as the
    aiconfigurator data of `device` were measured (GEMMs on uninitialised weights: no data
    ceiling, which the returned efficiency keeps); then, on that result, the GEMM library of
    LIBRARY_FAMILY where the device has measurements of it (`efficiency.gemm_libraries`). A
    device without aiconfigurator data (`device` None) fits its GEMM factors to this project's
    own timings of it instead (`calibrate_timings`). Last, on either, the library of those timings
    (MEASURED_LIBRARY) where there are some."""
    base = load_hardware(hw_id, calibrated=False)
    reports: list[FitReport] = []
    if device is None:
        eff, reports = calibrate_timings(base, device_groups(base))
        libraries: dict[str, GemmLibrary] = {}
    else:
        eff, libraries = _calibrate_aiconfigurator(base, device, reports)
    measured, measured_reports = calibrate_measured_library(
        base.model_copy(update={"efficiency": eff})
    )
    reports += measured_reports
    if measured is not None:
        libraries[MEASURED_LIBRARY] = measured
    if libraries:
        eff = eff.model_copy(update={"gemm_libraries": libraries})
    return eff, reports


def _calibrate_aiconfigurator(
    base: HardwareSpec, device: str, reports: list[FitReport]
) -> tuple[EfficiencySpec, dict[str, GemmLibrary]]:
    """FAMILIES on aiconfigurator's data of `device`, then LIBRARY_FAMILY's library; the
    fitted efficiency (data ceiling restored) and the libraries fitted; appends to `reports`."""
    hw = base.without_data_ceiling()
    for family in FAMILIES:
        hw, report = fit_family(hw, device, family)
        reports.append(report)
    eff = hw.efficiency
    peaks = same_tensor_paths(eff.gemm.peak_fraction)
    gemm = eff.gemm.model_copy(
        update={"peak_fraction": peaks, "data_ceiling": base.efficiency.gemm.data_ceiling}
    )
    eff = eff.model_copy(update={"gemm": gemm})
    library, report = calibrate_library(base.model_copy(update={"efficiency": eff}))
    reports.append(report)
    return eff, {} if library is None else {LIBRARY: library}
