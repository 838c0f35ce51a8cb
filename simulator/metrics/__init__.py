"""Metrics: the simulation's rows (recorder) and what vLLM's benchmarks report (summary)."""

from simulator.metrics.stats import describe_ms, percentile_word, weighted_percentile
from simulator.metrics.summary import (
    completed_requests,
    format_serve_summary,
    format_throughput_summary,
    max_concurrency,
    parse_goodput,
    serve_summary,
    throughput_summary,
)

__all__ = [
    "completed_requests",
    "describe_ms",
    "format_serve_summary",
    "format_throughput_summary",
    "max_concurrency",
    "parse_goodput",
    "percentile_word",
    "serve_summary",
    "throughput_summary",
    "weighted_percentile",
]
