"""The generated calibration file: which factors it owns, their rounding, and its text.

`hardware_specs/calibration/<id>.yaml` holds only the FITTED_KEYS of the efficiency section;
the loader lays it over the hand-written `hardware_specs/<id>.yaml`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from simulator.calibrate.families import LIBRARY_TILES_M_MIN
from simulator.calibrate.fit import SIGNIFICANT, FitReport
from simulator.specs.hardware import EfficiencySpec
from simulator.specs.loader import hardware_dirs
from simulator.validate.layers import HELD_OUT

CALIBRATION_DIR = "calibration"

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


def fitted_section(eff: EfficiencySpec) -> dict[str, Any]:
    """The part of the efficiency section the calibration owns, as plain YAML data."""
    dumped = eff.model_dump()
    out: dict[str, Any] = {"kernel_latency_s": dumped["kernel_latency_s"]}
    for group, keys in FITTED_KEYS.items():
        out[group] = {k: dumped[group][k] for k in keys}
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


def render(hw_id: str, device: str, eff: EfficiencySpec, reports: list[FitReport]) -> str:
    lines = [
        f"# Calibrated efficiency factors for {hw_id}. GENERATED: do not edit by hand.",
        "# Regenerate with `python -m simulator.calibrate`; `--check` verifies this file.",
        f"# Fitted to simulator/data/measured/aiconfigurator/{device}/ (NVIDIA aiconfigurator,",
        "# per-kernel timings of vLLM 0.14.0's GEMM, flash-attention and NCCL kernels), by robust",
        f"# least squares on log(predicted / measured). Laid over hardware_specs/{hw_id}.yaml.",
        "# Fit per family (rows, MAPE before -> after):",
    ]
    lines += [
        f"#   {r.family}: {r.rows} rows, {r.mape_before_pct:.1f}% -> {r.mape_after_pct:.1f}%"
        for r in reports
        if r.rows
    ]
    if eff.gemm_libraries:
        tiles = "/".join(map(str, LIBRARY_TILES_M_MIN))
        lines += [
            f"# gemm_libraries: {', '.join(eff.gemm_libraries)}, the cuBLAS of Vidur's profiles",
            "# (simulator/data/measured/vidur/, Sarathi-Serve on PyTorch's CUDA 12.1 build):",
            "# its 16-bit peak fraction and size curve, fitted to the per-projection GEMM times,",
            f"# and smallest row tile (of {tiles}, the one whose fit best predicts their layers)",
            f"# of every model but {', '.join(HELD_OUT)} (llmsim validate: layers_fit; layers",
            "# holds the rest out), on the factors above. Engines of that build name it",
            "# (`gemm_library`).",
        ]
    lines.append("# fp16 takes bf16's peak fraction (same tensor path); int8 takes fp8's.")
    lines.append("# quant_fraction: vLLM's fp8 activation-quantisation kernel run alone (an engine")
    lines.append("# that fuses it into the kernel before, `fused_activation_quant`, skips it).")
    body = yaml.safe_dump(
        {"efficiency": fitted_section(eff)}, sort_keys=False, default_flow_style=None, width=100
    )
    return "\n".join(lines) + "\n" + body


def calibration_path(hw_id: str) -> Path:
    base = next(d for d in hardware_dirs() if (d / f"{hw_id}.yaml").is_file())
    return base / CALIBRATION_DIR / f"{hw_id}.yaml"
