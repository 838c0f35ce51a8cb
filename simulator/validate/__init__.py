"""Prediction error against bundled real measurements (`llmsim validate`).

Suites (each a pure function returning one row per measured case; see their modules):
`ops` (aiconfigurator kernels: GEMM, prefill/decode attention, all-reduce; the rows
calibration fits), `layers` (Vidur per-layer projection GEMMs), `iteration_prefill` and
`iteration_decode` (Splitwise whole engine steps; `iteration` is their union), and the
others `SUITE_NAMES` lists (elementwise kernels, end-to-end benchmarks, board power).
This package only measures the error; it never changes a parameter.
"""

from simulator.validate.iteration import iteration_cases, iteration_suite
from simulator.validate.layers import layer_cases, layers_suite
from simulator.validate.operators import attention_cases, collective_cases, gemm_cases, ops_suite
from simulator.validate.summary import (
    SUITE_NAMES,
    error_stats,
    kind_stats,
    run_validation,
    summarize,
    worst_cases,
    write_rows,
)

__all__ = [
    "SUITE_NAMES",
    "attention_cases",
    "collective_cases",
    "error_stats",
    "gemm_cases",
    "iteration_cases",
    "iteration_suite",
    "kind_stats",
    "layer_cases",
    "layers_suite",
    "ops_suite",
    "run_validation",
    "summarize",
    "worst_cases",
    "write_rows",
]
