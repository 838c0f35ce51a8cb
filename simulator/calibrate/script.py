"""The command: fit every device with data (and the engine on its device), then write the
calibration files or, with `--check`, compare them with the committed ones. Its help text is
the package docstring."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from simulator.calibrate.check import Drift, engine_drift, hardware_drifts
from simulator.calibrate.engine import ENGINE_HARDWARE, calibrate_engine, render_engine
from simulator.calibrate.fit import calibrate
from simulator.calibrate.output import calibration_path, render
from simulator.calibrate.own import calibrate_own_file
from simulator.errors import SpecError
from simulator.specs.loader import (
    ENGINES_DIR,
    calibrated_engine,
    calibrated_hardware,
    calibration_beside,
    load_engine,
    load_hardware,
)
from simulator.validate import data
from simulator.validate.iteration import ENGINE


def _devices() -> dict[str, str | None]:
    """Every hardware id with data to fit, and its aiconfigurator folder (None: a device with
    only this project's own GEMM timings)."""
    out: dict[str, str | None] = {hw_id: None for hw_id in data.LLMSIM_DEVICES.values()}
    out.update({hw_id: folder for folder, hw_id in data.AIC_DEVICES.items()})
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulator.calibrate",
        # the package (this module's parent, imported before it) holds the command's contract
        description=sys.modules["simulator.calibrate"].__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--device",
        action="append",
        choices=sorted(_devices()),
        help="hardware id to calibrate (default: all with data)",
    )
    parser.add_argument(
        "--gemm-csv",
        type=Path,
        metavar="FILE",
        help="a device of your own: GEMMs timed on it with tools/measure_gpu.py (with --hardware)",
    )
    parser.add_argument(
        "--hardware",
        type=Path,
        metavar="SPEC.yaml",
        help="your spec file; its GEMM factors are fitted to --gemm-csv and written to "
        "calibration/<name> beside it",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="refit and fail if a committed calibration file predicts other times for the "
        "rows it was fitted to than the refit does",
    )
    return parser


MISSING = Drift("(no committed file)", 0, float("inf"), float("inf"))


@dataclass(frozen=True)
class Output:
    """One calibration file: where it goes, its text, and how to check the committed one
    against it (`check`: the Drift of each family between the two)."""

    path: Path
    text: str
    check: Callable[[], list[Drift]]


def _fit_device(*, hw_id: str, device: str | None) -> list[Output]:
    """Fit `hw_id` from the data of `device` (and the engine, on its device); print the fit
    reports; return the files to write."""
    eff, reports = calibrate(hw_id, device)
    text = render(hw_id, device, eff, reports)
    refit = calibrated_hardware(hw_id, yaml.safe_load(text))

    def check_hardware() -> list[Drift]:
        if not calibration_path(hw_id).is_file():
            return [MISSING]
        return hardware_drifts(load_hardware(hw_id), refit, device)

    outputs = [Output(calibration_path(hw_id), text, check_hardware)]
    if hw_id == ENGINE_HARDWARE:  # the engine is fitted on this device's fitted spec
        hw = load_hardware(hw_id, calibrated=False).model_copy(update={"efficiency": eff})
        overhead, report = calibrate_engine(hw)
        reports.append(report)
        path = calibration_beside(ENGINES_DIR / f"{ENGINE}.yaml")
        engine_text = render_engine(overhead, report)

        def check_engine() -> list[Drift]:
            if not path.is_file():
                return [MISSING]
            fitted = calibrated_engine(ENGINE, yaml.safe_load(engine_text))
            return [engine_drift(refit, load_engine(ENGINE), fitted)]

        outputs.append(Output(path, engine_text, check_engine))
    for r in reports:
        if r.rows:
            print(
                f"{hw_id:14} {r.family:18} {r.rows:6d} rows  MAPE "
                f"{r.mape_before_pct:6.1f}% -> {r.mape_after_pct:6.1f}%"
            )
    return outputs


def _own(spec: Path, csv: Path) -> int:
    """Fit a spec file of one's own to GEMM timings (`own.calibrate_own_file`); 2 and one line
    on bad input."""
    try:
        path, reports = calibrate_own_file(spec, csv)
    except SpecError as exc:
        print(exc.line(), file=sys.stderr)
        return 2
    for r in reports:
        before, after = r.mape_before_pct, r.mape_after_pct
        print(f"{r.family:10} {r.rows:6d} rows  MAPE {before:6.1f}% -> {after:6.1f}%")
    print(f"wrote {path}")
    return 0


def _stale(outputs: list[Output]) -> list[str]:
    """The paths whose committed file is missing or predicts other times than the refit
    (`check.MEAN_DRIFT_PCT`, `check.P99_DRIFT_PCT`); each family's drift is printed."""
    stale: list[str] = []
    for out in outputs:
        drifts = out.check()
        for d in drifts:
            print(f"{out.path.name:20} {d}{'' if d.ok else '  <- differs'}")
        if not all(d.ok for d in drifts):
            stale.append(str(out.path))
    return stale


def _write(outputs: list[Output]) -> None:
    for out in outputs:
        out.path.parent.mkdir(exist_ok=True)
        out.path.write_text(out.text, encoding="utf-8")
        print(f"wrote {out.path}")


def main(argv: list[str] | None = None) -> int:
    """Run the command with `argv` (default: sys.argv); 0 on success, 1 when `--check` finds a
    committed file that is missing or predicts other times than the refit."""
    parser = _parser()
    args = parser.parse_args(argv)
    if (args.gemm_csv is None) != (args.hardware is None):
        parser.error("--gemm-csv and --hardware go together")
    if args.gemm_csv is not None:
        return _own(args.hardware, args.gemm_csv)
    devices = _devices()
    wanted = set(args.device or devices)
    outputs: list[Output] = []
    for hw_id, device in sorted(devices.items()):
        if hw_id in wanted:
            outputs += _fit_device(hw_id=hw_id, device=device)
    if not args.check:
        _write(outputs)
        return 0
    stale = _stale(outputs)
    if stale:
        print("calibration files differ from a refit: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0
