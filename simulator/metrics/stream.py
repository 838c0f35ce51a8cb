"""A streaming run's recorder: running aggregates instead of rows, so a run's memory stays
flat in its number of requests and steps.

`StreamRecorder` records as `Recorder` does, but every `CHUNK_ROWS` steps (and every
`CHUNK_ROWS` finished requests) it turns what it holds into a chunk of rows, hands the step
chunk to `on_steps` (the energy account, `runs.energy.EnergyAccumulator`), folds the chunk
into `StreamSummary` and lets the rows go. `StreamSummary` keeps exact counts, sums, sums of
squares, minima and maxima, and the latencies' percentiles in `QuantileSketch`es (within a
relative 1% of numpy's "lower" order statistic, `metrics.sketch`).

Not available in a streaming summary (absent from it): `max_output_tokens_per_s` and
`max_concurrent_requests` (per-second peaks need every request's and token's second).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from simulator.metrics.recorder import REQUEST_COLUMNS, FinishedRequest, Recorder
from simulator.metrics.sketch import QuantileSketch
from simulator.metrics.stats import percentile_word

CHUNK_ROWS = 100_000  # rows held before they are folded into the aggregates
STREAM_ABSENT = ("max_output_tokens_per_s", "max_concurrent_requests")
LATENCIES = ("ttft", "tpot", "itl", "e2el", "queueing")


class _Moments:
    """Exact weight, sum and sum of squares of a (weighted) sample, and its sketch."""

    def __init__(self) -> None:
        self.sketch = QuantileSketch()
        self.sum_sq = 0.0

    def add(self, values: np.ndarray, weights: np.ndarray | float = 1.0) -> None:
        v = np.asarray(values, dtype=float)
        w = np.broadcast_to(np.asarray(weights, dtype=float), v.shape)
        keep = w > 0
        v, w = v[keep], w[keep]
        self.sketch.add(v, w)
        self.sum_sq += float(np.dot(v * v, w))

    def describe_ms(self, name: str, percentiles: Sequence[float]) -> dict[str, float]:
        """`stats.describe_ms`'s keys, from the aggregates (percentiles from the sketch;
        an empty sample reports 0 everywhere, as vLLM does)."""
        s = self.sketch
        mean = s.mean
        var = max(self.sum_sq / s.count - mean * mean, 0.0) if s.count else 0.0
        out = {
            f"mean_{name}_ms": mean * 1000.0,
            f"median_{name}_ms": s.quantile(0.5) * 1000.0,
            f"std_{name}_ms": math.sqrt(var) * 1000.0,
        }
        for p in percentiles:
            out[f"p{percentile_word(p)}_{name}_ms"] = s.quantile(p / 100.0) * 1000.0
        return out


class StreamSummary:
    """`metrics.summary.serve_summary`'s figures, folded from chunks of request rows and ITL
    samples as they come (the benchmark starts at t = 0, as a scenario run's does)."""

    def __init__(
        self, *, goodput: Mapping[str, float] | None = None, prefix_caching: bool = False
    ) -> None:
        self.slos = dict(goodput or {})
        self.prefix_caching = prefix_caching
        self.latency = {name: _Moments() for name in LATENCIES}
        self.requests = self.completed = self.good = 0
        self.prompt_tokens = self.output_tokens = self.preemptions = self.cached_tokens = 0
        self.last_finish = -math.inf

    def add_requests(self, rows: pd.DataFrame) -> None:
        """A chunk of request rows (`metrics.recorder.REQUEST_COLUMNS`)."""
        self.requests += len(rows)
        self.preemptions += int(rows["preemptions"].sum())
        done = rows[rows["first_token_s"].notna() & rows["finish_s"].notna()]
        if not len(done):
            return
        arrival = done["arrival_s"].to_numpy(float)
        first = done["first_token_s"].to_numpy(float)
        finish = done["finish_s"].to_numpy(float)
        out = done["output_tokens"].to_numpy(float)
        self.completed += len(done)
        self.prompt_tokens += int(done["prompt_tokens"].sum())
        self.output_tokens += int(out.sum())
        self.cached_tokens += int(done["cached_tokens"].sum())
        self.last_finish = max(self.last_finish, float(finish.max()))
        ttft, e2el = first - arrival, finish - arrival
        multi = out > 1
        tpot = (finish[multi] - first[multi]) / (out[multi] - 1)
        self.latency["ttft"].add(ttft)
        self.latency["e2el"].add(e2el)
        self.latency["tpot"].add(tpot)
        self.latency["queueing"].add(done["first_scheduled_s"].to_numpy(float) - arrival)
        if self.slos:  # as summary._good_count: TPOT 0 for one-token outputs
            per = {
                "ttft": ttft,
                "e2el": e2el,
                "tpot": np.where(out > 1, (finish - first) / np.maximum(out - 1, 1), 0.0),
            }
            good = np.ones(len(done), dtype=bool)
            for name, slo_ms in self.slos.items():
                good &= per[name] <= slo_ms / 1000.0
            self.good += int(good.sum())

    def add_itl(self, values: np.ndarray, weights: np.ndarray) -> None:
        """A chunk of the weighted inter-token-latency sample."""
        self.latency["itl"].add(values, weights)

    @property
    def duration(self) -> float:
        return self.last_finish if self.completed else 0.0

    def summary(self, percentiles: Sequence[float]) -> dict[str, float | int | None]:
        """`serve_summary`'s keys but `STREAM_ABSENT`; percentiles from the sketches."""
        duration = self.duration

        def rate(count: float) -> float:
            return count / duration if duration > 0 else 0.0

        total = self.prompt_tokens + self.output_tokens
        out: dict[str, float | int | None] = {
            "duration": duration,
            "completed": self.completed,
            "failed": self.requests - self.completed,
            "total_input_tokens": self.prompt_tokens,
            "total_output_tokens": self.output_tokens,
            "request_throughput": rate(self.completed),
            "request_goodput": rate(self.good) if self.slos else None,
            "output_throughput": rate(self.output_tokens),
            "total_token_throughput": rate(total),
        }
        for name in ("ttft", "tpot", "itl", "e2el"):
            out.update(self.latency[name].describe_ms(name, percentiles))
        out.update(self.latency["queueing"].describe_ms("queueing", (99,)))
        del out["std_queueing_ms"]
        out["preemptions"] = self.preemptions
        if self.prefix_caching:
            hit = self.cached_tokens / self.prompt_tokens if self.prompt_tokens > 0 else 0.0
            out["prefix_cache_hit_rate"] = hit
            out["prefix_cache_saved_tokens"] = self.cached_tokens
        return out

    def mean_lengths(self) -> tuple[float, float] | None:
        """The completed requests' mean prompt and output lengths (None without one)."""
        if not self.completed:
            return None
        return self.prompt_tokens / self.completed, self.output_tokens / self.completed


class StreamRecorder(Recorder):
    """A `Recorder` that folds its rows into `summary` (and hands each chunk of steps to
    `on_steps`) every `chunk` rows (None: `CHUNK_ROWS`), and keeps none: its frames come out
    empty."""

    def __init__(
        self,
        summary: StreamSummary,
        *,
        on_steps: Callable[[pd.DataFrame], None] | None = None,
        chunk: int | None = None,
    ) -> None:
        super().__init__()
        self.stream = summary
        self.on_steps = on_steps
        self.chunk = CHUNK_ROWS if chunk is None else chunk
        self.steps_seen = 0
        self._pending = 0  # steps held
        self._held = 0  # requests held

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
        super().step(
            replica=replica,
            start_s=start_s,
            end_s=end_s,
            num_seqs=num_seqs,
            prefill_tokens=prefill_tokens,
            decode_tokens=decode_tokens,
            kv_used_blocks=kv_used_blocks,
        )
        self._pending += 1
        if self._pending >= self.chunk:
            self._flush_steps()

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
        super().decode_run(
            replica=replica,
            start_s=start_s,
            end_s=end_s,
            num_seqs=num_seqs,
            kv_before=kv_before,
            kv_after=kv_after,
            outputs=outputs,
        )
        self._pending += len(end_s)
        if self._pending >= self.chunk:
            self._flush_steps()

    def request(self, req: FinishedRequest) -> None:
        super().request(req)
        self._held += 1
        if self._held >= self.chunk:
            self._flush_requests()

    def _flush_steps(self) -> None:
        frame = super().step_frame()
        values, weights = super().itl_sample()
        self.release_steps()
        self.steps_seen += len(frame)
        self.stream.add_itl(values, weights)
        if self.on_steps is not None and len(frame):
            self.on_steps(frame)

    def _flush_requests(self) -> None:
        if self._held:
            self.stream.add_requests(super().request_frame())
        self._requests = type(self._requests)("d")
        self._held = 0

    def release_steps(self) -> None:
        self._runs, self._ends, self._built = {}, {}, None
        self._gaps, self._weighted = type(self._gaps)("d"), type(self._weighted)("d")
        self._pending = 0

    def request_frame(self) -> pd.DataFrame:
        """Folds the requests held; an empty frame (the rows were not kept)."""
        self._flush_requests()
        return super().request_frame()

    def step_frame(self) -> pd.DataFrame:
        """Folds the steps held; an empty frame."""
        self._flush_steps()
        return super().step_frame()

    def itl_sample(self) -> tuple[np.ndarray, np.ndarray]:
        """Folds the steps held; an empty sample."""
        self._flush_steps()
        return np.empty(0), np.empty(0)


__all__ = ["CHUNK_ROWS", "REQUEST_COLUMNS", "STREAM_ABSENT", "StreamRecorder", "StreamSummary"]
