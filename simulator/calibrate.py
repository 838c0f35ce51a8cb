"""Fit the efficiency factors of devices with operator measurements, reproducibly.

    python -m simulator.calibrate [--device h100_sxm ...] [--check]

For each device with bundled operator data (aiconfigurator: vLLM 0.14.0 kernels on A100 SXM and
H100 SXM; see simulator/data/README.md) this fits, family by family, the named factors of the
hardware spec's `efficiency:` section by robust least squares on log(predicted / measured),
using the cost model's own operator constructors and roofline (the `ops` validation suite's
code path). The result is written to `hardware_specs/calibration/<id>.yaml`, which the loader
lays over the hand-written values of `hardware_specs/<id>.yaml` (those keep their datasheet
sources and remain the values for every device without measurements).

Only operator-level rows are fitted. The `layers` and `iteration` validation suites are
checks on data that was not used here. `--check` refits and fails if the committed files
differ from what the data gives.

Curves are fitted at fixed knots (log-spaced over the measured range); the last knot of each
multiplier curve is pinned to 1 so that the family's peak fraction stays identifiable.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import least_squares

from simulator.specs.engine import EngineOverhead
from simulator.specs.hardware import EfficiencySpec, HardwareSpec
from simulator.specs.loader import ENGINES_DIR, hardware_dirs, load_engine, load_hardware
from simulator.validate import data
from simulator.validate.iteration import ENGINE, ENGINE_FIT, ENGINE_FIT_MODELS, iteration_cases
from simulator.validate.operators import (
    Group,
    attention_groups,
    collective_groups,
    gemm_groups,
    op_time,
)

CALIBRATION_DIR = "calibration"
SIGNIFICANT = 4  # digits written to the YAML; --check compares at this precision
_US = 1e-6


@dataclass(frozen=True)
class Param:
    """One fitted number at a dotted path into the efficiency section. A curve's knots are
    fitted as steps: `path.stepN` is log(y[N+1] / y[N]), and the last knot is 1. `splits`
    names the decode split-KV choices (`attention.decode_split`) the number exists for; on a
    device with another choice it is not fitted and keeps its hand-written value."""

    path: str
    initial: float
    lower: float
    upper: float
    splits: tuple[str, ...] = ()

    def applies(self, hw: HardwareSpec) -> bool:
        return not self.splits or hw.efficiency.attention.decode_split in self.splits


@dataclass(frozen=True)
class Family:
    """A group of operator rows and the parameters fitted to them."""

    name: str
    rows: Callable[[HardwareSpec, str], list[Group]]
    params: tuple[Param, ...]
    curves: dict[str, tuple[float, ...]]  # curve path -> knot x positions (last pinned to 1)


def _knots(path: str, xs: tuple[float, ...], *, elasticity: float) -> list[Param]:
    """Steps between adjacent knots. Efficiency may fall by any factor from one knot to the
    next (down to 1/50) but rise only so far that its elasticity stays below `elasticity`
    (y1 <= y0 (1 + e ln(x1 / x0)) under log-linear interpolation): then time, which grows as
    work / efficiency with work proportional to x, never falls as x grows."""
    return [
        Param(
            f"{path}.step{i}",
            0.0,
            -np.log(50.0),
            float(np.log1p(elasticity * np.log(xs[i + 1] / xs[i]))),
        )
        for i in range(len(xs) - 1)
    ]


FLOP_KNOTS = (1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12)
BYTE_KNOTS = (1e5, 1e6, 1e7, 1e8, 1e9)
SEQ_KNOTS = (1.0, 16.0, 128.0, 1024.0, 8192.0, 131072.0)
WORK_KNOTS = (1.0, 8.0, 64.0, 512.0, 4096.0, 32768.0, 262144.0)
GROUP_KNOTS = (1.0, 2.0, 4.0, 8.0, 16.0, 64.0)
MSG_KNOTS = (1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9)


def _gemm_rows(dtype: str) -> Callable[[HardwareSpec, str], list[Group]]:
    def rows(hw: HardwareSpec, device: str) -> list[Group]:
        groups = gemm_groups(hw, data.aiconfigurator(device, "gemm"))
        return [g for g in groups if g.op.dtype == dtype]

    return rows


def _attention_rows(phase: str, table: str) -> Callable[[HardwareSpec, str], list[Group]]:
    def rows(hw: HardwareSpec, device: str) -> list[Group]:
        return attention_groups(data.aiconfigurator(device, table), phase=phase)

    return rows


def _all_reduce_rows(hw: HardwareSpec, device: str) -> list[Group]:
    return collective_groups(hw, data.aiconfigurator(device, "nccl"))


FAMILIES = (
    Family(
        "gemm_bf16",
        _gemm_rows("bf16"),
        (
            Param("gemm.peak_fraction.bf16", 0.8, 0.3, 1.0),
            Param("kernel_latency_s", 3 * _US, 0.5 * _US, 20 * _US),
            *_knots("gemm.size_curve", FLOP_KNOTS, elasticity=0.9),
            *_knots("memory.size_curve", BYTE_KNOTS, elasticity=0.9),
        ),
        {"gemm.size_curve": FLOP_KNOTS, "memory.size_curve": BYTE_KNOTS},
    ),
    Family(
        "gemm_fp8",
        _gemm_rows("fp8"),
        (
            Param("gemm.peak_fraction.fp8", 0.7, 0.1, 1.0),
            Param("gemm.extra_latency_s.fp8", 1 * _US, 0.0, 50 * _US),
            Param("gemm.quant_fraction.fp8", 0.5, 0.01, 1.0),
            *_knots("gemm.size_curves.fp8", FLOP_KNOTS, elasticity=0.9),
            *_knots("gemm.quant_size_curve", BYTE_KNOTS, elasticity=0.9),
        ),
        {"gemm.size_curves.fp8": FLOP_KNOTS, "gemm.quant_size_curve": BYTE_KNOTS},
    ),
    Family(
        "attention_prefill",
        _attention_rows("prefill", "context_attention"),
        (
            Param("attention.prefill_fraction", 0.55, 0.1, 1.0),
            Param("attention.prefill_fixed_s", 10 * _US, 1 * _US, 50 * _US),
            Param("attention.prefill_wave_s", 1 * _US, 0.0, 50 * _US),
            Param("attention.fp8_kv_factor", 1.0, 0.5, 1.5),
            *_knots("attention.prefill_len_curve", SEQ_KNOTS, elasticity=0.5),
            *_knots("attention.prefill_parallel_curve", WORK_KNOTS, elasticity=0.5),
            *_knots("attention.prefill_group_curve", GROUP_KNOTS, elasticity=0.4),
        ),
        {
            "attention.prefill_len_curve": SEQ_KNOTS,
            "attention.prefill_parallel_curve": WORK_KNOTS,
            "attention.prefill_group_curve": GROUP_KNOTS,
        },
    ),
    Family(
        "attention_decode",
        _attention_rows("decode", "generation_attention"),
        (
            Param("attention.decode_fraction", 0.8, 0.2, 1.0),
            Param("attention.decode_fixed_s", 10 * _US, 1 * _US, 50 * _US),
            Param("attention.decode_wave_s", 1 * _US, 0.0, 50 * _US),
            Param("attention.decode_block_bytes_per_s", 20e9, 1e9, 200e9),
            Param("attention.decode_gqa_copy_s", 5 * _US, 0.0, 20 * _US, splits=("fa2",)),
            *_knots("attention.decode_len_curve", SEQ_KNOTS, elasticity=0.5),
            *_knots("attention.decode_parallel_curve", WORK_KNOTS, elasticity=0.5),
            *_knots("attention.decode_group_curve", GROUP_KNOTS, elasticity=0.0),
        ),
        {
            "attention.decode_len_curve": SEQ_KNOTS,
            "attention.decode_parallel_curve": WORK_KNOTS,
            "attention.decode_group_curve": GROUP_KNOTS,
        },
    ),
    Family(
        "all_reduce",
        _all_reduce_rows,
        (
            Param("collective.busbw_fraction", 0.8, 0.1, 1.2),
            Param("collective.latency_s", 15 * _US, 1 * _US, 100 * _US),
            *_knots("collective.size_curve", MSG_KNOTS, elasticity=0.9),
            *[Param(f"collective.latency_group_curve.{i}", 1.0, 0.2, 5.0) for i in (1, 2)],
        ),
        {"collective.size_curve": MSG_KNOTS, "collective.latency_group_curve": (2.0, 4.0, 8.0)},
    ),
)


# -- applying parameter vectors to a spec ------------------------------------------------------
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


def _predict(groups: list[Group], hw: HardwareSpec) -> np.ndarray:
    """Predicted seconds of every measured row of `groups` on `hw`."""
    return np.concatenate([op_time(g.op, hw, len(g.rows)) for g in groups])


def _mape(groups: list[Group], hw: HardwareSpec) -> float:
    meas = np.concatenate([g.measured_s for g in groups])
    return float(np.mean(np.abs(_predict(groups, hw) - meas) / meas) * 100)


def fit_family(hw: HardwareSpec, device: str, family: Family) -> tuple[HardwareSpec, FitReport]:
    """Fit one family's parameters on `hw` (other factors held); return the new spec."""
    groups = family.rows(hw, device)
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
        return np.log(_predict(groups, spec_for(x)) / measured)

    x0 = np.array([p.initial for p in params])
    lo = np.array([p.lower for p in params])
    hi = np.array([p.upper for p in params])
    fit = least_squares(
        residuals,
        np.clip(x0, lo, hi),
        bounds=(lo, hi),
        loss="soft_l1",
        f_scale=0.1,
        x_scale="jac",
        max_nfev=300,
    )
    fitted = spec_for(_round(fit.x))
    return fitted, FitReport(family.name, len(measured), before, _mape(groups, fitted))


