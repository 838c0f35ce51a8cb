"""Copy one device's kernel timings from an aiconfigurator checkout into the bundled data.

    python tools/import_aiconfigurator.py --repo PATH --system b200_sxm --version 0.19.0 \
        --tables gemm,context_attention,generation_attention,nccl --nccl-version 2.27.3 \
        --out-dir simulator/data/measured/aiconfigurator/b200_sxm
    python tools/import_aiconfigurator.py --repo PATH --system h200_sxm --version 0.14.0 \
        --tables gemm,context_attention,generation_attention,nccl --nccl-version 2.26.2 \
        --out-dir simulator/data/measured/aiconfigurator/h200_sxm
    python tools/import_aiconfigurator.py --repo PATH --system h100_sxm --version 0.14.0 \
        --tables moe --out-dir simulator/data/measured/aiconfigurator/h100_sxm

NVIDIA's ai-dynamo/aiconfigurator (Apache-2.0) keeps per-kernel timings of real GPUs under
`aic-core/src/aiconfigurator_core/systems/data/<system>/` (snapshot 095f58a for the bundled
B200 and H200 tables): `gemm/vllm/<version>/gemm_perf.parquet`,
`attention/vllm/<version>/{context,generation}_attention_perf.parquet` and
`comm/nccl/<nccl version>/nccl_perf.parquet`. This writes the rows the calibration reads, in
the layout of the A100 and H100 tables already bundled, each value copied unchanged:
- `gemm.csv` (`gemm_dtype, m, n, k, latency_ms`): the bfloat16, fp8 and fp8_block rows
  (nvfp4 is left out), at the token counts m of the H100 table (`--m-grid`, read from it),
  every (n, k) shape kept;
- `context_attention.csv`, `generation_attention.csv` (`batch_size, isl, num_heads,
  num_key_value_heads, head_dim, attn_dtype, kv_cache_dtype, step, latency_ms`): every row
  with bfloat16 activations, head dim 128 and no sliding window (the bundled H100 tables are
  these rows of its 0.14.0 tables, which hold no others);
- `nccl.csv` (`op_name, nccl_dtype, num_gpus, message_size_elements, latency_ms`): all_reduce,
  all_gather and alltoall (reduce_scatter left out, as for H100, whose table is NCCL 2.27.3's);
- `moe.csv` (`moe/vllm/<version>/moe_perf.parquet`; the columns of `AIC_MOE_COLUMNS`): vLLM's
  Triton fused MoE (`kernel_source` vllm_fused_moe) in bf16, fp8 and fp8_block under balanced
  routing, at tensor x expert parallel sizes of one node (<= 8). Not part of the calibration's
  four tables: the `moe` validation suite reads it (H100, H200, B200; A100's table times
  power-law routing only).
Needs pyarrow (the dev extra) and git.
"""

from __future__ import annotations

import argparse
import io
import subprocess
from pathlib import Path

import pandas as pd

from simulator.validate.data import AIC_COLUMNS, AIC_MOE_COLUMNS

DATA = "aic-core/src/aiconfigurator_core/systems/data"
DTYPES = ("bfloat16", "fp8", "fp8_block")
COLUMNS = AIC_COLUMNS["gemm"]  # the bundled layouts, as the loader reads them
ATTENTION_COLUMNS = AIC_COLUMNS["context_attention"]
NCCL_COLUMNS = AIC_COLUMNS["nccl"]
NCCL_OPS = ("all_reduce", "all_gather", "alltoall")
MOE_COLUMNS = AIC_MOE_COLUMNS
MOE_DTYPES = ("bfloat16", "fp8", "fp8_block")
TABLES = (*AIC_COLUMNS, "moe")
H100_TABLE = Path(__file__).resolve().parent.parent / (
    "simulator/data/measured/aiconfigurator/h100_sxm/gemm.csv"
)


def _parquet(repo: Path, commit: str, path: str) -> pd.DataFrame:
    blob = subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit}:{DATA}/{path}"],
        check=True,
        capture_output=True,
    ).stdout
    return pd.read_parquet(io.BytesIO(blob))


