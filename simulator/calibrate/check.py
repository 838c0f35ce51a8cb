"""`--check`: do the committed calibration files predict what a refit predicts?

A fit of tens of thousands of rows leaves some numbers barely constrained: a curve's knot
below the smallest measured size, a step only a handful of rows touch, a fraction and a curve
that trade against each other. New numpy and scipy releases move those along the flat valley
of the fit (H100's fp8 size curve at 1 MFLOP: 171 in one environment, 28250 in another) while
every prediction stays put. So the check compares what the committed and the refitted factors
predict for the rows they were fitted to, family by family, and fails when the mean drift
exceeds MEAN_DRIFT_PCT or more than one row in a hundred drifts by over P99_DRIFT_PCT: that is
what a change of data, families or cost model does, and what optimiser noise does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.calibrate.families import (
    FAMILIES,
    LIBRARY_FAMILY,
    MEASURED_DEVICE_FAMILY,
    MEASURED_DEVICE_FP8_FAMILY,
    MEASURED_LIBRARY,
    MEASURED_LIBRARY_FAMILIES,
)
from simulator.calibrate.fit import predict
from simulator.specs.engine import EngineSpec
from simulator.specs.hardware import HardwareSpec
from simulator.validate import data
from simulator.validate.iteration import ENGINE_FIT, ENGINE_FIT_DEVICE, iteration_cases
from simulator.validate.layers import LIBRARY

MEAN_DRIFT_PCT = 0.5
P99_DRIFT_PCT = 1.0


@dataclass(frozen=True)
class Drift:
    """How far one family's predictions moved between the committed and refitted factors."""

    family: str
    rows: int
    mean_pct: float
    p99_pct: float

    @property
    def ok(self) -> bool:
        return self.mean_pct <= MEAN_DRIFT_PCT and self.p99_pct <= P99_DRIFT_PCT

    def __str__(self) -> str:
        return (
            f"{self.family}: {self.rows} rows, mean drift {self.mean_pct:.3f}%, "
            f"p99 {self.p99_pct:.3f}% (limits {MEAN_DRIFT_PCT}%, {P99_DRIFT_PCT}%)"
        )


def drift(family: str, committed: np.ndarray, refit: np.ndarray) -> Drift:
    """The drift of `refit` predictions from `committed` ones (seconds, row by row)."""
    if committed.shape != refit.shape:
        return Drift(family, int(refit.size), float("inf"), float("inf"))
    pct = np.abs(refit / committed - 1.0) * 100.0
    return Drift(family, int(pct.size), float(pct.mean()), float(np.percentile(pct, 99)))


def family_predictions(hw: HardwareSpec, device: str | None) -> dict[str, np.ndarray]:
    """Predicted seconds of every row each family was fitted to, as it was fitted: the
    aiconfigurator families of `device` without the data ceiling (their GEMMs ran on
    uninitialised weights; a device without them: its own GEMM timings, with it), each GEMM
    library with it and under that library."""
    out: dict[str, np.ndarray] = {}
    if device is None:
        for family in (MEASURED_DEVICE_FAMILY, MEASURED_DEVICE_FP8_FAMILY):
            if groups := family.rows(hw, hw.id):
                out[family.name] = predict(groups, hw)
    else:
        raw = hw.without_data_ceiling()
        out |= {f.name: predict(groups, raw) for f in FAMILIES if (groups := f.rows(raw, device))}
        if groups := LIBRARY_FAMILY.rows(hw, device):
            out[LIBRARY_FAMILY.name] = predict(groups, hw.with_gemm_library(LIBRARY))
    measured = hw.with_gemm_library(MEASURED_LIBRARY)
    for family in MEASURED_LIBRARY_FAMILIES:
        if groups := family.rows(measured, hw.id):
            out[family.name] = predict(groups, measured)
    return out


def hardware_drifts(
    committed: HardwareSpec, refit: HardwareSpec, device: str | None
) -> list[Drift]:
    """One Drift per family with rows on `device`."""
    before = family_predictions(committed, device)
    after = family_predictions(refit, device)
    empty = np.empty(0)
    return [drift(name, before.get(name, empty), p) for name, p in after.items()]


def engine_drift(hw: HardwareSpec, committed: EngineSpec, refit: EngineSpec) -> Drift:
    """The drift of the engine-fit Splitwise rows between two sets of engine overheads."""
    measured = data.splitwise(ENGINE_FIT_DEVICE)

    def fitted_rows(engine: EngineSpec) -> Any:
        df = iteration_cases(hw, engine, measured)
        return df.loc[df["suite"] == ENGINE_FIT, "predicted_s"].to_numpy(dtype=float)

    return drift(f"engine {refit.id}", fitted_rows(committed), fitted_rows(refit))
