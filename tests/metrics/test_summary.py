"""vLLM's `bench serve` / `bench throughput` metrics, pinned on a 3-request case computed by hand.

The three requests (times in s; tokens):
    id arrival sched first_tok finish prompt output preempt cached
    0  0.0     0.0   0.1       1.1    100    11     0       0
    1  0.5     0.6   0.8       2.3    200    6      1       50
    2  1.0     1.5   2.0       2.0    300    1      0       100
Per request (ms):
    TTFT = first_tok - arrival      : 100, 300, 1000
    E2EL = finish - arrival         : 1100, 1800, 1000
    TPOT = (E2EL - TTFT) / (out - 1): 1000/10 = 100, 1500/5 = 300, excluded (one output token)
    queueing = sched - arrival      : 0, 100, 500
ITL sample: 0.1 s x2, 0.2 s x1, 0.3 s x1 -> expanded [100, 100, 200, 300] ms.
Duration = last finish - first arrival = 2.3 s; 600 input and 18 output tokens.
Percentiles are numpy's linear ones: rank (n - 1) q / 100, interpolated.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import SpecError
from simulator.metrics import (
    format_serve_summary,
    format_throughput_summary,
    parse_goodput,
    serve_summary,
    throughput_summary,
    weighted_percentile,
)
from simulator.metrics.summary import max_concurrency, per_second_peaks

NAN = math.nan
COLUMNS = (
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
)
HAND_ROWS = [
    # arrival, sched, first_tok, finish, prompt, output, preempt, cached
    (0.0, 0.0, 0.1, 1.1, 100, 11, 0, 0),
    (0.5, 0.6, 0.8, 2.3, 200, 6, 1, 50),
    (1.0, 1.5, 2.0, 2.0, 300, 1, 0, 100),
]
ITL_S = np.array([0.1, 0.2, 0.3])
ITL_WEIGHT = np.array([2, 1, 1])
DURATION = 2.3

# the keys INTERFACE.md fixes for `bench serve --output-json`
CONTRACT_SERVE_KEYS = [
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
] + [
    f"{stat}_{m}_ms"
    for m in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p90", "p99")
]
CONTRACT_THROUGHPUT_KEYS = [
    "elapsed_time",
    "num_requests",
    "total_num_tokens",
    "requests_per_second",
    "tokens_per_second",
    "output_tokens_per_second",
]


Row = tuple[float, float, float, float, int, int, int, int]


def make_requests(rows: list[Row]) -> pd.DataFrame:
    """The simulator's request table from (arrival, sched, first_tok, finish, prompt, output,
    preemptions, cached) tuples; replica 0."""
    records = [(i, 0, *row) for i, row in enumerate(rows)]
    df = pd.DataFrame.from_records(records, columns=list(COLUMNS))
    for col in ("request_id", "replica", "prompt_tokens", "output_tokens", "preemptions"):
        df[col] = df[col].astype(np.int64)
    df["cached_tokens"] = df["cached_tokens"].astype(np.int64)
    return df


def hand_summary(**kwargs: object) -> dict[str, float | int | None]:
    return serve_summary(make_requests(HAND_ROWS), itl_s=ITL_S, itl_weight=ITL_WEIGHT, **kwargs)


def test_hand_computed_serve_summary() -> None:
    s = hand_summary(prefix_caching=True)
    expected = {
        "duration": 2.3,
        "completed": 3,
        "failed": 0,
        "total_input_tokens": 600,
        "total_output_tokens": 18,
        "request_throughput": 3 / 2.3,
        "output_throughput": 18 / 2.3,
        "total_token_throughput": 618 / 2.3,
        # intervals [0, 1.1), [0.5, 2.3), [1.0, 2.0): all three open at t = 1.0
        "max_concurrent_requests": 3,
        # TTFT 100, 300, 1000: mean 466.67; deviations -366.67, -166.67, 533.33 -> std
        # sqrt(446666.67 / 3); p90 rank 1.8 -> 300 + 0.8 * 700; p99 rank 1.98 -> 300 + 0.98 * 700
        "mean_ttft_ms": 1400 / 3,
        "median_ttft_ms": 300.0,
        "std_ttft_ms": math.sqrt(446666.6666666667 / 3),
        "p50_ttft_ms": 300.0,
        "p90_ttft_ms": 860.0,
        "p99_ttft_ms": 986.0,
        # TPOT 100, 300: p90 rank 0.9 -> 100 + 0.9 * 200; p99 -> 100 + 0.99 * 200
        "mean_tpot_ms": 200.0,
        "median_tpot_ms": 200.0,
        "std_tpot_ms": 100.0,
        "p50_tpot_ms": 200.0,
        "p90_tpot_ms": 280.0,
        "p99_tpot_ms": 298.0,
        # ITL [100, 100, 200, 300]: mean 175; deviations -75, -75, 25, 125 -> var 27500 / 4;
        # median rank 1.5 -> 150; p90 rank 2.7 -> 200 + 0.7 * 100; p99 rank 2.97 -> 297
        "mean_itl_ms": 175.0,
        "median_itl_ms": 150.0,
        "std_itl_ms": math.sqrt(27500 / 4),
        "p50_itl_ms": 150.0,
        "p90_itl_ms": 270.0,
        "p99_itl_ms": 297.0,
        # E2EL 1000, 1100, 1800 (sorted): mean 1300; deviations -300, -200, 500 -> var 380000 / 3
        # p90 rank 1.8 -> 1100 + 0.8 * 700; p99 -> 1100 + 0.98 * 700
        "mean_e2el_ms": 1300.0,
        "median_e2el_ms": 1100.0,
        "std_e2el_ms": math.sqrt(380000 / 3),
        "p50_e2el_ms": 1100.0,
        "p90_e2el_ms": 1660.0,
        "p99_e2el_ms": 1786.0,
        # queueing 0, 100, 500: p99 rank 1.98 -> 100 + 0.98 * 400
        "mean_queueing_ms": 200.0,
        "median_queueing_ms": 100.0,
        "p99_queueing_ms": 492.0,
        "preemptions": 1,
        "prefix_cache_hit_rate": 150 / 600,
        "prefix_cache_saved_tokens": 150,
    }
    assert s["request_goodput"] is None
    for key, value in expected.items():
        assert s[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key
    assert set(s) == set(expected) | {"request_goodput"}


def test_per_second_peaks_count_as_vllm_buckets_them() -> None:
    # first tokens at 0.1, 0.8, 2.0 (buckets 0, 0, 2) and later ones: 2 at 0.5, 3 at 1.2, 1 at
    # 1.4, 4 at 2.2 -> buckets 4, 4, 5 tokens; requests [0, 1.1], [0.5, 2.3], [1.0, 2.0] are
    # active in buckets 0-1, 0-2, 1-2 -> 2, 3, 2
    later = (np.array([0.5, 1.2, 1.4, 2.2]), np.array([2, 3, 1, 4]))
    s = hand_summary(later_tokens=later)
    assert s["max_output_tokens_per_s"] == 5.0 and s["max_concurrent_requests"] == 3
    assert "max_output_tokens_per_s" not in hand_summary()  # no token times: no peak
    # two requests that never overlap but share a second count twice, as vLLM's buckets do
    assert per_second_peaks([0.1, 0.6], [0.4, 0.9]) == (0.0, 2)
    assert max_concurrency([0.1, 0.6], [0.4, 0.9]) == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 50), st.floats(0, 5)), min_size=1, max_size=30),
    st.lists(st.tuples(st.integers(0, 29), st.floats(0, 1), st.integers(1, 9)), max_size=30),
)
def test_per_second_peaks_of_a_long_run_count_only_busy_seconds(
    requests: list[tuple[float, float]], tokens: list[tuple[int, float, int]]
) -> None:
    # the same requests and their tokens, once alone and once with a request 30 years later
    # (one slot a second would need 7 GiB): the peaks are the larger of the two parts'
    start = np.array([a for a, _ in requests])
    end = start + np.array([d for _, d in requests])
    stamps = [(i % len(requests), f, n) for i, f, n in tokens]
    token_s = np.array([start[i] + f * (end[i] - start[i]) for i, f, _ in stamps], dtype=float)
    token_count = np.array([n for _, _, n in stamps], dtype=float)
    near = per_second_peaks(start, end, token_s, token_count)
    far = 1e9 + start.min()
    both = per_second_peaks(
        np.append(start, far),
        np.append(end, far + 1),
        np.append(token_s, far),
        np.append(token_count, 2.0),
    )
    assert both == (max(near[0], 2.0), max(near[1], 1))


def test_key_order_follows_vllm_then_extras() -> None:
    keys = list(hand_summary())
    assert keys[:11] == [
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "max_concurrent_requests",
        "mean_ttft_ms",
    ]
    assert keys[-4:] == [
        "mean_queueing_ms",
        "median_queueing_ms",
        "p99_queueing_ms",
        "preemptions",
    ]
    with_cache = list(hand_summary(prefix_caching=True))
    assert with_cache == [*keys, "prefix_cache_hit_rate", "prefix_cache_saved_tokens"]


def test_contract_keys_present_and_json_plain() -> None:
    s = hand_summary(goodput={"ttft": 500.0})
    assert all(key in s for key in CONTRACT_SERVE_KEYS)
    assert all(type(v) in (int, float) for v in s.values())
    json.dumps(s, allow_nan=False)
    t = throughput_summary(make_requests(HAND_ROWS))
    assert list(t) == CONTRACT_THROUGHPUT_KEYS
    json.dumps(t, allow_nan=False)


def test_throughput_summary_by_hand() -> None:
    t = throughput_summary(make_requests(HAND_ROWS))
    assert t["elapsed_time"] == pytest.approx(2.3)
    assert t["num_requests"] == 3
    assert t["total_num_tokens"] == 618  # 600 prompt + 18 output
    assert t["requests_per_second"] == pytest.approx(3 / 2.3)
    assert t["tokens_per_second"] == pytest.approx(618 / 2.3)
    assert t["output_tokens_per_second"] == pytest.approx(18 / 2.3)
    assert throughput_summary(make_requests(HAND_ROWS), duration_s=6.0)["tokens_per_second"] == 103


def test_tpot_excludes_one_token_outputs() -> None:
    # only request 2 has more than one output token: TPOT (900 - 100) / 4 = 200 ms
    rows = [
        (0.0, 0.0, 0.1, 0.1, 10, 1, 0, 0),
        (0.0, 0.0, 0.1, 0.9, 10, 5, 0, 0),
    ]
    s = serve_summary(make_requests(rows), itl_s=[0.2], itl_weight=[4])
    for stat in ("mean", "median", "p90", "p99"):
        assert s[f"{stat}_tpot_ms"] == pytest.approx(200.0)
    assert s["std_tpot_ms"] == 0.0
    # all outputs one token long: no TPOT sample, reported as 0 like vLLM's `np.mean(tpots or 0)`
    s = serve_summary(make_requests(rows[:1]), itl_s=[], itl_weight=[])
    assert s["mean_tpot_ms"] == 0.0 and s["p99_tpot_ms"] == 0.0 and s["mean_itl_ms"] == 0.0


@pytest.mark.parametrize(
    ("slos", "good"),
    [
        # TTFT 100/300/1000, TPOT 100/300/0 (one token counts as 0), E2EL 1100/1800/1000 ms
        ({"ttft": 500.0, "tpot": 200.0, "e2el": 2000.0}, 1),  # 1 fails tpot, 2 fails ttft
        ({"tpot": 150.0}, 2),  # request 2's single token meets any TPOT SLO
        ({"ttft": 1000.0}, 3),  # request 2's TTFT is exactly 1.0 s: met (vLLM: slo >= metric)
        ({"e2el": 1000.0}, 1),
        ({"ttft": 1000.0, "e2el": 1799.0}, 2),
        ({"ttft": 50.0}, 0),
    ],
)
def test_goodput_counts_requests_meeting_all_slos(slos: dict[str, float], good: int) -> None:
    s = hand_summary(goodput=slos)
    assert s["request_goodput"] == pytest.approx(good / DURATION)


def test_no_slos_means_no_goodput() -> None:
    assert hand_summary(goodput=None)["request_goodput"] is None
    assert hand_summary(goodput={})["request_goodput"] is None


def test_unknown_slo_is_a_spec_error() -> None:
    with pytest.raises(SpecError) as err:
        hand_summary(goodput={"latency": 1.0})
    assert err.value.field == "goodput"


def test_unfinished_requests_count_as_failed_only() -> None:
    rows = [
        *HAND_ROWS,
        (2.0, 2.1, NAN, NAN, 400, 0, 2, 0),  # never produced a token
        (0.2, 0.3, 0.4, NAN, 500, 3, 0, 0),  # streaming when the run was cut
    ]
    s = serve_summary(make_requests(rows), itl_s=ITL_S, itl_weight=ITL_WEIGHT)
    base = hand_summary()
    assert s["completed"] == 3 and s["failed"] == 2
    for key in ("duration", "total_input_tokens", "total_output_tokens", "mean_ttft_ms"):
        assert s[key] == base[key], key
    assert s["preemptions"] == 3  # preemptions of every request, finished or not
    t = throughput_summary(make_requests(rows))
    assert t["num_requests"] == 3 and t["total_num_tokens"] == 618


def test_nothing_completed_reports_zeros() -> None:
    s = serve_summary(
        make_requests([(0.0, NAN, NAN, NAN, 10, 0, 0, 0)]),
        itl_s=[],
        itl_weight=[],
        goodput={"ttft": 1.0},
    )
    assert s["completed"] == 0 and s["failed"] == 1 and s["duration"] == 0.0
    assert s["request_throughput"] == 0.0 and s["request_goodput"] == 0.0
    assert s["p99_e2el_ms"] == 0.0 and s["max_concurrent_requests"] == 0
    json.dumps(s, allow_nan=False)


def test_duration_override_and_offset_invariance() -> None:
    s = hand_summary(duration_s=10.0)
    assert s["duration"] == 10.0 and s["request_throughput"] == pytest.approx(0.3)
    shifted = [(a + 100, b + 100, c + 100, d + 100, *rest) for a, b, c, d, *rest in HAND_ROWS]
    s2 = serve_summary(make_requests(shifted), itl_s=ITL_S, itl_weight=ITL_WEIGHT)
    assert s2["duration"] == pytest.approx(2.3)
    assert s2["mean_e2el_ms"] == pytest.approx(1300.0)


def test_percentile_keys_use_vllm_names() -> None:
    s = hand_summary(percentiles=(25, 99.9))
    assert "p25_ttft_ms" in s and "p99.9_itl_ms" in s and "p99_ttft_ms" not in s
    # TTFT rank 2 * 0.999 = 1.998 -> 300 + 0.998 * 700
    assert s["p99.9_ttft_ms"] == pytest.approx(998.6)
    text = format_serve_summary(s)
    assert "P99.9 TTFT (ms):" in text and "P25 E2EL (ms):" in text
    with pytest.raises(SpecError):
        hand_summary(percentiles=(101,))


def test_format_serve_summary_mirrors_vllm() -> None:
    s = hand_summary()
    text = format_serve_summary(s)
    lines = text.splitlines()
    assert lines[0] == "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")
    assert lines[-1] == "=" * 50
    for label in (
        "Successful requests:",
        "Benchmark duration (s):",
        "Total input tokens:",
        "Total generated tokens:",
        "Request throughput (req/s):",
        "Output token throughput (tok/s):",
        "Total Token throughput (tok/s):",
    ):
        assert any(line.startswith(label) for line in lines), label
    for heading in (
        "Time to First Token",
        "Time per Output Token (excl. 1st token)",
        "Inter-token Latency",
        "End-to-end Latency",
    ):
        assert "{s:{c}^{n}}".format(s=heading, n=50, c="-") in lines, heading
    assert "{:<40} {:<10}".format("Successful requests:", 3) in lines
    assert "{:<40} {:<10.2f}".format("Benchmark duration (s):", 2.3) in lines
    assert "{:<40} {:<10.2f}".format("Mean TTFT (ms):", 1400 / 3) in lines
    assert "{:<40} {:<10.2f}".format("P99 ITL (ms):", 297.0) in lines
    assert "Request goodput" not in text
    with_slo = format_serve_summary(hand_summary(goodput={"ttft": 500.0}))
    assert "{:<40} {:<10.2f}".format("Request goodput (req/s):", 2 / 2.3) in with_slo.splitlines()


def test_format_throughput_summary_mirrors_vllm() -> None:
    text = format_throughput_summary(throughput_summary(make_requests(HAND_ROWS)))
    assert text.splitlines() == [
        "Throughput: 1.30 requests/s, 268.70 total tokens/s, 7.83 output tokens/s",
        "Total num prompt tokens:  600",
        "Total num output tokens:  18",
    ]


def test_parse_goodput() -> None:
    assert parse_goodput(["ttft:200", "tpot:50", "e2el:1000"]) == {
        "ttft": 200.0,
        "tpot": 50.0,
        "e2el": 1000.0,
    }
    assert parse_goodput([]) == {}
    assert parse_goodput(["ttft:1", "ttft:2"]) == {"ttft": 2.0}


@pytest.mark.parametrize(
    "item",
    ["ttft", "ttft:", "ttft:abc", "ttft:1:2", "latency:10", "ttft:-1", "tpot:inf", "e2el:nan"],
)
def test_parse_goodput_rejects(item: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_goodput(["tpot:50", item])
    assert err.value.field == "goodput"
    assert "goodput" in str(err.value)


def test_weighted_percentile_small_case() -> None:
    # expanded [1, 1, 1, 5]: median rank 1.5 -> 1; p100 -> 5; zero weight drops 9
    assert weighted_percentile([5, 1, 9], [1, 3, 0], 50) == 1.0
    assert weighted_percentile([5, 1, 9], [1, 3, 0], 100) == 5.0
    assert weighted_percentile([5, 1, 9], [1, 3, 0], 90, method="inverted_cdf") == 5.0
    np.testing.assert_allclose(weighted_percentile([5, 1], [1, 3], [0, 50, 100]), [1, 1, 5])
    with pytest.raises(ValueError):
        weighted_percentile([1.0], [0], 50)
    with pytest.raises(ValueError):
        weighted_percentile([1.0], [-1], 50)


samples = st.lists(
    st.tuples(
        st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_subnormal=False),
        st.integers(min_value=0, max_value=6),
    ),
    min_size=1,
    max_size=30,
).filter(lambda pairs: any(w > 0 for _, w in pairs))


@settings(max_examples=300, deadline=None)
@given(
    pairs=samples,
    q=st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), min_size=1, max_size=5),
)
def test_weighted_percentile_matches_numpy_on_expanded_sample(
    pairs: list[tuple[float, int]], q: list[float]
) -> None:
    values = np.array([v for v, _ in pairs])
    weights = np.array([w for _, w in pairs])
    expanded = np.repeat(values, weights)
    for method in ("linear", "inverted_cdf"):
        got = weighted_percentile(values, weights, q, method=method)
        want = np.percentile(expanded, q, method=method)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-6, err_msg=method)


def test_a_start_after_the_first_arrival_is_refused() -> None:
    # it gave a negative duration (a start 1e6 s after requests of 0-2.3 s)
    with pytest.raises(SpecError, match="no later than the first arrival") as err:
        hand_summary(start_s=1e6)
    assert err.value.field == "start_s"
    with pytest.raises(SpecError, match="finite"):
        hand_summary(start_s=NAN)
    assert hand_summary(start_s=0.0)["duration"] == DURATION