def _round(x: np.ndarray) -> np.ndarray:
    return np.array([float(f"{v:.{SIGNIFICANT}g}") for v in x])


def calibrate(hw_id: str, device: str) -> tuple[EfficiencySpec, list[FitReport]]:
    """Fit every family in order on the hand-written spec of `hw_id` (no overlay)."""
    hw = load_hardware(hw_id, calibrated=False)
    reports = []
    for family in FAMILIES:
        hw, report = fit_family(hw, device, family)
        reports.append(report)
    eff = hw.efficiency
    peaks = dict(eff.gemm.peak_fraction)
    peaks["fp16"] = peaks["bf16"]  # the same tensor-core path as bf16
    if "fp8" in peaks and "int8" in peaks:
        peaks["int8"] = peaks["fp8"]  # the same tensor rate; no int8 measurements bundled
    eff = eff.model_copy(update={"gemm": eff.gemm.model_copy(update={"peak_fraction": peaks})})
    return eff, reports


# -- the engine of the iteration data -----------------------------------------------------------
ENGINE_PARAMS = (
    Param("step_s", 5e-3, 0.0, 0.1),
    Param("per_seq_s", 1e-4, 0.0, 0.01),
    # Start above the GPU time of a small step: below it, max(GPU, launches) hides the launch
    # cost and the fit has no gradient to follow.
    Param("launch_eager_s", 40e-6, 1e-6, 200e-6),
)
ENGINE_HARDWARE = data.SPLITWISE_HARDWARE["a100-80gb"]


