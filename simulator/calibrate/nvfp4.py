"""B200's NVFP4 GEMM factors, fitted to published timings of vLLM's CUTLASS NVFP4 GEMM.

`fit_b200_nvfp4` sets, on the hand-written spec `hardware_specs/b200.yaml`, the fp4 GEMM's peak
fraction to the fastest GEMM of the `ops_nvfp4_fit` rows (`validate.nvfp4`: vLLM PR #20578's n
6144 x k 4096 sweep, m 1-16384, the GEMM alone; 3,904 TFLOP/s at m 16384), then fits its fixed
cost and size curve to those rows by robust least squares on log(predicted / measured), as
`simulator.calibrate.amd` fits MI300X's 8-bit GEMMs. The peak is not fitted: left free, the
fit trades the large GEMMs' time (10% fast at m 16384) for the mid-size ones'. The factors
are copied by hand into b200.yaml's `efficiency.gemm` (`peak_fraction.fp4`,
`size_curves.fp4`, `extra_latency_s.fp4`) with the measurements named;
`tests/validate/test_nvfp4.py` refits and checks that the spec predicts the fitted rows as the
refit does. The held-out rows (`ops_nvfp4`: helion's m-1 timings of nine other shapes) are not
read here.

    python -m simulator.calibrate.nvfp4    # print the fitted factors and the fit's MAPE
"""

from __future__ import annotations

import dataclasses

from simulator.calibrate.families import FLOP_KNOTS, Family, Param, _knots
from simulator.calibrate.fit import FitReport, fit_family, print_gemm_fit
from simulator.specs import load_hardware
from simulator.specs.hardware import HardwareSpec
from simulator.validate.nvfp4 import DEVICE, device_groups
from simulator.validate.operators import Group

_US = 1e-6


def _fit_rows(hw: HardwareSpec, device: str) -> list[Group]:
    return device_groups(fitted=True)


FAMILY = Family(
    "gemm_nvfp4",
    _fit_rows,
    (
        Param("gemm.extra_latency_s.fp4", 1 * _US, 0.0, 50 * _US),
        # Efficiency may only rise with the work (steps >= 0): a small GEMM never runs nearer
        # the peak than a large one; the bounded elasticity keeps time monotone in the work.
        *(
            dataclasses.replace(p, lower=0.0)
            for p in _knots("gemm.size_curves.fp4", FLOP_KNOTS, elasticity=0.9)
        ),
    ),
    {"gemm.size_curves.fp4": FLOP_KNOTS},
)


def start_spec() -> HardwareSpec:
    """b200.yaml with its fp4 fit removed (peak fraction kept, no fp4 curve or fixed cost)."""
    hw = load_hardware(DEVICE)
    gemm = hw.efficiency.gemm
    curves = {k: v for k, v in gemm.size_curves.items() if k != "fp4"}
    latency = {k: v for k, v in gemm.extra_latency_s.items() if k != "fp4"}
    return hw.with_gemm(gemm.model_copy(update={"size_curves": curves, "extra_latency_s": latency}))


def best_fraction(hw: HardwareSpec) -> float:
    """The fastest fitted row's FLOP rate over the device's dense fp4 peak."""
    rows = device_groups(fitted=True)[0].rows
    flops = 2.0 * rows["m"] * rows["n"] * rows["k"]
    rate = (flops / (rows["latency_us"] * 1e-6)).max()
    return float(rate / hw.peak_flops("fp4"))


def fit_b200_nvfp4() -> tuple[HardwareSpec, FitReport]:
    """The spec with its fp4 GEMM factors set from, and fitted to, the `ops_nvfp4_fit` rows,
    and the report (its MAPE before: the spec with no fp4 curve or fixed cost)."""
    hw = start_spec()
    gemm = hw.efficiency.gemm
    peaks = dict(gemm.peak_fraction) | {"fp4": round(best_fraction(hw), 4)}
    hw = hw.with_gemm(gemm.model_copy(update={"peak_fraction": peaks}))
    return fit_family(hw, DEVICE, FAMILY, device_groups(fitted=True))


def main() -> None:
    fitted, report = fit_b200_nvfp4()
    print_gemm_fit(report, fitted.efficiency.gemm, "fp4")


if __name__ == "__main__":
    main()
