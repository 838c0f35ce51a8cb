"""Copy one device's GEMM timings from an aiconfigurator checkout into the bundled data.

    python tools/import_aiconfigurator.py --repo PATH --system b200_sxm --version 0.19.0 \
        --out simulator/data/measured/aiconfigurator/b200_sxm/gemm.csv

NVIDIA's ai-dynamo/aiconfigurator (Apache-2.0) keeps per-kernel timings of real GPUs under
`aic-core/src/aiconfigurator_core/systems/data/<system>/gemm/vllm/<version>/gemm_perf.parquet`
(snapshot 095f58a for the bundled B200 table). This writes the rows the calibration reads, in
the layout of the A100 and H100 tables already bundled (`gemm_dtype, m, n, k, latency_ms`):
the bfloat16 and fp8 rows (fp8_block and nvfp4 are left out, as for H100), at the token
counts m of the H100 table (`--m-grid`, read from it), every (n, k) shape kept, each value
copied unchanged. Needs pyarrow (the dev extra) and git.
"""

from __future__ import annotations

import argparse
import io
import subprocess
from pathlib import Path

import pandas as pd

DATA = "aic-core/src/aiconfigurator_core/systems/data"
DTYPES = ("bfloat16", "fp8")
COLUMNS = ["gemm_dtype", "m", "n", "k", "latency_ms"]
H100_TABLE = Path(__file__).resolve().parent.parent / (
    "simulator/data/measured/aiconfigurator/h100_sxm/gemm.csv"
)


def read_table(repo: Path, commit: str, system: str, version: str) -> pd.DataFrame:
    """The GEMM table of `system` under vLLM `version` at `commit` of the checkout `repo`."""
    path = f"{DATA}/{system}/gemm/vllm/{version}/gemm_perf.parquet"
    blob = subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True, capture_output=True
    ).stdout
    return pd.read_parquet(io.BytesIO(blob))


def bundled_rows(table: pd.DataFrame, m_grid: list[int]) -> pd.DataFrame:
    """The rows kept, in the bundled layout, sorted for a stable file."""
    kept = table[table["gemm_dtype"].isin(DTYPES) & table["m"].isin(m_grid)]
    kept = kept.rename(columns={"latency": "latency_ms"})[COLUMNS]
    return kept.sort_values(COLUMNS[:4], kind="stable").reset_index(drop=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="an aiconfigurator checkout")
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--system", required=True, help="its system folder, e.g. b200_sxm")
    parser.add_argument("--version", required=True, help="the vLLM version folder, e.g. 0.19.0")
    parser.add_argument("--m-grid", type=Path, default=H100_TABLE, help="take m from this table")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    table = read_table(args.repo, args.commit, args.system, args.version)
    m_grid = sorted(pd.read_csv(args.m_grid)["m"].unique().tolist())
    rows = bundled_rows(table, m_grid)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(args.out, index=False)
    device = ", ".join(sorted(table["device"].unique()))
    print(f"{len(rows)} rows of {device} ({len(table)} in the table) -> {args.out}")


if __name__ == "__main__":
    main()
