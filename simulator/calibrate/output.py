"""The generated calibration file: which factors it owns, their rounding, and its text.

`hardware_specs/calibration/<id>.yaml` holds only the FITTED_KEYS of the efficiency section;
the loader lays it over the hand-written `hardware_specs/<id>.yaml`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from simulator.calibrate.families import LIBRARY_TILES_M_MIN, MEASURED_LIBRARY
from simulator.calibrate.fit import SIGNIFICANT, FitReport
from simulator.specs.hardware import EfficiencySpec
from simulator.specs.loader import calibration_beside, hardware_dirs
from simulator.validate import data
from simulator.validate.layers import HELD_OUT, LIBRARY

FITTED_KEYS = {
    "gemm": (
        "peak_fraction",
        "size_curve",
        "size_curves",
        "extra_latency_s",
        "quant_fraction",
        "quant_size_curve",
    ),
    "memory": ("size_curve", "row_fixed_s", "row_latency_s", "row_wave_s", "row_l2_factor"),
    "attention": (
        "prefill_fraction",
        "prefill_fixed_s",
        "prefill_wave_s",
        "cache_write_block_s",
        "prefill_len_curve",
        "prefill_parallel_curve",
        "prefill_group_curve",
        "decode_fraction",
        "decode_fixed_s",
        "decode_wave_s",
        "decode_len_curve",
        "decode_parallel_curve",
        "decode_group_curve",
        "decode_block_bytes_per_s",
        "decode_gqa_copy_s",
        "decode_walk_tokens_per_s",
        "decode_walk_seqs",
        "fp8_kv_factor",
    ),
    "collective": ("busbw_fraction", "latency_s", "size_curve", "latency_group_curve"),
}


# What a device fitted to GEMM timings alone owns (`fit.calibrate_timings`): its GEMM factors,
# kernel latency and memory size curve; every other factor stays hand-written (or borrowed:
# `attention_from`).
MEASURED_DEVICE_KEYS = {
    "gemm": ("peak_fraction", "size_curve", "size_curves", "extra_latency_s"),
    "memory": ("size_curve",),
}


def fitted_section(
    eff: EfficiencySpec, keys: dict[str, tuple[str, ...]] = FITTED_KEYS
) -> dict[str, Any]:
    """The part of the efficiency section the calibration owns (`keys` of each group, the
    kernel latency and the GEMM libraries), as plain YAML data."""
    dumped = eff.model_dump()
    out: dict[str, Any] = {"kernel_latency_s": dumped["kernel_latency_s"]}
    for group, names in keys.items():
        out[group] = {k: dumped[group][k] for k in names}
    if dumped["gemm_libraries"]:
        out["gemm_libraries"] = dumped["gemm_libraries"]
    return _rounded(out)


def _rounded(node: Any) -> Any:
    if isinstance(node, dict) and set(node) == {"points"}:  # knots stay exact, values round
        return {"points": [[float(x), _rounded(float(y))] for x, y in node["points"]]}
    if isinstance(node, dict):
        return {k: _rounded(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_rounded(v) for v in node]
    if isinstance(node, float):
        return float(f"{node:.{SIGNIFICANT}g}")
    return node


def render(hw_id: str, device: str | None, eff: EfficiencySpec, reports: list[FitReport]) -> str:
    """The calibration file of `hw_id`: fitted to aiconfigurator's data of `device`, or (None)
    to this project's own GEMM timings alone."""
    lines = [
        f"# Calibrated efficiency factors for {hw_id}. GENERATED: do not edit by hand.",
        "# Regenerate with `python -m simulator.calibrate`; `--check` verifies this file.",
    ]
    if device is None:
        lines += [
            f"# Fitted to simulator/data/measured/llmsim/{hw_id}/ (this project's GEMM timings,",
            "# tools/measure_gpu.py: cuBLAS 13.1 through PyTorch 2.11, random data), by robust",
            "# least squares on log(predicted / measured): the 16-bit GEMM factors, kernel latency",
            "# and memory size curve (as aiconfigurator's vLLM bf16 GEMMs give them on H100 SXM),",
            "# and the fp8 GEMM's peak fraction, size curve and fixed cost (cuBLASLt's, alone);",
            f"# every other factor is hardware_specs/{hw_id}.yaml's. Fit per family (rows, MAPE",
            "# before -> after):",
        ]
    else:
        kernels = f"GEMM, {data.AIC_ATTENTION[device]} and NCCL kernels"
        lines += [
            f"# Fitted to simulator/data/measured/aiconfigurator/{device}/ (NVIDIA aiconfigurator,",
            f"# per-kernel timings of vLLM {data.AIC_VLLM[device]}'s {kernels}), by robust least",
            f"# squares on log(predicted / measured). Laid over hardware_specs/{hw_id}.yaml.",
            "# Fit per family (rows, MAPE before -> after):",
        ]
    lines += [
        f"#   {r.family}: {r.rows} rows, {r.mape_before_pct:.1f}% -> {r.mape_after_pct:.1f}%"
        for r in reports
        if r.rows
    ]
    if LIBRARY in eff.gemm_libraries:
        tiles = "/".join(map(str, LIBRARY_TILES_M_MIN))
        lines += [
            f"# gemm_libraries: {LIBRARY}, the cuBLAS of Vidur's profiles",
            "# (simulator/data/measured/vidur/, Sarathi-Serve on PyTorch's CUDA 12.1 build):",
            "# its 16-bit peak fraction and size curve, fitted to the per-projection GEMM times,",
            f"# and smallest row tile (of {tiles}, the one whose fit best predicts their layers)",
            f"# of every model but {', '.join(HELD_OUT)} (llmsim validate: layers_fit; layers",
            "# holds the rest out), on the factors above. Engines of that build name it",
            "# (`gemm_library`).",
        ]
    if MEASURED_LIBRARY in eff.gemm_libraries:
        lines += [
            f"# gemm_libraries: {MEASURED_LIBRARY}, this project's GEMM timings of the device",
            f"# (simulator/data/measured/llmsim/{hw_id}/: bf16 through torch.nn.functional.linear,",
            "# fp8 through torch._scaled_mm, the scaled GEMM alone), fitted on the factors above",
            "# with the data ceiling (random data): peak fractions, size curves and fp8 fixed cost",
            "# (llmsim validate: gemm_library_fit). Engines that call cuBLAS(Lt) for them name it.",
        ]
    lines.append("# fp16 takes bf16's peak fraction (same tensor path); int8 takes fp8's.")
    if device is not None:
        lines += [
            "# quant_fraction: vLLM's fp8 activation-quantisation kernel run alone (an engine",
            "# that fuses it into the kernel before, `fused_activation_quant`, skips it).",
        ]
    keys = FITTED_KEYS if device is not None else MEASURED_DEVICE_KEYS
    section = fitted_section(eff, keys)
    gemm, by_dtype = section["gemm"], ("peak_fraction", "size_curves", "extra_latency_s")
    if any("fp4" in gemm[name] for name in by_dtype):
        # no fp4 row in the data: fp4's GEMM factors stay the spec's own (calibrate.nvfp4)
        lines.append("# fp4's GEMM factors are not here: the spec's own (calibrate.nvfp4).")
        for name in by_dtype:
            gemm[name] = {dtype: v for dtype, v in gemm[name].items() if dtype != "fp4"}
    body = yaml.safe_dump(
        {"efficiency": section}, sort_keys=False, default_flow_style=None, width=100
    )
    return "\n".join(lines) + "\n" + body


def calibration_path(hw_id: str) -> Path:
    base = next(d for d in hardware_dirs() if (d / f"{hw_id}.yaml").is_file())
    return calibration_beside(base / f"{hw_id}.yaml")
