"""The report's reductions: empirical CDFs, time-binned signals, the waiting count."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.report.series import ecdf, piecewise, waiting


def test_ecdf_has_one_point_per_distinct_value() -> None:
    x, f = ecdf([3.0, 1.0, 2.0, 2.0, np.nan])
    assert x.tolist() == [1.0, 2.0, 3.0]
    assert f.tolist() == [0.25, 0.75, 1.0]


def test_ecdf_weights_count_tokens() -> None:
    x, f = ecdf([1.0, 2.0], weights=[3.0, 1.0])
    assert x.tolist() == [1.0, 2.0]
    assert f.tolist() == [0.75, 1.0]


def test_ecdf_is_cut_to_evenly_spaced_probabilities() -> None:
    # 1000 values 0..999, F(i) = (i + 1) / 1000; at p = 0.1, 0.2, ..., 1.0 the values are
    # 99, 199, ..., 999.
    x, f = ecdf(np.arange(1000.0), max_points=10)
    assert x.tolist() == [99.0 + 100 * k for k in range(10)]
    assert f == pytest.approx([0.1 * (k + 1) for k in range(10)])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=300), st.integers(2, 50))
def test_ecdf_reduced_stays_on_the_full_curve(values: list[float], points: int) -> None:
    full_x, full_f = ecdf(values)
    x, f = ecdf(values, max_points=points)
    assert len(x) <= max(points, len(full_x))
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(f) >= 0)
    assert f[-1] == pytest.approx(1.0)
    lookup = dict(zip(full_x.tolist(), full_f.tolist(), strict=True))
    assert all(lookup[a] == pytest.approx(b) for a, b in zip(x, f, strict=True))


def test_few_intervals_come_back_as_they_are() -> None:
    s = piecewise([1.0, 0.0], [2.0, 1.0], [5.0, 3.0])
    assert not s.binned
    assert s.time_s.tolist() == [0.0, 1.0]
    assert s.mean.tolist() == [3.0, 5.0]


def test_bins_weight_each_value_by_the_time_it_holds() -> None:
    # [0,1): 2, [1,3): 4, gap, [4,5): 6; two bins over [0, 5], edges 0, 2.5, 5.
    # Bin 1: (2*1 + 4*1.5) / 2.5 = 3.2, peak 4. Bin 2: (4*0.5 + 6*1) / 1.5 = 16/3, peak 6.
    s = piecewise([0.0, 1.0, 4.0], [1.0, 3.0, 5.0], [2.0, 4.0, 6.0], max_points=2)
    assert s.binned
    assert s.time_s.tolist() == [1.25, 3.75]
    assert s.mean == pytest.approx([3.2, 16 / 3])
    assert s.peak.tolist() == [4.0, 6.0]


def test_a_bin_without_any_interval_is_undefined() -> None:
    s = piecewise([0.0, 9.0], [1.0, 10.0], [1.0, 1.0], max_points=1, span=(0.0, 10.0))
    assert s.mean.tolist() == [1.0]
    s = piecewise([0.0, 9.0], [1.0, 10.0], [1.0, 1.0], max_points=5, span=(0.0, 10.0))
    assert np.isnan(s.mean[2]) and np.isnan(s.peak[2])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.01, 10), st.floats(0, 100)), min_size=1, max_size=200),
    st.integers(1, 40),
)
def test_binned_means_keep_the_integral(parts: list[tuple[float, float]], bins: int) -> None:
    widths = np.array([w for w, _ in parts])
    y = np.array([v for _, v in parts])
    t1 = np.cumsum(widths)
    s = piecewise(t1 - widths, t1, y, max_points=bins, span=(0.0, float(t1[-1])))
    width = t1[-1] / bins
    assert np.nansum(s.mean) * width == pytest.approx(float(np.sum(y * widths)), rel=1e-6)
    assert np.all(s.peak >= s.mean - 1e-9)


def test_waiting_with_nothing_arrived_is_empty() -> None:
    times, counts = waiting([], [])
    assert times.size == counts.size == 0


def test_waiting_counts_arrived_and_not_left() -> None:
    # Arrivals at 0, 1, 1; leaves at 1, never, 2: one waits, then two, then one.
    times, counts = waiting([0.0, 1.0, 1.0], [1.0, np.nan, 2.0])
    assert times.tolist() == [0.0, 1.0, 2.0]
    assert counts.tolist() == [1.0, 2.0, 1.0]


def test_scheduled_on_arrival_never_waits() -> None:
    times, counts = waiting([0.5], [0.5])
    assert counts.tolist() == [0.0]
    assert times.tolist() == [0.5]
