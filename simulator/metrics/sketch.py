"""A mergeable quantile sketch with a bounded relative error, for latencies summarised
without keeping every sample (the building block of a streaming run).

Log-spaced buckets as in DDSketch (Masson, Rim and Lee, "DDSketch: A Fast and Fully-Mergeable
Quantile Sketch with Relative-Error Guarantees", VLDB 2019, arXiv 1908.10693, section 2):
with gamma = (1 + alpha) / (1 - alpha), a positive value x falls in bucket
i = ceil(log_gamma(x)), which holds (gamma^(i-1), gamma^i]; the bucket is reported as
2 gamma^i / (gamma + 1), within a relative `alpha` of every value in it.

The guarantee: `quantile(q)` is within a relative `alpha` of the sample's order statistic of
0-based rank floor(q (n - 1)) over the (weighted) sample, i.e. `np.percentile(sample, 100 q,
method="lower")` — for values in [min_value, max_value]; values below `min_value` are counted
in its bucket (absolute error at most `min_value`), values above `max_value` in its bucket,
and zeros exactly. Counts, sums, minimum and maximum are exact. The buckets are one fixed
numpy array (about 1,700 for the defaults), so memory does not grow with the sample, and two
sketches with the same parameters merge by adding their counts: the merged sketch is the one
the union of their samples would have built.
"""

from __future__ import annotations

import math

import numpy as np

DEFAULT_ALPHA = 0.01  # 1% relative error: finer than the run-to-run spread of a seed
DEFAULT_MIN_S = 1e-9  # a nanosecond: below any simulated latency
DEFAULT_MAX_S = 1e6  # eleven days: above any simulated run


class QuantileSketch:
    """Weighted, mergeable, fixed-memory quantile sketch of non-negative values."""

    def __init__(
        self,
        alpha: float = DEFAULT_ALPHA,
        min_value: float = DEFAULT_MIN_S,
        max_value: float = DEFAULT_MAX_S,
    ) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
        if not 0.0 < min_value < max_value:
            raise ValueError("need 0 < min_value < max_value")
        self.alpha, self.min_value, self.max_value = alpha, min_value, max_value
        self._gamma = (1.0 + alpha) / (1.0 - alpha)
        self._log_gamma = math.log(self._gamma)
        self._offset = self._index(min_value)  # the lowest bucket's index
        self._counts = np.zeros(self._index(max_value) - self._offset + 1)
        self.zeros = 0.0  # weight of exact zeros
        self.count = 0.0  # total weight
        self.sum = 0.0  # sum of value * weight
        self.min = math.inf
        self.max = -math.inf

    def _index(self, x: float) -> int:
        return math.ceil(math.log(x) / self._log_gamma)

    @property
    def buckets(self) -> int:
        return len(self._counts)

    def add(self, values: np.ndarray, weights: np.ndarray | float = 1.0) -> None:
        """Add `values` (seconds, >= 0), each counted `weights` times (an array or one number)."""
        v = np.asarray(values, dtype=float).ravel()
        w = np.broadcast_to(np.asarray(weights, dtype=float), v.shape)
        if v.size == 0:
            return
        if not np.all(np.isfinite(v)) or v.min() < 0.0:
            raise ValueError("sketch values must be finite and non-negative")
        if not np.all(np.isfinite(w)) or w.min() < 0.0:
            raise ValueError("sketch weights must be finite and non-negative")
        self.count += float(w.sum())
        self.sum += float(np.dot(v, w))
        self.min = min(self.min, float(v.min()))
        self.max = max(self.max, float(v.max()))
        zero = v == 0.0
        self.zeros += float(w[zero].sum())
        pos, pw = v[~zero], w[~zero]
        if pos.size:
            clipped = np.clip(pos, self.min_value, self.max_value)
            idx = np.ceil(np.log(clipped) / self._log_gamma).astype(np.int64) - self._offset
            np.clip(idx, 0, len(self._counts) - 1, out=idx)
            self._counts += np.bincount(idx, weights=pw, minlength=len(self._counts))

    def merge(self, other: QuantileSketch) -> None:
        """Add `other`'s sample to this one (same alpha and range)."""
        same = (other.alpha, other.min_value, other.max_value)
        if same != (self.alpha, self.min_value, self.max_value):
            raise ValueError("only sketches with the same alpha and range merge")
        self._counts += other._counts
        self.zeros += other.zeros
        self.count += other.count
        self.sum += other.sum
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """The q-th quantile (0..1), within `alpha` of the sample's lower order statistic
        (module docstring); 0 for an empty sketch, as the summaries report."""
        if not 0.0 <= q <= 1.0:
            raise ValueError("quantiles must lie in [0, 1]")
        if self.count == 0.0:
            return 0.0
        if q == 0.0:
            return self.min
        if q == 1.0:
            return self.max
        # Weighted rank r = floor(q (n - 1)) (0-based): the first bucket whose cumulative
        # weight exceeds r. With integer weights this is the order statistic of that rank.
        rank = math.floor(q * (self.count - 1.0))
        if rank < self.zeros:
            return 0.0
        cumulative = np.cumsum(self._counts) + self.zeros
        i = int(np.searchsorted(cumulative, rank, side="right"))
        i = min(i, len(self._counts) - 1)
        value = 2.0 * self._gamma ** (i + self._offset) / (self._gamma + 1.0)
        return min(max(value, self.min), self.max)  # never outside the sample's range
