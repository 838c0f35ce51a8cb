"""Fit the efficiency factors of devices with operator measurements, reproducibly.

    python -m simulator.calibrate [--device h100_sxm ...] [--check]
    python -m simulator.calibrate --gemm-csv OUT_DIR/gemm.csv --hardware my_gpu.yaml

For each device with bundled operator data (aiconfigurator: vLLM 0.14.0 kernels on A100 SXM,
H100 SXM and H200 SXM, vLLM 0.19.0's on B200, and NCCL's collectives; see
simulator/data/README.md) this fits, family by family (on B200 all but fp4's), the named
factors of the hardware spec's `efficiency:` section by robust least squares on
log(predicted / measured), using the cost model's own operator constructors and roofline (the
`ops` validation suite's code path). The result is written to
`hardware_specs/calibration/<id>.yaml`, which the loader lays over the hand-written values of
`hardware_specs/<id>.yaml` (those keep their datasheet sources and remain the values for every
device without measurements).

Only operator-level rows are fitted. Then, on the fitted spec, the GEMM library of Vidur's
per-layer profiles (`cublas-12.1`, the cuBLAS that PyTorch 2.1-2.4's CUDA 12.1 builds ship:
engines of that build name it as their `gemm_library`) is fitted to the per-projection GEMM
times of every profiled model but Llama-2-70B, written to `efficiency.gemm_libraries`. The
Llama-2-70B rows (`layers`) and the `iteration` suites are checks on data not used here,
but for the Splitwise llama-2-70b rows the `vllm-0.2` engine's CPU overheads are fitted to
(`iteration_engine_fit`). `--check` refits and fails if the committed files predict other
times than the refit for the rows they were fitted to (see `calibrate.check`: predictions, not
the written numbers, which numpy/scipy releases move along the flat directions of the fit).

This project's own GEMM timings (tools/measure_gpu.py, `simulator/data/measured/llmsim/`: H100
SXM and H200 SXM) fit the `cublas-13.1` library of both; a device with such timings and no
aiconfigurator data would have its GEMM factors fitted to them (`fit.calibrate_timings`). The
second form fits a spec file of one's own to such timings of
its device and writes `calibration/<name>` beside it (`calibrate.own`).

Curves are fitted at fixed knots (log-spaced over the measured range); the last knot of each
multiplier curve is pinned to 1 so that the family's peak fraction stays identifiable.
"""

from simulator.calibrate.engine import (
    ENGINE_HARDWARE,
    ENGINE_PARAMS,
    calibrate_engine,
    render_engine,
)
from simulator.calibrate.families import (
    BYTE_KNOTS,
    FAMILIES,
    FLOP_KNOTS,
    GROUP_KNOTS,
    MSG_KNOTS,
    SEQ_KNOTS,
    WORK_KNOTS,
    Family,
    Param,
)
from simulator.calibrate.fit import (
    SIGNIFICANT,
    FitReport,
    calibrate,
    calibrate_library,
    fit_family,
)
from simulator.calibrate.output import (
    FITTED_KEYS,
    calibration_path,
    fitted_section,
    render,
)
from simulator.calibrate.script import main
from simulator.specs.loader import CALIBRATION_DIR, ENGINES_DIR

__all__ = [
    "BYTE_KNOTS",
    "CALIBRATION_DIR",
    "ENGINES_DIR",
    "ENGINE_HARDWARE",
    "ENGINE_PARAMS",
    "FAMILIES",
    "FITTED_KEYS",
    "FLOP_KNOTS",
    "GROUP_KNOTS",
    "MSG_KNOTS",
    "SEQ_KNOTS",
    "SIGNIFICANT",
    "WORK_KNOTS",
    "Family",
    "FitReport",
    "Param",
    "calibrate",
    "calibrate_engine",
    "calibrate_library",
    "calibration_path",
    "fit_family",
    "fitted_section",
    "main",
    "render",
    "render_engine",
]
