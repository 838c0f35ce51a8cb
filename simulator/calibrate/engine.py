"""The engine-overhead fit: the `vllm-0.2` profile's CPU overheads from the Splitwise rows.

Fitted on the calibrated spec of ENGINE_HARDWARE (DGX-A100) to the rows of ENGINE_FIT_MODELS
only; every other model's rows are held out for `llmsim validate` (iteration suites).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import yaml
from scipy.optimize import least_squares

from simulator.calibrate.families import Param
from simulator.calibrate.fit import FitReport, _round
from simulator.calibrate.output import _rounded
from simulator.specs.engine import EngineOverhead
from simulator.specs.hardware import HardwareSpec
from simulator.specs.loader import load_engine
from simulator.validate import data
from simulator.validate.iteration import (
    ENGINE,
    ENGINE_FIT,
    ENGINE_FIT_DEVICE,
    ENGINE_FIT_MODELS,
    iteration_cases,
)

ENGINE_PARAMS = (
    Param("step_s", 5e-3, 0.0, 0.1),
    Param("per_seq_s", 1e-4, 0.0, 0.01),
    # Start above the GPU time of a small step: below it, max(GPU, launches) hides the launch
    # cost and the fit has no gradient to follow.
    Param("launch_eager_s", 40e-6, 1e-6, 200e-6),
)
# The device whose Splitwise rows the engine is fitted to (the iteration suites' own choice).
ENGINE_HARDWARE = ENGINE_FIT_DEVICE


def calibrate_engine(hw: HardwareSpec) -> tuple[EngineOverhead, FitReport]:
    """Fit the CPU overheads of the `vllm-0.2` profile to the Splitwise rows of
    ENGINE_FIT_MODELS on the (calibrated) DGX-A100 spec `hw`; other models stay held out."""
    base = load_engine(ENGINE, calibrated=False)
    measured = data.splitwise(ENGINE_HARDWARE)

    def cases(x: np.ndarray) -> Any:
        update = {p.path: float(v) for p, v in zip(ENGINE_PARAMS, x, strict=True)}
        engine = base.model_copy(update={"overhead": base.overhead.model_copy(update=update)})
        return iteration_cases(hw, engine, measured)

    x0 = np.array([p.initial for p in ENGINE_PARAMS])
    rows = (cases(x0)["suite"] == ENGINE_FIT).to_numpy()

    def residuals(x: np.ndarray) -> np.ndarray:
        df = cases(x)
        return np.log(df["predicted_s"].to_numpy() / df["measured_s"].to_numpy())[rows]

    def mape(x: np.ndarray) -> float:
        return float(np.mean(np.abs(np.expm1(residuals(x)))) * 100)

    lo = np.array([p.lower for p in ENGINE_PARAMS])
    hi = np.array([p.upper for p in ENGINE_PARAMS])
    fit = least_squares(
        residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, x_scale="jac", max_nfev=200
    )
    x = _round(fit.x)
    update = {p.path: float(v) for p, v in zip(ENGINE_PARAMS, x, strict=True)}
    report = FitReport(f"engine {ENGINE}", int(rows.sum()), mape(x0), mape(x))
    return base.overhead.model_copy(update=update), report


def render_engine(overhead: EngineOverhead, report: FitReport) -> str:
    lines = [
        f"# Calibrated CPU overheads of the {ENGINE} engine profile. GENERATED: do not edit.",
        "# Regenerate with `python -m simulator.calibrate`; `--check` verifies this file.",
        "# Fitted to simulator/data/measured/splitwise/perf_model_a100.csv (Splitwise, ISCA'24:",
        "# vLLM of late 2023 on DGX-A100, fp16, eager), rows of "
        + ", ".join(ENGINE_FIT_MODELS)
        + " only,",
        f"# on the calibrated {ENGINE_HARDWARE} spec: {report.rows} rows, MAPE "
        f"{report.mape_before_pct:.1f}% -> {report.mape_after_pct:.1f}%. Other models' rows",
        "# are held out (llmsim validate: iteration_prefill, iteration_decode).",
    ]
    body = yaml.safe_dump({"overhead": _rounded(overhead.model_dump())}, sort_keys=False)
    return "\n".join(lines) + "\n" + body
