"""The command: fit every device with data (and the engine on its device), then write the
calibration files or, with `--check`, compare them with the committed ones. Its help text is
the package docstring."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from simulator.calibrate.engine import ENGINE_HARDWARE, calibrate_engine, render_engine
from simulator.calibrate.fit import calibrate
from simulator.calibrate.output import CALIBRATION_DIR, calibration_path, render
from simulator.specs.loader import ENGINES_DIR, load_hardware
from simulator.validate import data
from simulator.validate.iteration import ENGINE


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
        choices=sorted(data.AIC_DEVICES.values()),
        help="hardware id to calibrate (default: all with data)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="refit and fail if a committed calibration file differs",
    )
    return parser


def _fit_device(*, hw_id: str, device: str) -> list[tuple[Path, str]]:
    """Fit `hw_id` from the data of `device` (and the engine, on its device); print the fit
    reports; return the files to write as (path, text)."""
    eff, reports = calibrate(hw_id, device)
    outputs = [(calibration_path(hw_id), render(hw_id, device, eff, reports))]
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
    return outputs


def _stale(outputs: list[tuple[Path, str]]) -> list[str]:
    """The paths whose committed file is missing or holds other data than the refit."""
    stale: list[str] = []
    for path, text in outputs:
        committed = yaml.safe_load(path.read_text()) if path.is_file() else None
        if committed != yaml.safe_load(text):
            stale.append(str(path))
    return stale


def _write(outputs: list[tuple[Path, str]]) -> None:
    for path, text in outputs:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    """Run the command with `argv` (default: sys.argv); 0 on success, 1 when `--check` finds a
    committed file that differs from the refit."""
    args = _parser().parse_args(argv)
    wanted = set(args.device or data.AIC_DEVICES.values())
    outputs: list[tuple[Path, str]] = []
    for device, hw_id in sorted(data.AIC_DEVICES.items()):
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
