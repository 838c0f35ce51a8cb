"""The quantile sketch: its documented relative-error bound, weights, merging, fixed size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.metrics.sketch import QuantileSketch

QS = (0.01, 0.1, 0.5, 0.9, 0.99, 0.999)


def _check(sketch: QuantileSketch, sample: np.ndarray) -> None:
    for q in QS:
        exact = float(np.percentile(sample, 100 * q, method="lower"))
        got = sketch.quantile(q)
        assert abs(got - exact) <= sketch.alpha * exact + 1e-15, (q, got, exact)


def test_relative_error_bound_on_latency_like_sample() -> None:
    rng = np.random.default_rng(7)
    sample = rng.lognormal(mean=-3.0, sigma=1.5, size=200_000)  # seconds, heavy tail
    sketch = QuantileSketch(alpha=0.01)
    for chunk in np.array_split(sample, 17):  # streamed in chunks
        sketch.add(chunk)
    _check(sketch, sample)
    assert sketch.count == len(sample)
    assert sketch.sum == pytest.approx(float(sample.sum()), rel=1e-12)
    assert (sketch.min, sketch.max) == (sample.min(), sample.max())
    assert sketch.quantile(0.0) == sample.min() and sketch.quantile(1.0) == sample.max()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=1e4, allow_subnormal=False), min_size=1),
    st.sampled_from([0.001, 0.01, 0.05]),
)
def test_bound_holds_for_any_sample(values: list[float], alpha: float) -> None:
    sample = np.asarray([v if v == 0.0 or v >= 1e-9 else 1e-9 for v in values])
    sketch = QuantileSketch(alpha=alpha)
    sketch.add(sample)
    _check(sketch, sample)


def test_integer_weights_equal_repeated_values() -> None:
    rng = np.random.default_rng(3)
    values = rng.exponential(0.02, size=5_000)
    weights = rng.integers(0, 40, size=5_000)
    weighted = QuantileSketch()
    weighted.add(values, weights)
    repeated = QuantileSketch()
    repeated.add(np.repeat(values, weights))
    for q in QS:
        assert weighted.quantile(q) == repeated.quantile(q)
    _check(weighted, np.repeat(values, weights))
    assert weighted.count == repeated.count == weights.sum()


def test_merge_equals_the_union_and_size_is_fixed() -> None:
    rng = np.random.default_rng(11)
    a, b = rng.gamma(2.0, 0.05, size=30_000), rng.gamma(0.5, 2.0, size=70_000)
    left, right, union = QuantileSketch(), QuantileSketch(), QuantileSketch()
    left.add(a)
    right.add(b)
    union.add(np.concatenate([a, b]))
    size = left.buckets
    left.merge(right)
    assert left.buckets == size == union.buckets  # memory does not grow with the sample
    for q in QS:
        assert left.quantile(q) == union.quantile(q)
    assert left.count == union.count and left.sum == pytest.approx(union.sum)
    with pytest.raises(ValueError, match="same alpha"):
        left.merge(QuantileSketch(alpha=0.02))


def test_zeros_empty_and_bad_input() -> None:
    sketch = QuantileSketch()
    assert sketch.quantile(0.5) == 0.0 and sketch.mean == 0.0
    sketch.add(np.zeros(10))
    sketch.add(np.array([1.0]))
    assert sketch.quantile(0.5) == 0.0 and sketch.quantile(1.0) == 1.0
    assert sketch.mean == pytest.approx(1.0 / 11)
    with pytest.raises(ValueError, match="non-negative"):
        sketch.add(np.array([-1.0]))
    with pytest.raises(ValueError, match="non-negative"):
        sketch.add(np.array([float("nan")]))
    with pytest.raises(ValueError, match="alpha"):
        QuantileSketch(alpha=1.5)
    with pytest.raises(ValueError, match="quantiles"):
        sketch.quantile(2.0)
