"""Per-phase columns and summary of disaggregated runs, on hand-made frames."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simulator.metrics.phases import phase_summary, pool_utilization, with_phases


def requests() -> pd.DataFrame:
    # r0: arrives 0, first step 1, first token 3, decode replica takes it at 4, KV in place at
    # 6, finishes 10. r1: one output token, done on the prefill replica at 2 (arrived 1,
    # scheduled 1).
    return pd.DataFrame(
        {
            "request_id": [0, 1],
            "arrival_s": [0.0, 1.0],
            "first_scheduled_s": [1.0, 1.0],
            "first_token_s": [3.0, 2.0],
            "finish_s": [10.0, 2.0],
        }
    )


def test_phase_columns_partition_arrival_to_kv_in_place() -> None:
    df = with_phases(
        requests(),
        prefill_replica=np.array([0, 0]),
        decode_admit_s=np.array([4.0, np.nan]),
        kv_ready_s=np.array([6.0, np.nan]),
    )
    assert df["prefill_queue_s"].tolist() == [1.0, 0.0]
    assert df["prefill_s"].tolist() == [2.0, 1.0]
    assert df.loc[0, "decode_queue_s"] == 1.0 and df.loc[0, "transfer_s"] == 2.0
    assert np.isnan(df.loc[1, "decode_queue_s"]) and np.isnan(df.loc[1, "transfer_s"])
    colocated = with_phases(requests())
    assert colocated["prefill_replica"].tolist() == [-1, -1]
    assert colocated["transfer_s"].isna().all()


def test_summary_and_pool_utilization() -> None:
    df = with_phases(
        requests(),
        prefill_replica=np.array([0, 0]),
        decode_admit_s=np.array([4.0, np.nan]),
        kv_ready_s=np.array([6.0, np.nan]),
    )
    # replica 0 (prefill) busy 1-3 s; replicas 1, 2 (decode) busy 6-10 s and idle.
    steps = pd.DataFrame({"replica": [0, 1], "start_s": [1.0, 6.0], "end_s": [3.0, 10.0]})
    s = phase_summary(df, steps, prefill_replicas=[0], decode_replicas=[1, 2])
    # span: first arrival 0 to last finish 10
    assert s["prefill_pool_utilization"] == pytest.approx(2 / 10)
    assert s["decode_pool_utilization"] == pytest.approx(4 / 20)
    assert s["mean_transfer_ms"] == 2000.0 and s["p99_transfer_ms"] == 2000.0
    assert s["mean_prefill_ms"] == 1500.0  # both requests prefilled: 2 s and 1 s
    assert s["mean_decode_queue_ms"] == 1000.0  # only r0 went to the decode pool
    assert not any(k.startswith("std_") for k in s)
    assert pool_utilization(steps, replicas=[0], span_s=0.0) == 0.0
