"""The `gemm_library_fit` suite: GEMMs this project timed, against the library fitted to them.

`tools/measure_gpu.py` timed cuBLAS 13.1 through PyTorch 2.11 on an H100 SXM and an H200 SXM
(`simulator/data/measured/llmsim/`): bf16 GEMMs as vLLM's linear layers call them and fp8 GEMMs
as TensorRT-LLM's per-tensor FP8 linear layers call them (`cublas_scaled_mm`: cuBLASLt on operands
already quantised). `python -m simulator.calibrate` fits the `cublas-13.1` GEMM library
(`efficiency.gemm_libraries`) of each device to them (both also have aiconfigurator data, which
their own GEMM factors are fitted to). The rows are predicted under that library:
without the activation-quantisation kernel (they time the scaled GEMM alone) and with the device's
data ceiling (they ran on random data).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pandas as pd

from simulator.specs.hardware import HardwareSpec
from simulator.validate import data
from simulator.validate.frame import empty, finish
from simulator.validate.operators import Group, cases, default_hardware, gemm_groups, sweep_outliers

SUITE = "gemm_library_fit"
LIBRARY = "cublas-13.1"


def library_groups(hw: HardwareSpec, measured: pd.DataFrame) -> list[Group]:
    """`operators.gemm_groups` of `measured` (a `data.llmsim_gemm` table), each fp8 GEMM
    without its activation-quantisation kernel: these rows time the scaled GEMM alone."""
    return [
        g._replace(op=dataclasses.replace(g.op, pre_bytes=0.0)) for g in gemm_groups(hw, measured)
    ]


def device_groups(hw: HardwareSpec, dtype: str | None = None) -> list[Group]:
    """The library groups of `hw`'s own measurements (of one compute dtype, or all); none on a
    device this project has not measured."""
    folders = {hw_id: folder for folder, hw_id in data.LLMSIM_DEVICES.items()}
    if hw.id not in folders:
        return []
    groups = library_groups(hw, data.llmsim_gemm(folders[hw.id]))
    return [g for g in groups if dtype is None or g.op.dtype == dtype]


def library_cases(hw: HardwareSpec, measured: pd.DataFrame) -> pd.DataFrame:
    """One row per measured GEMM, predicted on `hw` under LIBRARY; `sweep_outlier` as in `ops`."""
    lib = hw.with_gemm_library(LIBRARY)
    df = cases(lib, library_groups(lib, measured)).assign(device=hw.id)
    return df.assign(sweep_outlier=sweep_outliers(df))


def gemm_library_suite(hardware: Mapping[str, HardwareSpec] | None = None) -> pd.DataFrame:
    """The suite on every measured device. `hardware` maps a data folder (`h100_sxm`,
    `h200_sxm`) to the spec to predict with; default: data.LLMSIM_DEVICES. `fitted` is True:
    these rows are what the library was fitted to."""
    specs = default_hardware(data.LLMSIM_DEVICES) if hardware is None else hardware
    frames = [library_cases(hw, data.llmsim_gemm(folder)) for folder, hw in specs.items()]
    if not frames:
        return empty(SUITE)
    return finish(pd.concat(frames, ignore_index=True), suite=SUITE, fitted=True)
