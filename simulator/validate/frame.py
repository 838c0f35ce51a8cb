"""The row layout every suite returns, and the small helpers the suites share."""

from __future__ import annotations

import numpy as np
import pandas as pd

# First columns of every suite's DataFrame; shape columns follow.
COLUMNS = ["suite", "device", "kind", "case", "predicted_s", "measured_s", "ape_pct", "fitted"]


def ape_pct(predicted: np.ndarray | pd.Series, measured: np.ndarray | pd.Series) -> np.ndarray:
    """Absolute percentage error of each prediction, 100 * |predicted - measured| / measured."""
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    return 100.0 * np.abs(p - m) / m


def median_repeats(df: pd.DataFrame, keys: list[str], values: list[str]) -> pd.DataFrame:
    """One row per distinct `keys`: the median of each of `values` over the repeats, and the
    number of repeats in `repeats`."""
    grouped = df.groupby(keys, sort=True, dropna=False)
    out = grouped[values].median()
    out["repeats"] = grouped.size()
    return out.reset_index()


def finish(df: pd.DataFrame, *, suite: str, fitted: bool) -> pd.DataFrame:
    """Stamp the suite name and `fitted`, add `ape_pct`, and put COLUMNS first."""
    df = df.assign(suite=suite, fitted=fitted)
    df["ape_pct"] = ape_pct(df["predicted_s"], df["measured_s"])
    rest = [c for c in df.columns if c not in COLUMNS]
    return df[COLUMNS + rest].reset_index(drop=True)


def finish_split(
    df: pd.DataFrame, fitted: np.ndarray, *, suite: str, fit_suite: str
) -> pd.DataFrame:
    """`finish` the rows `fitted` marks as suite `fit_suite` (fitted) and the rest as `suite`
    (held out), held-out rows first."""
    return pd.concat(
        [
            finish(df[~fitted], suite=suite, fitted=False),
            finish(df[fitted], suite=fit_suite, fitted=True),
        ],
        ignore_index=True,
    )


def empty(suite: str) -> pd.DataFrame:
    """A suite with no rows (e.g. a device the data does not cover)."""
    return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS}).assign(suite=suite)
