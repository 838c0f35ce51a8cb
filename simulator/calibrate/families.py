"""What the calibration fits: families of measured operator rows and the parameters fitted to them.

A family names the rows (aiconfigurator tables, through the `ops` validation suite's group
builders) and the dotted paths into the hardware spec's `efficiency:` section it fits, with
initial values and bounds. A curve is fitted at fixed knots (`FLOP_KNOTS`, ...: log-spaced over
the measured range) as steps between adjacent knots; see `_knots` for the bound that keeps time
monotone in the work. Families are fitted in the order of `FAMILIES` (see `fit.calibrate`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import get_args

import numpy as np
import pandas as pd

from simulator.costmodel.roofline import gemm_key
from simulator.specs.hardware import HardwareSpec, RowKernel
from simulator.validate import data
from simulator.validate.elementwise import elementwise_groups
from simulator.validate.gemm_library import LIBRARY as MEASURED_LIBRARY
from simulator.validate.gemm_library import device_groups
from simulator.validate.layers import LIBRARY, projection_groups
from simulator.validate.operators import Group, attention_groups, collective_groups, gemm_groups

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
    # Offsets of the curves' steps from their initial values, one least-squares start each; the
    # fit keeps the start that ends lowest. One start where the fit has one basin; several where
    # it has more and which the optimiser falls into from one start depends on the machine's
    # floating point (`fit.fit_family`).
    step_starts: tuple[float, ...] = (0.0,)


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


def _gemm_rows(key: str) -> Callable[[HardwareSpec, str], list[Group]]:
    """The device's GEMM rows of one factor key (`roofline.gemm_key`: bf16, fp8, fp8_block)."""

    def rows(hw: HardwareSpec, device: str) -> list[Group]:
        groups = gemm_groups(hw, data.aiconfigurator(device, "gemm"))
        return [g for g in groups if gemm_key(g.op) == key]

    return rows


def _attention_rows(phase: str, table: str) -> Callable[[HardwareSpec, str], list[Group]]:
    def rows(hw: HardwareSpec, device: str) -> list[Group]:
        return attention_groups(data.aiconfigurator(device, table), phase=phase)

    return rows


def _all_reduce_rows(hw: HardwareSpec, device: str) -> list[Group]:
    return collective_groups(hw, data.aiconfigurator(device, "nccl"))


