"""Prediction error against bundled real measurements (`llmsim validate`).

Suites (each a pure function returning one row per measured case; see their modules):
`ops` (aiconfigurator kernels: GEMM, prefill/decode attention, all-reduce; the rows
calibration fits), `layers` (Vidur per-layer projection GEMMs), `iteration_prefill` and
`iteration_decode` (Splitwise whole engine steps; `iteration` is their union), and the
others `names.SUITE_NAMES` lists (elementwise kernels, end-to-end benchmarks, board power).
`knee` is the serving-curve suite's knee of a (load, throughput) sweep, for any sweep.
This package only measures the error; it never changes a parameter.

`run_validation` and the names below import their suites on first use, so that importing a
light module of this package (`names`) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "iteration_cases": "iteration",
    "iteration_suite": "iteration",
    "layer_cases": "layers",
    "layers_suite": "layers",
    "attention_cases": "operators",
    "collective_cases": "operators",
    "gemm_cases": "operators",
    "knee": "serving_curve",
    "ops_suite": "operators",
    "SUITE_NAMES": "names",
    "error_stats": "summary",
    "kind_stats": "summary",
    "run_validation": "summary",
    "summarize": "summary",
    "worst_cases": "summary",
    "write_rows": "summary",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'simulator.validate' has no attribute {name!r}")
    return getattr(importlib.import_module(f"simulator.validate.{home}"), name)
