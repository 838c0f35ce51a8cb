"""Write simulator/specs/fused_moe_configs.yaml: which routed-expert shapes each vLLM release
ships a tuned Triton fused-MoE kernel configuration for, per device llmsim knows.

    python tools/import_vllm_moe_configs.py vllm-0.14.0-...whl [more wheels ...]

vLLM's `try_get_optimal_moe_config` (vllm/model_executor/layers/fused_moe/fused_moe.py) loads
`configs/E={local experts},N={intermediate size per shard},device_name={GPU name with
underscores}[,dtype=...][,block_shape=[...]].json` and, without one, runs
`get_default_config`. Only the file names are read here (the wheel from PyPI, e.g. `pip download
vllm==0.14.0 --no-deps`); nothing of their contents is copied.
"""

from __future__ import annotations

import re
import sys
import zipfile
from collections import defaultdict
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[1] / "simulator" / "specs" / "fused_moe_configs.yaml"
NAME = re.compile(
    r"E=(\d+),N=(\d+),device_name=([^,]+?)"  # local experts, N, the device
    r"(?:,dtype=([^,]+?))?(,block_shape=\[\d+, ?\d+\])?\.json$"
)
# torch.cuda.get_device_name() with spaces as underscores -> llmsim hardware id
DEVICES = {
    "NVIDIA_H100_80GB_HBM3": "h100_sxm",
    "NVIDIA_H100_PCIe": "h100_pcie",
    "NVIDIA_H200": "h200_sxm",
    "NVIDIA_B200": "b200",
    "NVIDIA_A100-SXM4-80GB": "a100_sxm_80gb",
    "NVIDIA_A100-SXM4-40GB": "a100_sxm_40gb",
    "NVIDIA_A100_80GB_PCIe": "a100_pcie_80gb",
    "NVIDIA_L40S": "l40s",
    "NVIDIA_L4": "l4",
    "NVIDIA_A10G": "a10g",
    "NVIDIA_GeForce_RTX_4090": "rtx_4090",
    "NVIDIA_GeForce_RTX_3090": "rtx_3090",
    "NVIDIA_RTX_6000_Ada_Generation": "rtx_6000_ada",
    "NVIDIA_GH200_480GB": "gh200",
    "AMD_Instinct_MI300X": "mi300x",
    "AMD_Instinct_MI325X": "mi325x",
}
# the configuration's dtype (and whether its file names a block shape) -> the key llmsim looks
# it up by: bf16 (and fp16, which shares its files), fp8 per tensor, fp8 in blocks
DTYPES = {(None, False): "bf16", ("fp8_w8a8", False): "fp8", ("fp8_w8a8", True): "fp8_block"}


def shapes(wheel: Path) -> tuple[str, dict[str, dict[str, list[list[int]]]]]:
    """(release, {hardware id: {dtype: sorted [experts, n]}}) of one vLLM wheel."""
    release = "vllm-" + wheel.name.split("-")[1]
    found: dict[str, dict[str, set[tuple[int, int]]]] = defaultdict(lambda: defaultdict(set))
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if "/fused_moe/configs/" not in name or not (m := NAME.search(name)):
                continue
            experts, n, device, dtype, block = m.groups()
            key = DTYPES.get((dtype, block is not None))
            if device in DEVICES and key is not None:
                found[DEVICES[device]][key].add((int(experts), int(n)))
    table = {
        hw: {dt: [list(s) for s in sorted(v)] for dt, v in sorted(by.items())}
        for hw, by in sorted(found.items())
    }
    return release, table


def main(wheels: list[str]) -> int:
    if not wheels:
        print(__doc__, file=sys.stderr)
        return 2
    body = {}
    for w in wheels:
        release, table = shapes(Path(w))
        body[release] = table
    header = (
        "# Routed-expert shapes each vLLM release ships a tuned Triton fused-MoE configuration\n"
        "# for, by llmsim hardware id and compute dtype: [local experts, intermediate size per\n"
        "# shard]. Written by tools/import_vllm_moe_configs.py from the file names under\n"
        "# vllm/model_executor/layers/fused_moe/configs/ in each release's wheel (PyPI). A shape\n"
        "# not listed runs vLLM's get_default_config (EngineSpec.fused_moe_default_fraction).\n"
        "# dtype: bf16 (fp16 shares its files), fp8 (per-tensor scales), fp8_block (block-wise).\n"
    )
    OUT.write_text(
        header + yaml.safe_dump(body, default_flow_style=None, width=100, sort_keys=True)
    )
    print(f"wrote {OUT} ({', '.join(body)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
