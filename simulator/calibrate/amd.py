"""MI300X's `ck-a8w8` GEMM library, fitted to AMD's aiter timings of the device.

`fit_mi300x_a8w8` fits, on the hand-written spec `hardware_specs/mi300x.yaml` under its own GEMM
factors (no library), the fp8 GEMM's peak fraction, fixed cost and size curve to the rows of the
`ops_amd_fit` suite (`validate.amd`: CK's a8w8 row-wise kernel at Llama 3.1 405B's shapes) by
robust least squares on log(predicted / measured), as `MEASURED_DEVICE_FP8_FAMILY` fits H200's,
and returns them as a GEMM library (`efficiency.gemm_libraries`). They are copied by hand into
mi300x.yaml's `ck-a8w8` (int8 takes fp8's: the rows are 8-bit, int8 data, and gfx942 runs both
at one rate), with the measurements named; `tests/validate/test_amd.py` refits and checks that the
spec predicts the fitted rows as the refit does. The held-out rows (`ops_amd`, Llama 3.1 70B's
shapes) are not read here.

    python -m simulator.calibrate.amd      # print the fitted library and the fit's MAPE
"""

from __future__ import annotations

from simulator.calibrate.families import FLOP_KNOTS, MEASURED_DEVICE_FP8_FAMILY, Family
from simulator.calibrate.fit import FitReport, fit_family, print_gemm_fit
from simulator.specs import load_hardware
from simulator.specs.hardware import GemmLibrary, HardwareSpec
from simulator.validate.amd import DEVICE, device_groups
from simulator.validate.operators import Group


def _fit_rows(hw: HardwareSpec, device: str) -> list[Group]:
    return device_groups(hw, fitted=True)


FAMILY = Family(
    "gemm_ck-a8w8",
    _fit_rows,
    MEASURED_DEVICE_FP8_FAMILY.params,
    {"gemm.size_curves.fp8": FLOP_KNOTS},
    MEASURED_DEVICE_FP8_FAMILY.step_starts,
)


def start_spec() -> HardwareSpec:
    """mi300x.yaml under its own GEMM factors, as the fit starts (no library applied)."""
    return load_hardware(DEVICE)


def fit_mi300x_a8w8() -> tuple[GemmLibrary, HardwareSpec, FitReport]:
    """The `ck-a8w8` library fitted to the `ops_amd_fit` rows, the spec whose own GEMM factors
    are that fit (the rows' predictions under the library) and the fit's report."""
    hw = start_spec()
    fitted, report = fit_family(hw, DEVICE, FAMILY, device_groups(hw, fitted=True))
    gemm = fitted.efficiency.gemm
    peak = gemm.peak_fraction["fp8"]
    latency = gemm.extra_latency_s["fp8"]
    library = GemmLibrary(
        peak_fraction={"fp8": peak, "int8": peak},
        size_curves={"fp8": gemm.size_curves["fp8"], "int8": gemm.size_curves["fp8"]},
        extra_latency_s={"fp8": latency, "int8": latency},
    )
    return library, fitted, report


def main() -> None:
    library, _, report = fit_mi300x_a8w8()
    print_gemm_fit(report, library, "fp8")


if __name__ == "__main__":
    main()
