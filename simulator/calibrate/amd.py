"""MI300X's own 8-bit GEMM factors, fitted to AMD's aiter timings of the device.

`fit_mi300x_8bit` fits, on the hand-written spec `hardware_specs/mi300x.yaml` with its 8-bit GEMM
factors taken back to their datasheet starts (`START`), the fp8 GEMM's peak fraction, fixed cost
and size curve to the rows of the `ops_amd_fit` suite (`validate.amd`: CK's a8w8 row-wise kernel
for Llama 3.1 405B's shapes) by robust least squares on log(predicted / measured), as
`MEASURED_DEVICE_FP8_FAMILY` fits H200's. The result is copied by hand into mi300x.yaml (with
the measurements named); `tests/validate/test_amd.py` refits and checks that the spec predicts
the fitted rows as the refit does. The held-out rows (`ops_amd`, Llama 3.1 70B's shapes) are not
read here.

    python -m simulator.calibrate.amd      # print the fitted factors and the fit's MAPE
"""

from __future__ import annotations

from simulator.calibrate.families import FLOP_KNOTS, MEASURED_DEVICE_FP8_FAMILY, Family
from simulator.calibrate.fit import FitReport, fit_family
from simulator.specs import load_hardware
from simulator.specs.hardware import HardwareSpec
from simulator.validate.amd import DEVICE, device_groups
from simulator.validate.operators import Group

# The spec's fp8 GEMM factors before this fit: AMD's MAF fraction (mi300x.yaml, [S15]), the
# shared default size curve and no fixed cost beyond the kernel latency.
START_PEAK_FP8 = 0.49


def _fit_rows(hw: HardwareSpec, device: str) -> list[Group]:
    return device_groups(hw, fitted=True)


FAMILY = Family(
    "gemm_a8w8_mi300x",
    _fit_rows,
    MEASURED_DEVICE_FP8_FAMILY.params,
    {"gemm.size_curves.fp8": FLOP_KNOTS},
    MEASURED_DEVICE_FP8_FAMILY.step_starts,
)


def start_spec() -> HardwareSpec:
    """mi300x.yaml with its fitted 8-bit GEMM factors taken back to their starts."""
    hw = load_hardware(DEVICE)
    gemm = hw.efficiency.gemm
    peaks = dict(gemm.peak_fraction) | {"fp8": START_PEAK_FP8, "int8": START_PEAK_FP8}
    update = {
        "peak_fraction": peaks,
        "size_curves": {k: v for k, v in gemm.size_curves.items() if k != "fp8"},
        "extra_latency_s": {k: v for k, v in gemm.extra_latency_s.items() if k != "fp8"},
    }
    return hw.with_gemm(gemm.model_copy(update=update))


def fit_mi300x_8bit() -> tuple[HardwareSpec, FitReport]:
    """The start spec with its fp8 GEMM factors fitted to the `ops_amd_fit` rows."""
    hw = start_spec()
    return fit_family(hw, DEVICE, FAMILY, device_groups(hw, fitted=True))


def main() -> None:
    hw, report = fit_mi300x_8bit()
    gemm = hw.efficiency.gemm
    print(
        f"{report.family}: {report.rows} rows, MAPE {report.mape_before_pct:.2f}% -> "
        f"{report.mape_after_pct:.2f}%"
    )
    print("peak_fraction.fp8:", gemm.peak_fraction["fp8"])
    print("extra_latency_s.fp8:", gemm.extra_latency_s.get("fp8"))
    print("size_curves.fp8:", gemm.size_curves["fp8"])


if __name__ == "__main__":
    main()