def read_table(
    repo: Path, commit: str, system: str, table: str, version: str, nccl_version: str = ""
) -> pd.DataFrame:
    """Table `table` (one of TABLES) of `system` under vLLM `version` (NCCL `nccl_version` for
    `nccl`) at `commit` of the checkout `repo`."""
    if table == "gemm":
        return _parquet(repo, commit, f"{system}/gemm/vllm/{version}/gemm_perf.parquet")
    if table == "nccl":
        return _parquet(repo, commit, f"{system}/comm/nccl/{nccl_version}/nccl_perf.parquet")
    if table == "moe":
        return _parquet(repo, commit, f"{system}/moe/vllm/{version}/moe_perf.parquet")
    return _parquet(repo, commit, f"{system}/attention/vllm/{version}/{table}_perf.parquet")


def bundled_rows(table: pd.DataFrame, m_grid: list[int]) -> pd.DataFrame:
    """The GEMM rows kept, in the bundled layout, sorted for a stable file."""
    kept = table[table["gemm_dtype"].isin(DTYPES) & table["m"].isin(m_grid)]
    kept = kept.rename(columns={"latency": "latency_ms"})[COLUMNS]
    return kept.sort_values(COLUMNS[:4], kind="stable").reset_index(drop=True)


def attention_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The attention rows kept, in the bundled layout and order: bfloat16 activations, head dim
    128 and no sliding window (the grid of the H100 and H200 tables, which hold no other; B200's
    also times head dim 256 and windowed layers, kernels of other shapes)."""
    kept = table[(table["attn_dtype"] == "bfloat16") & (table["head_dim"] == 128)]
    if "window_size" in kept:
        kept = kept[kept["window_size"] == 0]
    return kept.rename(columns={"latency": "latency_ms"})[ATTENTION_COLUMNS].reset_index(drop=True)


def nccl_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The collectives kept, in the bundled layout and order."""
    kept = table[table["op_name"].isin(NCCL_OPS)]
    names = {"latency": "latency_ms", "message_size": "message_size_elements"}
    renamed = kept.rename(columns=names)
    return renamed[NCCL_COLUMNS].reset_index(drop=True)


def moe_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The fused-MoE rows kept, in the bundled layout and a stable order: vLLM's Triton
    `fused_experts` in bf16, fp8 and block-fp8, balanced routing, layouts of one node (TP x EP
    <= 8)."""
    kept = table[
        table["moe_dtype"].isin(MOE_DTYPES)
        & (table["kernel_source"] == "vllm_fused_moe")
        & (table["distribution"] == "balanced")
        & (table["moe_tp_size"] * table["moe_ep_size"] <= 8)
    ]
    kept = kept.rename(columns={"latency": "latency_ms"})[MOE_COLUMNS]
    return kept.sort_values(MOE_COLUMNS[:-1], kind="stable").reset_index(drop=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="an aiconfigurator checkout")
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--system", required=True, help="its system folder, e.g. b200_sxm")
    parser.add_argument("--version", required=True, help="the vLLM version folder, e.g. 0.19.0")
    parser.add_argument("--nccl-version", default="", help="the NCCL version folder, for nccl")
    parser.add_argument("--tables", default="gemm", help=f"comma-separated, of {', '.join(TABLES)}")
    parser.add_argument("--m-grid", type=Path, default=H100_TABLE, help="take m from this table")
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args()
    tables = args.tables.split(",")
    unknown = sorted(set(tables) - set(TABLES))
    if unknown or ("nccl" in tables and not args.nccl_version):
        parser.error(f"--tables: unknown {unknown}" if unknown else "nccl needs --nccl-version")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in tables:
        table = read_table(
            args.repo, args.commit, args.system, name, args.version, args.nccl_version
        )
        if name == "gemm":
            m_grid = sorted(pd.read_csv(args.m_grid)["m"].unique().tolist())
            rows = bundled_rows(table, m_grid)
        elif name == "nccl":
            rows = nccl_rows(table)
        elif name == "moe":
            rows = moe_rows(table)
        else:
            rows = attention_rows(table)
        out = args.out_dir / f"{name}.csv"
        rows.to_csv(out, index=False)
        device = ", ".join(sorted(table["device"].unique())) if "device" in table else "-"
        print(f"{len(rows)} rows of {device} ({len(table)} in the table) -> {out}")


if __name__ == "__main__":
    main()
