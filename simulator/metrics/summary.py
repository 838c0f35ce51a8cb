"""What `vllm bench serve` and `vllm bench throughput` report, from the simulator's request table.

Pure functions on pandas / numpy; the only output is formatted text. Definitions follow
`vllm/benchmarks/serve.py` (`calculate_metrics`, `benchmark`) and `vllm/benchmarks/throughput.py`:

- a request is completed when it has a first token and a finish time; the others count as
  `failed` and contribute nothing else (vLLM's failed requests add no tokens and no latencies);
- TTFT = first token - arrival, E2EL = finish - arrival, both per completed request;
- TPOT = (E2EL - TTFT) / (output_tokens - 1), only over requests with more than one output
  token; for goodput a request with one output token has TPOT 0 (vLLM's `all_tpots`);
- ITL is the weighted sample of decode-step durations the simulator records, taken as given
  (the caller decides which steps belong to the benchmark);
- throughputs divide by the benchmark duration, by default from the first arrival to the last
  finish (vLLM: from the benchmark start to the last response);
- goodput counts completed requests meeting every given SLO (`metric <= SLO`), per second.

Not modelled: vLLM's "Peak output token throughput" (it needs every token's timestamp; the
simulator's ITL sample does not say which request got which token) and client-side queueing
(the simulator has no HTTP client; `*_queueing_ms` is the server-side wait for the first
scheduled step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from simulator.errors import SpecError
from simulator.metrics.bands import band_lines, band_suffix, band_text
from simulator.metrics.stats import describe_ms, percentile_word

Summary = dict[str, float | int | None]

SLO_METRICS = ("ttft", "tpot", "e2el")
# key, label, section heading: as vLLM's `process_one_metric` prints them
LATENCY_SECTIONS = (
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2el", "E2EL", "End-to-end Latency"),
)
REQUEST_COLUMNS = (
    "request_id",
    "arrival_s",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "prompt_tokens",
    "output_tokens",
    "preemptions",
    "cached_tokens",
)
WIDTH = 50
PERCENTILES = (50.0, 90.0, 99.0)  # the summary's percentiles unless more are asked for


def serve_summary(
    requests: pd.DataFrame,
    *,
    itl_s: npt.ArrayLike,
    itl_weight: npt.ArrayLike,
    duration_s: float | None = None,
    goodput: Mapping[str, float] | None = None,
    percentiles: Sequence[float] = PERCENTILES,
    prefix_caching: bool = False,
    start_s: float | None = None,
    later_tokens: tuple[npt.ArrayLike, npt.ArrayLike] | None = None,
) -> Summary:
    """`vllm bench serve --output-json` metrics, then the simulator's extras.

    `requests`: one row per request (`REQUEST_COLUMNS`, times in absolute seconds, NaN
    `first_token_s` / `finish_s` for unfinished ones). `itl_s` / `itl_weight`: decode-step
    durations and how many requests got a token after each. `goodput`: SLOs in ms keyed by
    `ttft` / `tpot` / `e2el` (see `parse_goodput`); without SLOs `request_goodput` is None, as
    vLLM writes it. Keys: vLLM's `duration`, `completed`, `failed`, `total_input_tokens`,
    `total_output_tokens`, `request_throughput`, `request_goodput`, `output_throughput`,
    `total_token_throughput`, `max_concurrent_requests`, then `mean/median/std/p<q>_<m>_ms` for
    ttft, tpot, itl, e2el; extras `mean/median/p99_queueing_ms`, `preemptions`, and with
    `prefix_caching` `prefix_cache_hit_rate` (cached / prompt tokens of completed requests,
    each request's cache hit when first admitted, as vLLM's num_cached_tokens) and
    `prefix_cache_saved_tokens` (those cached tokens). Rates are 0 when the duration is 0
    (nothing completed). The duration runs from `start_s` (the benchmark's start: vLLM sends
    its first request one inter-arrival gap after it, and times the gap) or, when None, from
    the first arrival, to the last finish. `later_tokens`: the times of the output tokens
    after each request's first and how many at each (a decode step's end, its decodes); with
    it, vLLM's `max_output_tokens_per_s` (absent without). `max_concurrent_requests` is
    vLLM's per-second count (`per_second_peaks`).
    """
    _require_columns(requests)
    pcts = _check_percentiles(percentiles)
    slos = _check_slos(goodput or {})
    done = completed_requests(requests)
    duration = _duration(requests, duration_s, start_s)
    ttft = done["first_token_s"] - done["arrival_s"]
    e2el = done["finish_s"] - done["arrival_s"]
    multi = done[done["output_tokens"] > 1]
    tpot = (multi["finish_s"] - multi["first_token_s"]) / (multi["output_tokens"] - 1)
    total_in = int(done["prompt_tokens"].sum())
    total_out = int(done["output_tokens"].sum())

    out: Summary = {
        "duration": duration,
        "completed": len(done),
        "failed": len(requests) - len(done),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": _rate(len(done), duration),
        "request_goodput": _rate(_good_count(done, slos), duration) if slos else None,
        "output_throughput": _rate(total_out, duration),
        "total_token_throughput": _rate(total_in + total_out, duration),
    }
    times, counts = later_tokens if later_tokens is not None else ((), ())
    token_s = np.concatenate([done["first_token_s"].to_numpy(float), np.asarray(times, float)])
    token_n = np.concatenate([np.ones(len(done)), np.asarray(counts, float)])
    peak_tokens, peak_requests = per_second_peaks(
        done["arrival_s"], done["finish_s"], token_s, token_n
    )
    if later_tokens is not None:
        out["max_output_tokens_per_s"] = peak_tokens
    out["max_concurrent_requests"] = peak_requests
    out.update(describe_ms("ttft", ttft, percentiles=pcts))
    out.update(describe_ms("tpot", tpot, percentiles=pcts))
    itl_values, itl_weights = _itl_sample(itl_s, itl_weight)
    out.update(describe_ms("itl", itl_values, weights=itl_weights, percentiles=pcts))
    out.update(describe_ms("e2el", e2el, percentiles=pcts))
    queueing = done["first_scheduled_s"] - done["arrival_s"]
    out.update(describe_ms("queueing", queueing, percentiles=(99,)))
    del out["std_queueing_ms"]
    out["preemptions"] = int(requests["preemptions"].sum())
    if prefix_caching:
        cached = int(done["cached_tokens"].sum())
        out["prefix_cache_hit_rate"] = cached / total_in if total_in > 0 else 0.0
        out["prefix_cache_saved_tokens"] = cached
    return out


def kv_tier_summary(tiers: pd.DataFrame) -> Summary:
    """Totals of a run's KV tier samples (`metrics.recorder.TIER_COLUMNS`), over all replicas:
    `kv_offload_cpu_bytes_written` / `_read` (bytes over the host link, all GPUs),
    `kv_offload_cpu_peak_fraction` (of the tier's capacity, the fullest replica),
    `prefix_cache_hit_tokens_gpu` / `_cpu` (prefix tokens found in each tier, every admission,
    readmissions included), `kv_offload_load_s` (seconds of loads: the batch's wait with
    lmcache, the loading requests' with native); the same `nvme` keys with an NVMe tier."""
    last = tiers.groupby("replica").tail(1)  # cumulative counters: each replica's final sample
    tiers_present = ["cpu"] + (["nvme"] if int(last["nvme_capacity_blocks"].sum()) else [])
    out: Summary = {}
    for tier in tiers_present:
        out[f"kv_offload_{tier}_bytes_written"] = float(last[f"{tier}_bytes_written"].sum())
        out[f"kv_offload_{tier}_bytes_read"] = float(last[f"{tier}_bytes_read"].sum())
        fill = tiers[f"{tier}_blocks"] / tiers[f"{tier}_capacity_blocks"].clip(lower=1)
        out[f"kv_offload_{tier}_peak_fraction"] = float(fill.max())
    for tier in ["gpu", *tiers_present]:
        out[f"prefix_cache_hit_tokens_{tier}"] = int(last[f"hit_tokens_{tier}"].sum())
    out["kv_offload_load_s"] = float(last["load_s"].sum())
    return out


def throughput_summary(requests: pd.DataFrame, *, duration_s: float | None = None) -> Summary:
    """`vllm bench throughput --output-json` keys: `elapsed_time` (s), `num_requests`,
    `total_num_tokens` (prompt + output tokens), `requests_per_second`, `tokens_per_second`,
    `output_tokens_per_second`.

    Counts completed requests only (vLLM's offline run finishes every prompt; a simulation cut
    short should not credit unfinished ones). `elapsed_time` defaults to the first arrival to
    the last finish.
    """
    _require_columns(requests)
    done = completed_requests(requests)
    elapsed = _duration(requests, duration_s)
    prompt = int(done["prompt_tokens"].sum())
    output = int(done["output_tokens"].sum())
    return {
        "elapsed_time": elapsed,
        "num_requests": len(done),
        "total_num_tokens": prompt + output,
        "requests_per_second": _rate(len(done), elapsed),
        "tokens_per_second": _rate(prompt + output, elapsed),
        "output_tokens_per_second": _rate(output, elapsed),
    }


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """vLLM's `--goodput` pairs -> SLOs in ms: ["ttft:200", "tpot:50"] -> {"ttft": 200.0, ...}.

    Names are `ttft`, `tpot`, `e2el`; values non-negative milliseconds. Anything else raises
    SpecError(field="goodput"). A repeated name keeps its last value, as vLLM's dict does.
    """
    slos: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        name = name.strip()
        if not sep or ":" in value:
            raise SpecError(f"expected NAME:MS pairs like ttft:200, got {item!r}", field="goodput")
        try:
            slos[name] = float(value)
        except ValueError:
            raise SpecError(
                f"{item!r}: {value.strip()!r} is not a number of milliseconds", field="goodput"
            ) from None
    return _check_slos(slos)


def format_serve_summary(
    summary: Mapping[str, float | int | None],
    *,
    metrics: Sequence[str] | None = None,
    max_concurrency: int | None = None,
    request_rate: float | None = None,
) -> str:
    """The text block `vllm bench serve` prints, then the simulator's extras. `metrics`: the
    latency sections to show (vLLM's --percentile-metrics; None: all four);
    `max_concurrency` and a finite `request_rate` are printed as vLLM prints the flags. Where
    the summary has error bands (`K_interval`, metrics.bands), each figure with one shows it
    beside it, and a line after the block says where they come from (or why there are
    none)."""
    s = summary
    lines = [
        "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=WIDTH, c="="),
        _row("Successful requests:", s["completed"]),
        _row("Failed requests:", s.get("failed", 0)),
    ]
    if max_concurrency is not None:
        lines.append(_row("Maximum request concurrency:", max_concurrency))
    if request_rate is not None and math.isfinite(request_rate):
        lines.append(_row("Request rate configured (RPS):", request_rate, ".2f"))
    lines += [
        _row("Benchmark duration (s):", s["duration"], ".2f"),
        _row("Total input tokens:", s["total_input_tokens"]),
        _row("Total generated tokens:", s["total_output_tokens"]),
        _banded("Request throughput (req/s):", s, "request_throughput"),
    ]
    if s.get("request_goodput") is not None:
        lines.append(_row("Request goodput (req/s):", s["request_goodput"], ".2f"))
    lines.append(_banded("Output token throughput (tok/s):", s, "output_throughput"))
    if s.get("max_output_tokens_per_s") is not None:
        lines.append(
            _row("Peak output token throughput (tok/s):", s["max_output_tokens_per_s"], ".2f")
        )
    if "max_concurrent_requests" in s:
        lines.append(_row("Peak concurrent requests:", s["max_concurrent_requests"], ".2f"))
    lines.append(_banded("Total Token throughput (tok/s):", s, "total_token_throughput"))
    for key, label, heading in LATENCY_SECTIONS:
        if metrics is None or key in metrics:
            lines += _latency_section(s, key, label, heading)
    if "mean_queueing_ms" in s:
        lines += _latency_section(s, "queueing", "Queueing", "Queueing (arrival to 1st step)")
    if "preemptions" in s:
        lines.append("{s:{c}^{n}}".format(s="Scheduler", n=WIDTH, c="-"))
        lines.append(_row("Preemptions:", s["preemptions"]))
    if "prefix_cache_hit_rate" in s:
        hit_pct = 100 * _num(s["prefix_cache_hit_rate"])
        lines.append(_row("Prefix cache hit rate (%):", hit_pct, ".2f"))
        lines.append(_row("Prefill tokens saved by the cache:", s["prefix_cache_saved_tokens"]))
    lines += _tier_section(s)
    lora = lora_lines(s)
    if lora:
        lines.append("{s:{c}^{n}}".format(s="LoRA adapters", n=WIDTH, c="-"))
        lines += lora
    split = pd_partition_lines(s)
    if split:
        lines.append("{s:{c}^{n}}".format(s="Intra-GPU P/D split", n=WIDTH, c="-"))
        lines += split
    lines += _fleet_section(s)
    lines += _power_section(s)
    lines += bound_lines(s)
    lines.append("=" * WIDTH)
    return "\n".join(lines + band_lines(s))


def _fleet_section(s: Mapping[str, Any]) -> list[str]:
    """An autoscaled run's fleet figures (runs.runner.fleet_summary), where the summary has
    them."""
    if "fleet_gpu_hours" not in s:
        return []
    lines = [
        "{s:{c}^{n}}".format(s="Fleet (autoscaled)", n=WIDTH, c="-"),
        _row("GPU-hours:", s["fleet_gpu_hours"], ".4f"),
        _row("Replicas serving (mean):", s["fleet_replicas_mean"], ".2f"),
        _row("Replicas serving (peak):", s["fleet_replicas_peak"], ".0f"),
        _row("Replicas added:", s["fleet_scale_ups"], ".0f"),
        _row("Weight load per replica (s):", s["fleet_load_s"], ".2f"),
    ]
    for g in s.get("fleet_by_group") or ():  # more than one group autoscaled
        label = f"Group {g['group']} replicas (mean / peak):"
        lines.append(f"{label:<40} {g['replicas_mean']:.2f} / {g['replicas_peak']:.0f}")
    if s.get("slo_attainment") is not None:
        lines.append(_row("SLO attainment (%):", 100 * _num(s["slo_attainment"]), ".2f"))
    return lines


def _power_section(s: Mapping[str, Any]) -> list[str]:
    """A power-budgeted run's figures (runs.power_budget.power_summary), where the summary has
    them."""
    if "power_budget_w" not in s:
        return []
    lines = [
        "{s:{c}^{n}}".format(s="Power budget", n=WIDTH, c="-"),
        _row("Budget (W):", s["power_budget_w"], ".0f"),
    ]
    if s.get("power_cap_w") is not None:
        lines.append(_row("Cap of a capped GPU (W):", s["power_cap_w"], ".0f"))
    lines += [
        _row("Fleet draw, peak sample (W):", s["power_peak_draw_w"], ".0f"),
        _row("Fleet draw, peak window (W):", s["power_peak_window_w"], ".0f"),
        _row("Fleet draw, mean (W):", s["power_mean_draw_w"], ".0f"),
        _row("Windows over budget (%):", 100 * _num(s["power_over_budget_share"]), ".2f"),
        _row("Replica-time capped (%):", 100 * _num(s["power_capped_share"]), ".2f"),
    ]
    if "fleet_gpu_hours" not in s and s.get("slo_attainment") is not None:
        lines.append(_row("SLO attainment (%):", 100 * _num(s["slo_attainment"]), ".2f"))
    return lines


def format_throughput_summary(summary: Mapping[str, float | int | None]) -> str:
    """The lines `vllm bench throughput` prints, then the error bands where the summary has
    them (metrics.bands), or why it has none."""
    output = round(_num(summary["output_tokens_per_second"]) * _num(summary["elapsed_time"]))
    prompt = int(_num(summary["total_num_tokens"])) - output
    lines = [
        f"Throughput: {_num(summary['requests_per_second']):.2f} requests/s, "
        f"{_num(summary['tokens_per_second']):.2f} total tokens/s, "
        f"{_num(summary['output_tokens_per_second']):.2f} output tokens/s",
        f"Total num prompt tokens:  {prompt}",
        f"Total num output tokens:  {output}",
    ]
    units = (
        ("requests_per_second", "requests/s"),
        ("tokens_per_second", "total tokens/s"),
        ("output_tokens_per_second", "output tokens/s"),
        ("elapsed_time", "s elapsed"),
    )
    spans = [f"{band_text(summary, key)} {unit}" for key, unit in units if band_text(summary, key)]
    if spans:
        coverage = float(_num(summary["interval_coverage"]))
        lines.append(f"Error bands at {coverage:.0%}: {', '.join(spans)}")
    lines += lora_lines(summary) + pd_partition_lines(summary)
    return "\n".join(lines + bound_lines(summary) + band_lines(summary))


def lora_lines(summary: Mapping[str, Any]) -> list[str]:
    """The multi-LoRA section's lines (`serving.lora.lora_summary`) where the summary has one:
    adapter loads and their bytes and time, distinct adapters per step."""
    lora = summary.get("lora")
    if not isinstance(lora, Mapping):
        return []
    return [
        f"LoRA adapter loads: {lora['adapter_loads']} ({lora['adapter_loads_from_cpu']} from "
        f"the CPU cache, {lora['adapter_loads_from_disk']} from disk), "
        f"{_num(lora['adapter_load_bytes']) / 2**30:.2f} GiB, {_num(lora['adapter_load_s']):.3f} s",
        f"LoRA adapters per step: {_num(lora['mean_adapters_per_step']):.2f} mean, "
        f"{lora['max_adapters_per_step']} most (max_loras {lora['max_loras']})",
    ]


def pd_partition_lines(summary: Mapping[str, Any]) -> list[str]:
    """The dynamic intra-GPU split's lines (`serving.pd_partition.split_summary`) where the
    summary has them: its choices with both streams busy, how many changed the split, and
    the decode stream's mean SM share."""
    split = summary.get("pd_partition")
    if not isinstance(split, Mapping):
        return []
    return [
        _row("Split decisions (both streams busy):", int(_num(split["split_decisions"]))),
        _row("Split changes:", int(_num(split["split_changes"]))),
        _row("Mean decode SM share:", _num(split["mean_decode_share"]), ".2f"),
    ]


def bound_lines(summary: Mapping[str, Any]) -> list[str]:
    """The hardware-limit bound's line (`costmodel.bound`) where the summary has it: the bound
    in total tokens/s, the resource that sets it and the run's share of it."""
    bound = summary.get("hardware_bound_tok_s")
    if bound is None:
        return []
    share = summary.get("bound_share")
    text = "" if share is None else f", this run reaches {100 * _num(share):.1f}% of it"
    return [
        f"Hardware-limit bound: {_num(bound):.2f} total tokens/s "
        f"({summary.get('hardware_bound_resource')}-bound at datasheet peaks){text}"
    ]


def parse_metric_percentiles(text: str | None) -> tuple[float, ...]:
    """vLLM's --metric-percentiles ("95,99.9") as numbers in [0, 100]; () when None."""
    if text is None:
        return ()
    try:
        values = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise SpecError(
            f"expected comma-separated numbers, got {text!r}", field="metric_percentiles"
        ) from None
    bad = [p for p in values if not 0 <= p <= 100]
    if bad or not values:
        raise SpecError(
            f"percentiles must lie in [0, 100], got {text!r}", field="metric_percentiles"
        )
    return values


def parse_percentile_metrics(text: str | None) -> tuple[str, ...] | None:
    """vLLM's --percentile-metrics ("ttft,tpot,itl") as latency names; None when None."""
    if text is None:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    known = [key for key, _, _ in LATENCY_SECTIONS]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SpecError(
            f"unknown metric(s) {', '.join(unknown) or text!r}; use {','.join(known)}",
            field="percentile_metrics",
        )
    return names


def completed_requests(requests: pd.DataFrame) -> pd.DataFrame:
    """The rows with both a first token and a finish time."""
    return requests[requests["first_token_s"].notna() & requests["finish_s"].notna()]


def max_concurrency(start_s: npt.ArrayLike, end_s: npt.ArrayLike) -> int:
    """Most intervals [start, end) open at once (instantaneous; the summary reports vLLM's
    per-second figure, `per_second_peaks`)."""
    start = np.asarray(start_s, dtype=float)
    end = np.asarray(end_s, dtype=float)
    if start.size == 0:
        return 0
    times = np.concatenate([start, end])
    deltas = np.concatenate([np.ones(start.size), -np.ones(end.size)])
    # an end at time t closes before a start at t opens: half-open intervals
    order = np.lexsort((deltas, times))
    return int(np.cumsum(deltas[order]).max())


SPARSE_SPAN = 1_000_000  # seconds (11.6 days): beyond, per_second_peaks counts only busy ones


def per_second_peaks(
    start_s: npt.ArrayLike,
    end_s: npt.ArrayLike,
    token_s: npt.ArrayLike = (),
    token_count: npt.ArrayLike = (),
) -> tuple[float, int]:
    """vLLM bench serve's peaks over one-second buckets from the first request's start: the
    most output tokens stamped in one bucket (`max_output_tokens_per_s`; tokens at `token_s`,
    `token_count` at each) and the most requests active in any part of one bucket, each from
    its start's bucket to its end's, both counted (`max_concurrent_requests`)."""
    start = np.asarray(start_s, dtype=float)
    end = np.asarray(end_s, dtype=float)
    if start.size == 0:
        return 0.0, 0
    origin = float(start.min())
    span = int(np.ceil(float(end.max()) - origin)) + 1
    first = (start - origin).astype(np.int64)
    last = np.minimum((end - origin).astype(np.int64), span - 1)
    bucket = np.floor(np.asarray(token_s, dtype=float) - origin).astype(np.int64)
    weight = np.asarray(token_count, dtype=float)
    inside = (bucket >= 0) & (bucket < span)
    # One slot per second of the run, unless the run is far longer than it has events (an
    # arrival days after the rest): then only the seconds where something starts or ends.
    keys = np.concatenate([first, last + 1])
    if span > SPARSE_SPAN and span > 4 * (keys.size + bucket.size):
        seconds, slot = np.unique(keys, return_inverse=True)
        running = np.cumsum(np.bincount(slot, weights=np.repeat([1.0, -1.0], first.size)))
        concurrent = int(running[seconds < span].max())
        _, token_slot = np.unique(bucket[inside], return_inverse=True)
        tokens = np.bincount(token_slot, weights=weight[inside], minlength=1)
        return float(tokens.max()), concurrent
    active = np.zeros(span + 1)
    np.add.at(active, first, 1.0)
    np.add.at(active, last + 1, -1.0)
    concurrent = int(np.cumsum(active)[:span].max())
    tokens = np.bincount(bucket[inside], weights=weight[inside], minlength=span)
    return float(tokens.max()), concurrent


def slo_attainment(requests: pd.DataFrame, slos: Mapping[str, float]) -> float:
    """The share of all requests (failed ones count as missing) that completed meeting every
    SLO (ms, keyed as `goodput`); 0 without a request."""
    if not len(requests):
        return 0.0
    return _good_count(completed_requests(requests), _check_slos(slos)) / len(requests)


def _good_count(done: pd.DataFrame, slos: Mapping[str, float]) -> int:
    """Completed requests meeting every SLO (ms); TPOT is 0 for one-token outputs, as vLLM."""
    decode_tokens = done["output_tokens"] - 1
    per_request = {
        "ttft": done["first_token_s"] - done["arrival_s"],
        "e2el": done["finish_s"] - done["arrival_s"],
        "tpot": ((done["finish_s"] - done["first_token_s"]) / decode_tokens.clip(lower=1)).where(
            decode_tokens > 0, 0.0
        ),
    }
    good = np.ones(len(done), dtype=bool)
    for name, slo_ms in slos.items():
        good &= (per_request[name] <= slo_ms / 1000.0).to_numpy()
    return int(good.sum())


def _itl_sample(itl_s: npt.ArrayLike, itl_weight: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    values = np.asarray(itl_s, dtype=float).ravel()
    weights = np.asarray(itl_weight, dtype=float).ravel()
    if values.shape != weights.shape:
        raise ValueError(f"itl_s and itl_weight differ in length: {values.size} != {weights.size}")
    if np.any(weights < 0):
        raise ValueError("itl_weight must be non-negative")
    return values, weights


def _duration(
    requests: pd.DataFrame, duration_s: float | None, start_s: float | None = None
) -> float:
    if duration_s is not None:
        if not duration_s >= 0 or math.isinf(duration_s):
            raise SpecError(
                f"must be finite and non-negative, got {duration_s}", field="duration_s"
            )
        return float(duration_s)
    finish = completed_requests(requests)["finish_s"]
    if finish.empty:
        return 0.0
    first = requests["arrival_s"].min()
    if start_s is not None and not (math.isfinite(start_s) and start_s <= first):
        raise SpecError(
            f"must be finite and no later than the first arrival ({first}), got {start_s}",
            field="start_s",
        )
    return float(finish.max() - (first if start_s is None else start_s))


def _rate(count: float, duration: float) -> float:
    return count / duration if duration > 0 else 0.0


def _check_slos(slos: Mapping[str, float]) -> dict[str, float]:
    for name, value in slos.items():
        if name not in SLO_METRICS:
            raise SpecError(
                f"unknown SLO {name!r}; use one of {', '.join(SLO_METRICS)}", field="goodput"
            )
        if not value >= 0 or math.isinf(value):
            raise SpecError(
                f"{name}: SLO must be a finite, non-negative number of ms, got {value}",
                field="goodput",
            )
    return {name: float(value) for name, value in slos.items()}


def _check_percentiles(percentiles: Sequence[float]) -> tuple[float, ...]:
    pcts = tuple(float(p) for p in percentiles)
    bad = [p for p in pcts if not 0 <= p <= 100]
    if bad:
        raise SpecError(f"percentiles must lie in [0, 100], got {bad}", field="percentiles")
    return pcts


def _require_columns(requests: pd.DataFrame) -> None:
    missing = [c for c in REQUEST_COLUMNS if c not in requests.columns]
    if missing:
        raise ValueError(f"requests table lacks columns {missing}")


def _tier_section(summary: Mapping[str, float | int | None]) -> list[str]:
    """The KV tiers' lines, when the run had tiers."""
    if "kv_offload_load_s" not in summary:
        return []
    lines = ["{s:{c}^{n}}".format(s="KV offload tiers", n=WIDTH, c="-")]
    for tier, name in (("gpu", "GPU"), ("cpu", "CPU"), ("nvme", "NVMe")):
        if f"prefix_cache_hit_tokens_{tier}" in summary:
            hits = summary[f"prefix_cache_hit_tokens_{tier}"]
            lines.append(_row(f"Prefix tokens found in {name}:", hits))
    for tier, name in (("cpu", "CPU"), ("nvme", "NVMe")):
        if f"kv_offload_{tier}_bytes_written" in summary:
            written = _num(summary[f"kv_offload_{tier}_bytes_written"]) / 1e9
            read = _num(summary[f"kv_offload_{tier}_bytes_read"]) / 1e9
            peak = 100 * _num(summary[f"kv_offload_{tier}_peak_fraction"])
            lines.append(_row(f"{name} tier written (GB):", written, ".2f"))
            lines.append(_row(f"{name} tier read (GB):", read, ".2f"))
            lines.append(_row(f"{name} tier peak occupancy (%):", peak, ".2f"))
    lines.append(_row("KV load time (s):", summary["kv_offload_load_s"], ".2f"))
    return lines


def _latency_section(
    summary: Mapping[str, float | int | None], key: str, label: str, heading: str
) -> list[str]:
    if f"mean_{key}_ms" not in summary:
        return []
    lines = [
        "{s:{c}^{n}}".format(s=heading, n=WIDTH, c="-"),
        _banded(f"Mean {label} (ms):", summary, f"mean_{key}_ms"),
        _banded(f"Median {label} (ms):", summary, f"median_{key}_ms"),
    ]
    suffix = f"_{key}_ms"
    for name in summary:
        word = name[1 : -len(suffix)]
        if name.startswith("p") and name.endswith(suffix) and _is_number(word):
            lines.append(_banded(f"P{word} {label} (ms):", summary, name))
    return lines


def _banded(label: str, summary: Mapping[str, Any], key: str) -> str:
    """`_row` of a .2f figure, then its error band where the summary has one."""
    return _row(label, summary[key], ".2f") + band_suffix(summary, key)


def _row(label: str, value: float | int | None, spec: str = "") -> str:
    """vLLM's `{:<40} {:<10}` / `{:<40} {:<10.2f}` row, padding included."""
    return "{:<40} {:<10{}}".format(label, _num(value), spec)


def _num(value: float | int | None) -> float | int:
    if value is None:
        raise ValueError("summary value is None where a number is printed")
    return value


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return percentile_word(float(word)) == word