def calibrate_engine(hw: HardwareSpec) -> tuple[EngineOverhead, FitReport]:
    """Fit the CPU overheads of the `vllm-0.2` profile to the Splitwise rows of
    ENGINE_FIT_MODELS on the (calibrated) DGX-A100 spec `hw`; other models stay held out."""
    base = load_engine(ENGINE, calibrated=False)
    measured = data.splitwise()

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


# -- the generated file ---------------------------------------------------------------------------
FITTED_KEYS = {
    "gemm": (
        "peak_fraction",
        "size_curve",
        "size_curves",
        "extra_latency_s",
        "quant_fraction",
        "quant_size_curve",
    ),
    "memory": ("size_curve",),
    "attention": (
        "prefill_fraction",
        "prefill_fixed_s",
        "prefill_wave_s",
        "prefill_len_curve",
        "prefill_parallel_curve",
        "prefill_group_curve",
        "decode_fraction",
        "decode_fixed_s",
        "decode_wave_s",
        "decode_len_curve",
        "decode_parallel_curve",
        "decode_group_curve",
        "decode_block_bytes_per_s",
        "decode_gqa_copy_s",
        "fp8_kv_factor",
    ),
    "collective": ("busbw_fraction", "latency_s", "size_curve", "latency_group_curve"),
}


