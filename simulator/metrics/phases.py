"""Per-phase times of disaggregated serving (prefill pool -> KV transfer -> decode pool), per
request and summarised, and each pool's utilisation. Pure functions on the request and step
frames; colocated runs carry the columns empty (NaN, prefill_replica -1).

Per request, partitioning arrival -> KV in place on the decode replica:
- `prefill_queue_s`: arrival to its first prefill step;
- `prefill_s`: first prefill step to the first token (the prefill replica samples it);
- `decode_queue_s`: first token to the decode replica taking it (room in its KV cache);
- `transfer_s`: taken to the KV in place (the exposed transfer, link queueing included).
A request of one output token finishes on the prefill replica: no decode or transfer times.
Not reported apart: the wait from the KV in place to the decode replica's next step (it shows
in the gap to the second token, which TPOT and ITL count).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from simulator.metrics.stats import describe_ms

PHASE_COLUMNS = ("prefill_replica", "prefill_queue_s", "prefill_s", "decode_queue_s", "transfer_s")
PHASES = ("prefill_queue", "prefill", "decode_queue", "transfer")


def with_phases(
    requests: pd.DataFrame,
    *,
    prefill_replica: np.ndarray | None = None,
    decode_admit_s: np.ndarray | None = None,
    kv_ready_s: np.ndarray | None = None,
    prefill_end_s: np.ndarray | None = None,
) -> pd.DataFrame:
    """`requests` with PHASE_COLUMNS added in place (a run's fresh frame: no copy of a million
    rows) and returned. The arrays are indexed by request id (None: a colocated run, every
    column empty). `prefill_end_s`: when the prefill replica sampled each first token, where
    the client read it later (an API server's way back, `first_token_s`); None: then."""
    ids = requests["request_id"].to_numpy()
    if prefill_replica is None or decode_admit_s is None or kv_ready_s is None:
        requests["prefill_replica"] = np.full(len(ids), -1, dtype=np.int64)
        for column in PHASE_COLUMNS[1:]:
            requests[column] = np.nan
        return requests
    split = prefill_replica[ids] >= 0
    first = requests["first_token_s"].to_numpy(dtype=float)
    if prefill_end_s is not None:
        first = np.where(np.isnan(prefill_end_s[ids]), first, prefill_end_s[ids])
    scheduled = requests["first_scheduled_s"].to_numpy(dtype=float)
    admitted = decode_admit_s[ids]
    requests["prefill_replica"] = prefill_replica[ids].astype(np.int64)
    requests["prefill_queue_s"] = np.where(split, scheduled - requests["arrival_s"], np.nan)
    requests["prefill_s"] = np.where(split, first - scheduled, np.nan)
    requests["decode_queue_s"] = admitted - first
    requests["transfer_s"] = kv_ready_s[ids] - admitted
    return requests


def pool_utilization(steps: pd.DataFrame, *, replicas: Sequence[int], span_s: float) -> float:
    """Busy share of `replicas` over `span_s` seconds: their steps' total time over
    len(replicas) x span_s (0 when the span is empty)."""
    if span_s <= 0 or not replicas:
        return 0.0
    mine = steps["replica"].isin(list(replicas)).to_numpy()
    busy = float((steps["end_s"] - steps["start_s"]).to_numpy()[mine].sum())
    return busy / (len(replicas) * span_s)


def phase_summary(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    prefill_replicas: Sequence[int],
    decode_replicas: Sequence[int],
) -> dict[str, float]:
    """Mean, median and p99 of each phase in ms over the finished requests that went through
    it (`mean_transfer_ms`, `p99_decode_queue_ms`, ...), and each pool's utilisation from the
    first arrival to the last finish (`prefill_pool_utilization`, `decode_pool_utilization`)."""
    done = requests[requests["finish_s"].notna()]
    out: dict[str, float] = {}
    for phase in PHASES:
        values = done[f"{phase}_s"].dropna()
        stats = describe_ms(phase, values, percentiles=(99,))
        out.update({k: v for k, v in stats.items() if not k.startswith("std_")})
    arrivals = requests["arrival_s"]
    span = float(done["finish_s"].max() - arrivals.min()) if len(done) else 0.0
    out["prefill_pool_utilization"] = pool_utilization(
        steps, replicas=prefill_replicas, span_s=span
    )
    out["decode_pool_utilization"] = pool_utilization(steps, replicas=decode_replicas, span_s=span)
    return out
