"""The numbers behind the report's curves, small enough to plot: empirical CDFs at a bounded
number of quantiles, and piecewise-constant signals over time averaged into time bins.

Pure numpy; nothing here knows about plotly or about the simulator's tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MAX_POINTS = 2000  # points per trace: a day of traffic still makes a report of a few MB


def ecdf(
    values: npt.ArrayLike, *, weights: npt.ArrayLike | None = None, max_points: int = MAX_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) of the weighted empirical CDF, NaNs dropped. With more than `max_points`
    distinct values, the curve is taken at `max_points` evenly spaced probabilities (the
    weighted quantiles there), which keeps its shape to 1 / max_points in probability."""
    x = np.asarray(values, dtype=float).ravel()
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=float).ravel()
    if x.shape != w.shape:
        raise ValueError(f"values and weights differ in length: {x.size} != {w.size}")
    keep = np.isfinite(x) & (w > 0)
    x, w = x[keep], w[keep]
    if x.size == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(x, kind="stable")
    x, w = x[order], w[order]
    cum = np.cumsum(w) / w.sum()
    last = np.r_[x[1:] != x[:-1], True]  # one point per distinct value: its top step
    x, cum = x[last], cum[last]
    if x.size <= max_points:
        return x, cum
    probs = np.linspace(0.0, 1.0, max_points + 1)[1:]
    index = np.minimum(np.searchsorted(cum, probs - 1e-12), x.size - 1)
    return x[index], cum[index]


@dataclass(frozen=True)
class Binned:
    """A signal on `time_s`: raw points (`binned` False) or per-bin values (bin centres), with
    `mean` the time-weighted mean and `peak` the largest value held in the bin (NaN where the
    signal is undefined: no interval overlaps the bin)."""

    time_s: np.ndarray
    mean: np.ndarray
    peak: np.ndarray
    binned: bool


def piecewise(
    start_s: npt.ArrayLike,
    end_s: npt.ArrayLike,
    value: npt.ArrayLike,
    *,
    max_points: int = MAX_POINTS,
    span: tuple[float, float] | None = None,
) -> Binned:
    """A signal that holds `value[i]` over [start_s[i], end_s[i]) (non-overlapping intervals,
    as one replica's steps), undefined between intervals. Up to `max_points` intervals come
    back as they are (at their starts); more are averaged into `max_points` equal time bins
    over `span` (default: first start to last end), weighting each value by the time it holds
    within the bin."""
    t0 = np.asarray(start_s, dtype=float).ravel()
    t1 = np.asarray(end_s, dtype=float).ravel()
    y = np.asarray(value, dtype=float).ravel()
    order = np.argsort(t0, kind="stable")
    t0, t1, y = t0[order], np.maximum(t1[order], t0[order]), y[order]
    if t0.size == 0 or (t0.size <= max_points and span is None):
        return Binned(t0, y, y, binned=False)
    lo, hi = span if span is not None else (float(t0.min()), float(t1.max()))
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, max_points + 1)
    covered = _integral(t0, t1, np.ones_like(y), edges)
    area = _integral(t0, t1, y, edges)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(covered > 0, area / covered, np.nan)
    peak = _peaks(t0, t1, y, edges)
    return Binned((edges[:-1] + edges[1:]) / 2, mean, peak, binned=True)


def _integral(t0: np.ndarray, t1: np.ndarray, y: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Integral of the signal over each bin: the running integral at every edge, differenced.
    At edge e, the intervals ending by e count whole and the one after them counts up to e."""
    done = np.concatenate(([0.0], np.cumsum(y * (t1 - t0))))
    j = np.searchsorted(t1, edges, side="right")  # intervals ending at or before e
    nxt = np.minimum(j, t0.size - 1)
    partial = np.where(j < t0.size, y[nxt] * np.clip(edges - t0[nxt], 0.0, None), 0.0)
    return np.diff(done[j] + partial)


def _peaks(t0: np.ndarray, t1: np.ndarray, y: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Largest value among the intervals overlapping each bin (NaN for none)."""
    first = np.searchsorted(t1, edges[:-1], side="right")  # first interval ending after it opens
    stop = np.searchsorted(t0, edges[1:], side="left")  # intervals starting before it closes
    peak = np.full(edges.size - 1, np.nan)
    for k in np.flatnonzero(stop > first):
        peak[k] = y[first[k] : stop[k]].max()
    return peak


def waiting(arrival_s: npt.ArrayLike, leave_s: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(times, counts): the distinct event times, and how many items have arrived and not yet
    left just after each. An item with a NaN leave time never leaves; one that arrives and
    leaves at the same time is never counted."""
    arrive = np.asarray(arrival_s, dtype=float).ravel()
    leave = np.asarray(leave_s, dtype=float).ravel()
    leave = leave[np.isfinite(leave)]
    times = np.concatenate([arrive, leave])
    delta = np.concatenate([np.ones(arrive.size), -np.ones(leave.size)])
    order = np.argsort(times, kind="stable")
    times, counts = times[order], np.cumsum(delta[order])
    if times.size == 0:  # nothing arrived: no step in the count
        return times, counts
    last = np.r_[times[1:] != times[:-1], True]  # the count once every event at t is in
    return times[last], counts[last]