def fitted_section(eff: EfficiencySpec) -> dict[str, Any]:
    """The part of the efficiency section the calibration owns, as plain YAML data."""
    dumped = eff.model_dump()
    out: dict[str, Any] = {"kernel_latency_s": dumped["kernel_latency_s"]}
    for group, keys in FITTED_KEYS.items():
        out[group] = {k: dumped[group][k] for k in keys}
    return _rounded(out)


def _rounded(node: Any) -> Any:
    if isinstance(node, dict) and set(node) == {"points"}:  # knots stay exact, values round
        return {"points": [[float(x), _rounded(float(y))] for x, y in node["points"]]}
    if isinstance(node, dict):
        return {k: _rounded(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_rounded(v) for v in node]
    if isinstance(node, float):
        return float(f"{node:.{SIGNIFICANT}g}")
    return node


def render(hw_id: str, device: str, eff: EfficiencySpec, reports: list[FitReport]) -> str:
    lines = [
        f"# Calibrated efficiency factors for {hw_id}. GENERATED: do not edit by hand.",
        "# Regenerate with `python -m simulator.calibrate`; `--check` verifies this file.",
        f"# Fitted to simulator/data/measured/aiconfigurator/{device}/ (NVIDIA aiconfigurator,",
        "# per-kernel timings of vLLM 0.14.0's GEMM, flash-attention and NCCL kernels), by robust",
        f"# least squares on log(predicted / measured). Laid over hardware_specs/{hw_id}.yaml.",
        "# Fit per family (rows, MAPE before -> after):",
    ]
    lines += [
        f"#   {r.family}: {r.rows} rows, {r.mape_before_pct:.1f}% -> {r.mape_after_pct:.1f}%"
        for r in reports
        if r.rows
    ]
    lines.append("# fp16 takes bf16's peak fraction (same tensor path); int8 takes fp8's.")
    lines.append("# quant_fraction: vLLM's fp8 activation-quantisation kernel run alone (an engine")
    lines.append("# that fuses it into the kernel before, `fused_activation_quant`, skips it).")
    body = yaml.safe_dump(
        {"efficiency": fitted_section(eff)}, sort_keys=False, default_flow_style=None, width=100
    )
    return "\n".join(lines) + "\n" + body


def calibration_path(hw_id: str) -> Path:
    base = next(d for d in hardware_dirs() if (d / f"{hw_id}.yaml").is_file())
    return base / CALIBRATION_DIR / f"{hw_id}.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m simulator.calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--device",
        action="append",
        choices=sorted(data.AIC_DEVICES.values()),
        help="hardware id to calibrate (default: all with data)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="refit and fail if a committed calibration file differs",
    )
    args = parser.parse_args(argv)
    wanted = set(args.device or data.AIC_DEVICES.values())
    stale: list[str] = []
    outputs: list[tuple[Path, str]] = []
    for device, hw_id in sorted(data.AIC_DEVICES.items()):
        if hw_id not in wanted:
            continue
        eff, reports = calibrate(hw_id, device)
        outputs.append((calibration_path(hw_id), render(hw_id, device, eff, reports)))
        if hw_id == ENGINE_HARDWARE:  # the engine is fitted on this device's fitted spec
            hw = load_hardware(hw_id, calibrated=False).model_copy(update={"efficiency": eff})
            overhead, report = calibrate_engine(hw)
            reports.append(report)
            path = ENGINES_DIR / CALIBRATION_DIR / f"{ENGINE}.yaml"
            outputs.append((path, render_engine(overhead, report)))
        for r in reports:
            if r.rows:
                print(
                    f"{hw_id:14} {r.family:18} {r.rows:6d} rows  MAPE "
                    f"{r.mape_before_pct:6.1f}% -> {r.mape_after_pct:6.1f}%"
                )
    for path, text in outputs:
        if args.check:
            committed = yaml.safe_load(path.read_text()) if path.is_file() else None
            if committed != yaml.safe_load(text):
                stale.append(str(path))
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print("calibration files differ from a refit: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
