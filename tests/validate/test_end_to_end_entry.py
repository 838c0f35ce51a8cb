"""The held-out end-to-end rows taken together: signed median, optimistic share, within 25%."""

from __future__ import annotations

import pandas as pd
import pytest

from simulator.validate.summary import end_to_end_entry, summarize


def frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "suite": ["e2e_latency", "e2e_latency", "e2e_serving", "e2e_throughput_fit", "ops"],
            "device": ["h100_sxm"] * 5,
            "predicted_s": [0.8, 1.1, 0.5, 1.0, 2.0],
            "measured_s": [1.0, 1.0, 1.0, 2.0, 1.0],
            "ape_pct": [20.0, 10.0, 50.0, 50.0, 100.0],
            "fitted": [False, False, False, True, False],
        }
    )


def test_the_entry_reads_sign_share_and_spread() -> None:
    rows = frame().iloc[:3]
    entry = end_to_end_entry(rows)
    assert entry["n"] == 3
    assert entry["signed_median_pct"] == pytest.approx(-20.0)  # -20, +10, -50
    assert entry["optimistic_pct"] == pytest.approx(200 / 3)
    assert entry["within_25_pct"] == pytest.approx(200 / 3)


def test_summarize_takes_only_held_out_end_to_end_suites() -> None:
    summary = summarize(frame(), ["e2e_latency", "e2e_serving", "ops"])
    assert summary["end_to_end"]["suites"] == ["e2e_latency", "e2e_serving"]
    assert summary["end_to_end"]["n"] == 3
    assert "end_to_end" not in summarize(frame(), ["ops"])
