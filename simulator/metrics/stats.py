"""Percentiles and summary statistics of plain and weighted samples, in vLLM's conventions.

vLLM's benchmarks summarise every latency list with `np.mean`, `np.median`, `np.std` (population,
ddof=0) and `np.percentile` (numpy's default "linear" method), and report 0 for an empty list
(`np.mean(xs or 0)`). `describe_ms` does the same. The simulator's inter-token latencies come as a
weighted sample (one decode step of duration d gives b requests a token after d seconds); the
weighted statistics here equal numpy's on the sample with each value repeated `weight` times,
without building it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

PercentileMethod = Literal["linear", "inverted_cdf"]


def weighted_percentile(
    values: npt.ArrayLike,
    weights: npt.ArrayLike,
    q: npt.ArrayLike,
    *,
    method: PercentileMethod = "linear",
) -> float | np.ndarray:
    """The q-th percentile(s) (0..100) of `values`, each counted `weights` times.

    With integer weights the result equals `np.percentile(np.repeat(values, weights), q,
    method=method)`; fractional weights extend the same step function of cumulative weight.
    "linear" (numpy's default, what vLLM reports) interpolates between the order statistics
    around rank (N - 1) q / 100, N the total weight; "inverted_cdf" is the smallest value whose
    cumulative weight reaches q / 100 of N. Zero weights drop their value. Returns a float for
    a scalar `q`, else an array shaped like `q`. Raises ValueError on an empty sample (or all
    zero weights), negative weights, mismatched lengths or q outside [0, 100].
    """
    v = np.asarray(values, dtype=float).ravel()
    w = np.asarray(weights, dtype=float).ravel()
    qs = np.asarray(q, dtype=float)
    if v.shape != w.shape:
        raise ValueError(f"values and weights differ in length: {v.size} != {w.size}")
    if np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError("weights must be finite and non-negative")
    if np.any((qs < 0) | (qs > 100)) or not np.all(np.isfinite(qs)):
        raise ValueError("percentiles must lie in [0, 100]")
    keep = w > 0
    if not keep.all():  # (a copy of a sample of tens of millions only when needed)
        v, w = v[keep], w[keep]
    del keep
    if v.size == 0:
        raise ValueError("weighted_percentile of an empty sample")
    order = np.argsort(v, kind="stable")
    cum = w[order]
    np.cumsum(cum, out=cum)  # in place: one array of the sample's size less
    v = v[order]
    del order
    total = cum[-1]
    last = v.size - 1
    frac_q = qs / 100.0
    if method == "inverted_cdf":
        # smallest value whose cumulative weight reaches q N (the first one for q = 0)
        result = v[np.minimum(np.searchsorted(cum, frac_q * total, side="left"), last)]
    else:
        # order statistic k (0-based) of the expanded sample is the first value whose
        # cumulative weight exceeds k
        rank = np.maximum(total - 1.0, 0.0) * frac_q
        below = np.floor(rank)
        lo = v[np.minimum(np.searchsorted(cum, below, side="right"), last)]
        hi = v[np.minimum(np.searchsorted(cum, below + 1.0, side="right"), last)]
        result = lo + (rank - below) * (hi - lo)
    return float(result) if result.ndim == 0 else result


def percentile_word(p: float) -> str:
    """How vLLM names percentile p in keys and labels: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def describe_ms(
    name: str,
    values_s: npt.ArrayLike,
    *,
    percentiles: tuple[float, ...],
    weights: npt.ArrayLike | None = None,
) -> dict[str, float]:
    """vLLM's `mean_<name>_ms`, `median_<name>_ms`, `std_<name>_ms`, `p<q>_<name>_ms` of a sample
    in seconds (reported in ms), optionally weighted. An empty sample reports 0 everywhere, as
    vLLM does."""
    v = np.asarray(values_s, dtype=float).ravel()
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=float).ravel()
    if v.shape != w.shape:
        raise ValueError(f"{name}: values and weights differ in length: {v.size} != {w.size}")
    if v.size == 0 or float(w.sum()) <= 0:
        v, w = np.zeros(1), np.ones(1)
    if weights is None:
        mean, std = float(np.mean(v)), float(np.std(v))
        median = float(np.median(v))  # vLLM's np.median: the midpoint, not a lerp
        points = [float(x) for x in np.percentile(v, list(percentiles))]
    else:
        mean = float(np.average(v, weights=w))
        squares = v - mean
        squares **= 2  # in place: (v - mean) ** 2 without a second array
        std = float(np.sqrt(np.average(squares, weights=w)))
        del squares
        qs = [50.0, *percentiles]  # one sort for the median and every percentile
        median, *points = (float(x) for x in np.atleast_1d(weighted_percentile(v, w, qs)))
    out = {
        f"mean_{name}_ms": mean * 1000.0,
        f"median_{name}_ms": median * 1000.0,
        f"std_{name}_ms": std * 1000.0,
    }
    for p, value in zip(percentiles, points, strict=True):
        out[f"p{percentile_word(p)}_{name}_ms"] = value * 1000.0
    return out