def _vidur_rows(
    groups: Callable[[pd.DataFrame], list[Group]],
) -> Callable[[HardwareSpec, str], list[Group]]:
    """Rows from Vidur's profile of `hw` (`groups` of it: models not held out); none on a
    device without a profile."""

    def rows(hw: HardwareSpec, device: str) -> list[Group]:
        folders = {hw_id: folder for folder, hw_id in data.VIDUR_DEVICES.items()}
        return groups(data.vidur(folders[hw.id])) if hw.id in folders else []

    return rows


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
    # after gemm_fp8: block-scaled fp8 (vLLM's per-token-group activation quantisation, 128
    # columns a group, and a GEMM that rescales each 128-deep k block's partial sums by the
    # activations' and the weight block's scales) on the activation-quantisation size curve
    # fitted there
    Family(
        "gemm_fp8_block",
        _gemm_rows("fp8_block"),
        (
            Param("gemm.peak_fraction.fp8_block", 0.5, 0.05, 1.0),
            Param("gemm.extra_latency_s.fp8_block", 5 * _US, 0.0, 50 * _US),
            Param("gemm.quant_fraction.fp8_block", 0.3, 0.01, 1.0),
            *_knots("gemm.size_curves.fp8_block", FLOP_KNOTS, elasticity=0.9),
        ),
        {"gemm.size_curves.fp8_block": FLOP_KNOTS},
    ),
    Family(
        "attention_prefill",
        _attention_rows("prefill", "context_attention"),
        (
            Param("attention.prefill_fraction", 0.55, 0.1, 1.0),
            Param("attention.prefill_fixed_s", 10 * _US, 1 * _US, 50 * _US),
            Param("attention.prefill_wave_s", 1 * _US, 0.0, 50 * _US),
            Param("attention.cache_write_block_s", 1 * _US, 0.0, 20 * _US),
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
            Param("attention.decode_walk_tokens_per_s", 2e9, 1e8, 1e11, splits=("fa3",)),
            Param("attention.decode_walk_seqs", 8.0, 1.0, 256.0, splits=("fa3",)),
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
    # after gemm_bf16: a kernel also takes its bytes at the streaming efficiency fitted there
    Family(
        "elementwise",
        _vidur_rows(elementwise_groups),  # the one-block-per-token kernels' times
        (
            Param("memory.row_fixed_s", 2 * _US, 0.0, 10 * _US),
            Param("memory.row_latency_s", 0.3 * _US, 0.0, 5 * _US),
            *[
                Param(f"memory.row_wave_s.{k}", 1 * _US, 0.01 * _US, 20 * _US)
                for k in get_args(RowKernel)
            ],
            Param("memory.row_l2_factor", 0.8, 0.2, 1.0),
        ),
        {},
    ),
)


# The GEMM library of Vidur's profiles (`validate.layers.LIBRARY`): its 16-bit peak fraction
# and size curve, fitted on the device's calibrated spec after FAMILIES (`fit.calibrate`), with
# its smallest row tile chosen from LIBRARY_TILES_M_MIN by how well each tile's fit predicts the
# fitted models' layers, the sums of their projections, which is what a step adds up (the device's
# own unless another is better by more than TILE_MARGIN_PCT points, as the device's tiles were
# chosen: hardware_specs/h100_sxm.yaml).
LIBRARY_TILES_M_MIN = (32, 64, 128)
TILE_MARGIN_PCT = 0.1
LIBRARY_FAMILY = Family(
    f"gemm_{LIBRARY}",
    _vidur_rows(projection_groups),  # the per-projection times
    (
        Param("gemm.peak_fraction.fp16", 0.8, 0.3, 1.0),
        *_knots("gemm.size_curve", FLOP_KNOTS, elasticity=0.9),
    ),
    {"gemm.size_curve": FLOP_KNOTS},
)


# The GEMM library this project timed (`validate.gemm_library`: cuBLAS 13.1 through PyTorch 2.11,
# tools/measure_gpu.py), fitted on the device's calibrated spec after the above (`fit.calibrate`):
# its bf16 peak fraction and size curve, then its fp8 peak fraction, size curve and fixed cost
# (these fp8 rows are the scaled GEMM alone: no quantisation factors to fit). On a device with no
# aiconfigurator data, MEASURED_DEVICE_FAMILY first fits the device's own 16-bit GEMM factors
# (as `gemm_bf16` does from aiconfigurator's vLLM GEMMs, whose bf16 kernels are cuBLAS's too),
# and MEASURED_DEVICE_FP8_FAMILY its fp8 GEMM's: the only fp8 GEMM measured on it.
def _measured_rows(dtype: str) -> Callable[[HardwareSpec, str], list[Group]]:
    def rows(hw: HardwareSpec, device: str) -> list[Group]:
        return device_groups(hw, dtype)

    return rows


_GEMM_BF16 = next(f for f in FAMILIES if f.name == "gemm_bf16")
MEASURED_DEVICE_FAMILY = Family(
    _GEMM_BF16.name, _measured_rows("bf16"), _GEMM_BF16.params, _GEMM_BF16.curves
)
# ... and its fp8 GEMM's peak fraction, size curve and fixed cost, from the fp8 rows (the scaled
# GEMM alone: the activation-quantisation kernel keeps the spec's factors)
# Its size curve's small-GEMM knots are barely tied down (latency-bound rows): from the one start
# H100's library fit found a cost of 28.96 on one machine and 28.61 on another (predictions 2.4%
# apart); from three starts both find 28.61.
MEASURED_DEVICE_FP8_FAMILY = Family(
    "gemm_fp8",
    _measured_rows("fp8"),
    (
        Param("gemm.peak_fraction.fp8", 0.7, 0.1, 1.0),
        Param("gemm.extra_latency_s.fp8", 1 * _US, 0.0, 50 * _US),
        *_knots("gemm.size_curves.fp8", FLOP_KNOTS, elasticity=0.9),
    ),
    {"gemm.size_curves.fp8": FLOP_KNOTS},
    step_starts=(0.0, -0.5, 0.5),
)
MEASURED_LIBRARY_FAMILIES = (
    Family(
        f"gemm_{MEASURED_LIBRARY}_bf16",
        _measured_rows("bf16"),
        (
            Param("gemm.peak_fraction.bf16", 0.8, 0.3, 1.0),
            *_knots("gemm.size_curve", FLOP_KNOTS, elasticity=0.9),
        ),
        {"gemm.size_curve": FLOP_KNOTS},
    ),
    Family(
        f"gemm_{MEASURED_LIBRARY}_fp8",
        MEASURED_DEVICE_FP8_FAMILY.rows,
        MEASURED_DEVICE_FP8_FAMILY.params,
        MEASURED_DEVICE_FP8_FAMILY.curves,
        MEASURED_DEVICE_FP8_FAMILY.step_starts,
    ),
)
