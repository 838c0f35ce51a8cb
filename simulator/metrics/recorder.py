"""Rows the serving simulation records as it runs (no I/O): engine steps and inter-token
latencies, appended to flat buffers and turned into arrays once at the end; with KV tiers, a
sample of their state after every step with prefill work (`TIER_COLUMNS`)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import pandas as pd


class FinishedRequest(Protocol):
    """What a finished request's row reads (`serving.request.Request` has it)."""

    id: int
    replica: int
    arrival_s: float
    first_scheduled_s: float
    first_token_s: float
    finish_s: float
    prompt_len: int
    num_output: int
    preemptions: int
    cached_tokens: int
    priority: int


STEP_COLUMNS = (
    "replica",
    "start_s",
    "end_s",
    "num_seqs",
    "prefill_tokens",
    "decode_tokens",
    "kv_used_blocks",
)

# One row per request, written when it finishes (the request object is then let go).
REQUEST_COLUMNS = (
    "request_id",
    "replica",
    "arrival_s",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "prompt_tokens",
    "output_tokens",
    "preemptions",
    "cached_tokens",
    "priority",
)


RUN_FIELDS = 7  # start, num_seqs, prefill_tokens, decode_tokens, kv_before, kv_after, steps

# KV tiers (serving/kv_tiers.py), per replica: blocks held in HBM, CPU and NVMe and the tiers'
# capacities; bytes written to and read from each tier so far (over the replica's GPUs); prefix
# tokens found in each tier so far; seconds of loads so far.
TIER_COLUMNS = (
    "replica",
    "time_s",
    "gpu_blocks",
    "cpu_blocks",
    "nvme_blocks",
    "cpu_capacity_blocks",
    "nvme_capacity_blocks",
    "cpu_bytes_written",
    "cpu_bytes_read",
    "nvme_bytes_written",
    "nvme_bytes_read",
    "hit_tokens_gpu",
    "hit_tokens_cpu",
    "hit_tokens_nvme",
    "load_s",
)
Runs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # runs, step ends, steps, replica


class Recorder:
    """Flat buffers of doubles (8 bytes a value, no Python object per row): a day of traffic
    is tens of millions of steps. A replica's steps are kept as runs of steps with the same
    batch (a mixed step is a run of one), in its own buffers, so its rows come out in time
    order without sorting."""

    def __init__(self) -> None:
        self._runs: dict[int, array[float]] = {}  # replica -> runs, RUN_FIELDS each
        self._ends: dict[int, array[float]] = {}  # replica -> every step's end time
        self._gaps = array("d")  # inter-token gaps of one token each
        self._weighted = array("d")  # (gap, tokens) pairs
        self._requests = array("d")  # finished requests, REQUEST_COLUMNS in order
        self._tiers = array("d")  # KV tier samples, TIER_COLUMNS in order
        self._built: Runs | None = None  # the steps' arrays, built once the run is over

    def _buffers(self, replica: int) -> tuple[array[float], array[float]]:
        if self._built is not None:  # the buffers went into the arrays (`_concatenate`)
            raise RuntimeError("the run's step rows are built: release() before recording again")
        if replica not in self._runs:
            self._runs[replica], self._ends[replica] = array("d"), array("d")
        return self._runs[replica], self._ends[replica]

    def step(
        self,
        *,
        replica: int,
        start_s: float,
        end_s: float,
        num_seqs: int,
        prefill_tokens: int,
        decode_tokens: int,
        kv_used_blocks: int,
    ) -> None:
        """One step."""
        runs, ends = self._buffers(replica)
        runs.extend(
            (start_s, num_seqs, prefill_tokens, decode_tokens, kv_used_blocks, kv_used_blocks, 1)
        )
        ends.append(end_s)

    def decode_run(
        self,
        *,
        replica: int,
        start_s: float,
        end_s: Sequence[float],
        num_seqs: int,
        kv_before: int,
        kv_after: int,
        outputs: int | None = None,
    ) -> None:
        """Consecutive decode steps of the same `num_seqs` sequences ending at `end_s`, the
        first starting at `start_s`, KV usage growing from `kv_before` to `kv_after`; also
        the inter-token gaps of every step after the first (the caller records the first's,
        which depend on each sequence's previous token). `outputs`: of those sequences, the
        ones whose tokens are outputs (default all; the others compute to the end of a
        multi-step block): the steps' decode tokens and each step's inter-token gaps."""
        runs, ends = self._buffers(replica)
        tokens = num_seqs if outputs is None else outputs
        runs.extend((start_s, num_seqs, 0, tokens, kv_before, kv_after, len(end_s)))
        ends.extend(end_s)

    def kv_tiers(self, *, replica: int, time_s: float, row: Sequence[float]) -> None:
        """A sample of a replica's KV tiers: `row` is TIER_COLUMNS after replica and time."""
        self._tiers.extend((replica, time_s, *row))

    def kv_tier_frame(self) -> pd.DataFrame | None:
        """The KV tier samples by replica, then time (None when nothing has tiers)."""
        if not self._tiers:
            return None
        data = np.frombuffer(self._tiers, dtype=float).reshape(-1, len(TIER_COLUMNS))
        df = pd.DataFrame(data, columns=list(TIER_COLUMNS))
        df = df.sort_values(["replica", "time_s"], kind="stable", ignore_index=True)
        ints = [c for c in TIER_COLUMNS if c.endswith(("blocks", "replica")) or "tokens" in c]
        return df.astype({c: np.int64 for c in ints})

    def itl(self, gaps: list[float]) -> None:
        """Inter-token gaps, one token each."""
        self._gaps.extend(gaps)

    def itl_weighted(self, gap: float, tokens: int) -> None:
        """`tokens` tokens that each came `gap` after their previous one."""
        self._weighted.extend((gap, tokens))

    def request(self, req: FinishedRequest) -> None:
        """A finished request's row."""
        self._requests.extend(
            (
                req.id,
                req.replica,
                req.arrival_s,
                req.first_scheduled_s,
                req.first_token_s,
                req.finish_s,
                req.prompt_len,
                req.num_output,
                req.preemptions,
                req.cached_tokens,
                req.priority,
            )
        )

    def request_frame(self) -> pd.DataFrame:
        data = np.frombuffer(self._requests, dtype=float).reshape(-1, len(REQUEST_COLUMNS))
        df = pd.DataFrame(data, columns=list(REQUEST_COLUMNS))
        df = df.sort_values("request_id", ignore_index=True)
        ints = ("request_id", "replica", "prompt_tokens", "output_tokens", "preemptions")
        return df.astype({c: np.int64 for c in (*ints, "cached_tokens", "priority")})

    def _arrays(self) -> Runs:
        """All replicas' runs (rows of RUN_FIELDS), step ends, steps per run, replica per run;
        concatenated once for `step_frame` and `itl_sample` both."""
        if self._built is None:
            self._built = self._concatenate()
        return self._built

    def _concatenate(self) -> Runs:
        """The replicas' buffers copied into one array each, every buffer let go once copied
        (they are not needed again: `_buffers` starts afresh), so a long run holds its rows
        once, not twice, while they are copied."""
        replicas = sorted(self._runs)
        counts = [len(self._runs[r]) // RUN_FIELDS for r in replicas]
        runs = np.empty((sum(counts), RUN_FIELDS))
        ends = np.empty(sum(len(self._ends[r]) for r in replicas))
        row = at = 0
        for r, n in zip(replicas, counts, strict=True):
            runs[row : row + n] = np.frombuffer(self._runs.pop(r), dtype=float).reshape(n, -1)
            steps = np.frombuffer(self._ends.pop(r), dtype=float)
            ends[at : at + len(steps)] = steps
            row, at = row + n, at + len(steps)
            del steps  # the view, and with it the buffer
        owner = np.repeat(np.asarray(replicas, dtype=float), counts)
        return runs, ends, runs[:, 6].astype(np.int64), owner

    def step_frame(self) -> pd.DataFrame:
        """One row per step, by replica and then time. Counts are int32 and each column is
        built and kept before the next (a day of traffic is tens of millions of steps)."""
        runs, ends, k, owner = self._arrays()
        first = np.cumsum(k) - k  # each run's first row

        def start_s() -> np.ndarray:
            starts = np.concatenate(([0.0], ends[:-1]))[: len(ends)]
            starts[first] = runs[:, 0]
            return starts

        def kv_used() -> np.ndarray:  # grows linearly over a run
            slope = (runs[:, 5] - runs[:, 4]) / np.maximum(k - 1, 1)
            within = np.arange(len(ends), dtype=float)  # a step's index within its run
            within -= np.repeat(first.astype(float), k)
            within *= np.repeat(slope, k)  # (in place: a day of steps is GBs an array)
            within += np.repeat(runs[:, 4], k)
            return np.round(within, out=within)

        def count(values: np.ndarray) -> np.ndarray:
            return np.repeat(values.astype(np.int32), k)

        frame = {
            "replica": count(owner),
            "start_s": start_s(),
            "end_s": ends,
            "num_seqs": count(runs[:, 1]),
            "prefill_tokens": count(runs[:, 2]),
            "decode_tokens": count(runs[:, 3]),
            "kv_used_blocks": kv_used().astype(np.int32),
        }
        return pd.DataFrame(frame, copy=False)

    def itl_sample(self) -> tuple[np.ndarray, np.ndarray]:
        """Every recorded gap and how many tokens it applies to: the one-token gaps, the
        weighted ones, and the gaps between a run's consecutive steps (one per sequence).
        Written into two arrays allocated once (a day of traffic is tens of millions)."""
        runs, ends, k, _ = self._arrays()
        within = np.ones(len(ends), dtype=bool)
        within[np.cumsum(k) - k] = False  # a run's first step: its gaps are recorded apart
        gaps = np.frombuffer(self._gaps, dtype=float)
        pairs = np.frombuffer(self._weighted, dtype=float).reshape(-1, 2)
        head = len(gaps) + len(pairs)
        values = np.empty(head + int(np.count_nonzero(within)))
        weights = np.empty_like(values)
        values[: len(gaps)], weights[: len(gaps)] = gaps, 1.0
        values[len(gaps) : head], weights[len(gaps) : head] = pairs[:, 0], pairs[:, 1]
        np.compress(within, np.diff(ends, prepend=0.0), out=values[head:])
        np.compress(within, np.repeat(runs[:, 3], k), out=weights[head:])
        return values, weights

    def release(self) -> None:
        """Let every buffer go (the run is over and its frames are built): what is recorded
        after this starts afresh."""
        self._runs, self._ends, self._built = {}, {}, None
        self._gaps, self._weighted = array("d"), array("d")
        self._requests, self._tiers = array("d"), array("d")
