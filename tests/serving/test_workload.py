"""The workload layer: vLLM-compatible lengths and arrivals, trace replay, and clean errors."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats

from simulator.errors import SpecError
from simulator.specs.workload import WorkloadSpec
from simulator.workload.datasets import (
    SHAREGPT_PROMPT_LOGNORMAL,
    SHAREGPT_PROMPTS_FILE,
    fit_sharegpt_prompts,
)
from simulator.workload.requests import RequestTable, generate_requests


def make_spec(dataset: dict[str, Any] | None = None, **fields: Any) -> WorkloadSpec:
    data = {"dataset": dataset or {"name": "random"}, "num_prompts": 1000, **fields}
    return WorkloadSpec.model_validate(data)


def make_requests(spec: WorkloadSpec, seed: int = 0) -> RequestTable:
    return generate_requests(spec, rng=np.random.default_rng(seed))


def gaps_cv(table: RequestTable) -> float:
    gaps = np.diff(table.arrival_s)
    return float(gaps.std() / gaps.mean())


# -- determinism and the table ------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec",
    [
        make_spec({"name": "random", "range_ratio": 0.5}, request_rate=5.0, burstiness=0.5),
        make_spec({"name": "sharegpt"}, request_rate=2.0),
        make_spec({"name": "azure-conv"}, num_prompts=25_000, request_rate=3.0),
    ],
    ids=["random", "sharegpt", "azure-conv-oversampled"],
)
def test_same_seed_same_table(spec: WorkloadSpec) -> None:
    a, b, c = make_requests(spec, 7), make_requests(spec, 7), make_requests(spec, 8)
    for name in ("arrival_s", "prompt_len", "output_len"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.arrival_s, c.arrival_s)


def test_table_shape_dtypes_and_frame() -> None:
    table = make_requests(make_spec(request_rate=4.0))
    assert len(table) == 1000
    assert table.arrival_s.dtype == np.float64 and table.prompt_len.dtype == np.int64
    assert np.all(np.diff(table.arrival_s) >= 0) and table.arrival_s[0] >= 0
    frame = table.to_frame()
    assert list(frame.columns) == [
        "arrival_s",
        "prompt_len",
        "output_len",
        "priority",
        "session_id",
        "prefix_id",
        "prefix_len",
        "follows",
        "think_s",
        "adapter",
    ]
    assert not table.shares_content and (frame["follows"] == -1).all()
    assert len(frame) == 1000
    with pytest.raises(ValueError):
        table.prompt_len[0] = 5  # read-only


# -- arrivals -----------------------------------------------------------------------------------
def test_poisson_mean_gap_and_cv() -> None:
    table = make_requests(make_spec(num_prompts=20_000, request_rate=10.0))
    assert np.mean(np.diff(table.arrival_s)) == pytest.approx(0.1, rel=0.02)
    # vLLM rescales so the last request arrives at num_prompts / rate.
    assert table.arrival_s[-1] == pytest.approx(20_000 / 10.0)
    assert gaps_cv(table) == pytest.approx(1.0, abs=0.05)  # exponential gaps


def test_burstiness_sets_the_coefficient_of_variation() -> None:
    cvs = {
        k: gaps_cv(make_requests(make_spec(num_prompts=20_000, request_rate=10.0, burstiness=k)))
        for k in (0.25, 1.0, 4.0)
    }
    assert cvs[0.25] > cvs[1.0] > cvs[4.0]
    for k, cv in cvs.items():  # gamma(shape k): CV = 1/sqrt(k)
        assert cv == pytest.approx(1 / math.sqrt(k), rel=0.08)


def test_infinite_rate_puts_everything_at_zero() -> None:
    table = make_requests(make_spec(burstiness=0.3))
    assert np.all(table.arrival_s == 0.0)


def test_constant_arrivals_are_evenly_spaced() -> None:
    table = make_requests(make_spec(num_prompts=50, request_rate=4.0, arrival="constant"))
    np.testing.assert_allclose(table.arrival_s, 0.25 * np.arange(1, 51))
    infinite_burstiness = make_requests(
        make_spec(num_prompts=50, request_rate=4.0, burstiness=math.inf)
    )
    np.testing.assert_allclose(infinite_burstiness.arrival_s, table.arrival_s)


@pytest.mark.parametrize("strategy", ["linear", "exponential"])
def test_ramp_up_gives_each_gap_its_requests_rate(strategy: str) -> None:
    """vLLM's ramp-up: request i of n waits a gap at start + (end - start) i/(n-1) requests/s
    (linear) or start (end/start)^(i/(n-1)) (exponential), not rescaled afterwards."""
    ramp = {"strategy": strategy, "start_rps": 2.0, "end_rps": 32.0}
    constant = make_requests(make_spec(num_prompts=5, arrival="constant", ramp_up=ramp))
    i = np.arange(5) / 4
    rates = 2 + 30 * i if strategy == "linear" else 2 * 16**i
    np.testing.assert_allclose(constant.arrival_s, np.cumsum(1 / rates))
    n = 40_000
    table = make_requests(make_spec(num_prompts=n, ramp_up=ramp))
    gaps = np.diff(table.arrival_s)  # gap k is request k + 1's
    i = np.arange(1, n) / (n - 1)
    rates = 2 + 30 * i if strategy == "linear" else 2 * 16**i
    for window in (slice(0, 4000), slice(n - 4001, n - 1)):  # Poisson: mean gap = mean 1/rate
        assert gaps[window].mean() == pytest.approx((1 / rates[window]).mean(), rel=0.05)
    normalised = gaps / (1 / rates)  # exponential with mean 1 whatever the rate
    assert normalised.std() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"ramp_up": {"strategy": "linear", "start_rps": 5, "end_rps": 2}}, "less than end"),
        ({"ramp_up": {"strategy": "linear", "start_rps": 0, "end_rps": 2}}, "greater than 0"),
        (
            {"request_rate": 4.0, "ramp_up": {"strategy": "linear", "start_rps": 1, "end_rps": 2}},
            "do not specify --request-rate",
        ),
    ],
)
def test_bad_ramp_ups_are_refused(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        make_spec(**fields)


# -- random dataset -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("input_len", "output_len", "ratio", "prompt_bounds", "output_bounds"),
    [
        # [floor(L(1-r)), ceil(L(1+r))] as in vLLM's RandomDataset: 101*0.67=67.67, 101*1.33=134.33
        (101, 10, 0.33, (67, 135), (6, 14)),
        (100, 10, 0.25, (75, 125), (7, 13)),
        (1024, 128, 0.0, (1024, 1024), (128, 128)),
        (10, 1, 0.5, (5, 15), (1, 2)),  # output's lower bound is raised from 0 to 1
    ],
)
def test_random_lengths_hit_vllm_bounds_exactly(
    input_len: int,
    output_len: int,
    ratio: float,
    prompt_bounds: tuple[int, int],
    output_bounds: tuple[int, int],
) -> None:
    dataset = {
        "name": "random",
        "input_len": input_len,
        "output_len": output_len,
        "range_ratio": ratio,
    }
    table = make_requests(make_spec(dataset, num_prompts=50_000))
    assert (table.prompt_len.min(), table.prompt_len.max()) == prompt_bounds
    assert (table.output_len.min(), table.output_len.max()) == output_bounds


def test_random_draws_match_vllm_stream() -> None:
    # vLLM draws all input lengths, then all output lengths, from default_rng(seed).
    table = make_requests(make_spec({"name": "random", "range_ratio": 0.5}), seed=3)
    rng = np.random.default_rng(3)
    np.testing.assert_array_equal(table.prompt_len, rng.integers(512, 1537, size=1000))
    np.testing.assert_array_equal(table.output_len, rng.integers(64, 193, size=1000))


def test_clamps_apply_to_any_dataset() -> None:
    table = make_requests(make_spec({"name": "sharegpt"}, max_input_len=100, max_output_len=50))
    assert table.prompt_len.max() == 100 and table.output_len.max() == 50


def python_lines(call: Callable[[], object]) -> int:
    """Lines of Python (and calls and returns) that `call` executes: its Python work, which,
    unlike its time, a busy machine does not change. Work done inside numpy or pandas' C code
    counts nothing; a loop over the rows in Python counts each row."""
    lines = 0

    def count(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal lines
        lines += 1
        return count

    sys.settrace(count)
    try:
        call()
    finally:
        sys.settrace(None)
    return lines


def test_a_million_random_requests_are_drawn_without_a_python_loop() -> None:
    def spec(n: int) -> WorkloadSpec:
        return make_spec({"name": "random", "range_ratio": 0.5}, num_prompts=n, request_rate=50.0)

    make_requests(spec(1000))  # lazy imports and caches
    few = python_lines(lambda: make_requests(spec(1000)))
    tables: list[RequestTable] = []
    many = python_lines(lambda: tables.append(make_requests(spec(1_000_000))))
    assert len(tables[0]) == 1_000_000
    assert many <= 1.1 * few  # about 840 lines either way: numpy draws the million


# -- sharegpt -----------------------------------------------------------------------------------
def test_sharegpt_matches_vllm_bench_means_and_filter() -> None:
    # vllm bench serve, ShareGPT_V3, Llama-3.1 tokenizer, 1000 prompts: 215,196 input tokens and
    # about 199k output tokens (vllm-project/vllm PR #15720): the reference lengths it asks for
    table = make_requests(make_spec({"name": "sharegpt"}, num_prompts=20_000, ignore_eos=True))
    assert table.prompt_len.mean() == pytest.approx(215.2, rel=0.10)
    assert table.output_len.mean() == pytest.approx(199.0, rel=0.10)
    assert table.prompt_len.min() >= 4 and table.output_len.min() >= 4
    assert table.prompt_len.max() <= 1024
    assert (table.prompt_len + table.output_len).max() <= 2048


def test_sharegpt_prompt_spread_is_the_one_fitted_to_vllms_lengths() -> None:
    # the bundled first 320 prompt lengths vLLM sends (seed 0, Llama 3 tokenizer) refit to the
    # committed constants, and the model's lengths are not told apart from them (the spread
    # assumed before, sigma 1.2, is: p ~ 1e-16)
    sent = np.loadtxt(SHAREGPT_PROMPTS_FILE, skiprows=1, dtype=np.int64)
    assert len(sent) == 320 and sent.sum() == 65_578
    assert fit_sharegpt_prompts(sent) == SHAREGPT_PROMPT_LOGNORMAL
    table = make_requests(make_spec({"name": "sharegpt"}, num_prompts=20_000))
    assert stats.ks_2samp(sent, table.prompt_len).pvalue > 0.05
    assert abs(np.median(table.prompt_len) - np.median(sent)) < 40  # 77 sent


def test_sharegpt_output_override() -> None:
    spec = make_spec({"name": "sharegpt", "output_len": 2000}, num_prompts=200, ignore_eos=True)
    table = make_requests(spec)
    assert np.all(table.output_len == 2000) and table.prompt_len.max() <= 48


# -- bundled Azure traces -----------------------------------------------------------------------
def test_azure_conv_replay() -> None:
    table = make_requests(WorkloadSpec(dataset={"name": "azure-conv"}, arrival="trace"))
    assert len(table) == 19_366
    assert table.arrival_s[0] == 0.0
    assert 3_300 < table.arrival_s[-1] < 3_600  # one hour of traffic (3,501.7 s)
    assert table.prompt_len.mean() == pytest.approx(1155, rel=0.01)
    assert table.output_len.mean() == pytest.approx(211, rel=0.01)
    fast = make_requests(
        WorkloadSpec(dataset={"name": "azure-conv"}, arrival="trace", time_scale=0.5)
    )
    np.testing.assert_allclose(fast.arrival_s, table.arrival_s * 0.5)
    first = make_requests(
        WorkloadSpec(dataset={"name": "azure-conv"}, num_prompts=10, arrival="trace")
    )
    np.testing.assert_array_equal(first.arrival_s, table.arrival_s[:10])


def test_azure_code_replay() -> None:
    table = make_requests(WorkloadSpec(dataset={"name": "azure-code"}, arrival="trace"))
    assert len(table) == 8_819
    assert table.prompt_len.mean() == pytest.approx(2048, rel=0.01)
    assert table.output_len.mean() == pytest.approx(28, rel=0.01)


def test_azure_lengths_with_generated_arrivals() -> None:
    replay = make_requests(WorkloadSpec(dataset={"name": "azure-conv"}, arrival="trace"))
    spec = make_spec({"name": "azure-conv"}, num_prompts=20_000, request_rate=8.0)
    table = make_requests(spec)
    assert len(table) == 20_000
    # the first rows in trace order, then draws with replacement (vLLM's oversampling)
    np.testing.assert_array_equal(table.prompt_len[:19_366], replay.prompt_len)
    assert table.arrival_s[-1] == pytest.approx(20_000 / 8.0)


def test_bundled_traces_are_parsed_without_a_python_loop() -> None:
    # pandas parses the columns (timestamps too) in C: the 10,547 rows azure-conv has more than
    # azure-code cost no Python (about 15,800 lines each; one line a row would be 10,547 more)
    from simulator.workload import traces

    def lines(name: str) -> tuple[int, int]:
        traces.bundled_trace.cache_clear()
        return python_lines(lambda: traces.bundled_trace(name)), len(traces.bundled_trace(name))

    lines("azure-code")  # lazy imports and caches
    (code, code_rows), (conv, conv_rows) = lines("azure-code"), lines("azure-conv")
    assert conv_rows - code_rows == 10_547
    assert conv - code < (conv_rows - code_rows) / 10


# -- user traces --------------------------------------------------------------------------------
def trace_spec(path: Path, **dataset: Any) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {"dataset": {"name": "trace", "path": str(path), **dataset}, "arrival": "trace"}
    )


COLUMNS = {"timestamp_column": "t", "prompt_column": "in", "output_column": "out"}


def test_user_csv_with_seconds_is_sorted_and_shifted(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("t,in,out\n12.5,100,10\n10.0,200,20\n11.0,300,30\n")
    table = make_requests(trace_spec(path, **COLUMNS))
    np.testing.assert_allclose(table.arrival_s, [0.0, 1.0, 2.5])
    np.testing.assert_array_equal(table.prompt_len, [200, 300, 100])
    np.testing.assert_array_equal(table.output_len, [20, 30, 10])


def test_user_jsonl_with_datetimes(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rows = [
        {"t": "2024-05-01 10:00:00.000", "in": 5, "out": 1},
        {"t": "2024-05-01 10:00:01.500", "in": 7, "out": 0},  # 0 output tokens count as 1
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = make_requests(trace_spec(path, **COLUMNS))
    np.testing.assert_allclose(table.arrival_s, [0.0, 1.5])
    np.testing.assert_array_equal(table.output_len, [1, 1])


def test_user_trace_without_timestamps_uses_generated_arrivals(tmp_path: Path) -> None:
    path = tmp_path / "lengths.data"
    path.write_text("in,out\n100,10\n200,20\n")
    spec = WorkloadSpec.model_validate(
        {
            "dataset": {"name": "trace", "path": str(path), "format": "csv", **COLUMNS},
            "request_rate": 1.0,
            "arrival": "constant",
        }
    )
    table = make_requests(spec)
    np.testing.assert_allclose(table.arrival_s, [1.0, 2.0])
    np.testing.assert_array_equal(table.prompt_len, [100, 200])


@pytest.mark.parametrize(
    ("text", "field", "needle"),
    [
        ("t,input,out\n1,2,3\n", "dataset.prompt_column", "no column 'in'"),
        ("t,in,out\n1,2,3\n", None, None),
        ("t,in,out\n1,abc,3\n", "dataset.prompt_column", "line 2,"),  # the header is line 1
        ("t,in,out\n1,2,3\n2,-5,3\n", "dataset.prompt_column", "line 3, column 'in': -5 is not"),
        ("t,in,out\n1,2,3\n2,,3\n", "dataset.prompt_column", "an empty cell is not"),
        ("t,in,out\nyesterday,2,3\n", "dataset.timestamp_column", "'yesterday'"),
        ("t,in,out\n", "", "no rows"),
    ],
)
def test_bad_user_traces_raise_spec_errors(
    tmp_path: Path, text: str, field: str | None, needle: str | None
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    spec = trace_spec(path, **COLUMNS)
    if field is None:
        assert len(make_requests(spec)) == 1
        return
    with pytest.raises(SpecError) as info:
        make_requests(spec)
    assert info.value.field == field and needle in str(info.value)
    assert info.value.source == str(path)
    assert "\n" not in str(info.value)


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        make_requests(trace_spec(tmp_path / "nope.csv"))
    assert info.value.field == "dataset.path" and "not found" in str(info.value)


def test_replay_longer_than_the_trace() -> None:
    with pytest.raises(SpecError) as info:
        make_requests(
            WorkloadSpec(dataset={"name": "azure-code"}, num_prompts=9_000, arrival="trace")
        )
    assert info.value.field == "num_prompts"


# -- schema -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data",
    [
        {"dataset": {"name": "random"}},  # synthetic needs num_prompts
        {"dataset": {"name": "sharegpt"}},
        {"dataset": {"name": "random"}, "num_prompts": 5, "arrival": "trace"},
        {"dataset": {"name": "random"}, "num_prompts": 5, "request_rate": 0},
        {"dataset": {"name": "random"}, "num_prompts": 5, "request_rate": -1},
        {"dataset": {"name": "random"}, "num_prompts": 5, "burstiness": 0},
        {"dataset": {"name": "random"}, "num_prompts": 5, "time_scale": 0.5},
        {"dataset": {"name": "random"}, "num_prompts": 0},
        {"dataset": {"name": "random", "range_ratio": 1.0}, "num_prompts": 5},
        {"dataset": {"name": "random", "input_len": 1, "range_ratio": 0.5}, "num_prompts": 5},
        {"dataset": {"name": "random", "input_len": 0}, "num_prompts": 5},
        {"dataset": {"name": "random"}, "num_prompts": 5, "max_input_len": 0},
        {"dataset": {"name": "random"}, "num_prompts": 5, "typo": 1},
        {"dataset": {"name": "nope"}, "num_prompts": 5},
        {"dataset": {"name": "azure-conv"}, "arrival": "trace", "request_rate": 2.0},
        {"dataset": {"name": "random"}, "num_prompts": 5, "arrival": "constant", "burstiness": 2},
        {"dataset": {"name": "random"}, "num_prompts": 5, "request_rate": "nan"},
        {"dataset": {"name": "sharegpt", "output_len": 2045}, "num_prompts": 5},
        {"dataset": {"name": "trace", "path": "x.txt"}},
        {
            "dataset": {"name": "trace", "path": "x.csv", "timestamp_column": None},
            "arrival": "trace",
        },
    ],
)
def test_invalid_specs_are_pydantic_errors(data: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        WorkloadSpec.model_validate(data)


def test_defaults_mirror_vllm() -> None:
    spec = make_spec()
    assert spec.request_rate == math.inf and spec.burstiness == 1.0
    assert spec.arrival == "poisson_gamma" and spec.time_scale == 1.0
    assert spec.dataset.model_dump() == {
        "name": "random",
        "input_len": 1024,
        "output_len": 128,
        "range_ratio": 0.0,
    }


def test_malformed_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text('{"t": 1, "in": 2, "out": 3}\n{"t": 2, "in": \n')
    with pytest.raises(SpecError) as info:
        make_requests(trace_spec(path, **COLUMNS))
    assert "line 2" in str(info.value) and info.value.source == str(path)


def test_numeric_timestamp_column_stays_seconds(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"timestamp": 100.0, "in": 2, "out": 3}\n{"timestamp": 160.0, "in": 2, "out": 3}\n'
    )
    spec = trace_spec(path, timestamp_column="timestamp", prompt_column="in", output_column="out")
    np.testing.assert_allclose(make_requests(spec).arrival_s, [0.0, 60.0])


# -- shared prefixes and conversations ----------------------------------------------------------
def fixed_lengths(**fields: Any) -> WorkloadSpec:
    """Random dataset with fixed lengths: 10-token messages, 5-token replies."""
    return make_spec({"name": "random", "input_len": 10, "output_len": 5}, **fields)


def test_a_shared_prefix_goes_before_every_prompt() -> None:
    # vLLM's --random-prefix-len: prefix + input tokens; the other draws do not move
    plain = make_requests(make_spec(request_rate=4.0))
    table = make_requests(make_spec(request_rate=4.0, prefix={"tokens": 100}))
    np.testing.assert_array_equal(table.prompt_len, plain.prompt_len + 100)
    np.testing.assert_array_equal(table.arrival_s, plain.arrival_s)
    assert (table.prefix_id == 0).all() and (table.prefix_len == 100).all()
    assert (table.session_id == -1).all() and not table.has_turns and table.shares_content
    assert not plain.shares_content


def test_prefix_share_and_count() -> None:
    table = make_requests(make_spec(prefix={"tokens": 64, "share": 0.25, "count": 3}))
    carriers = table.prefix_id >= 0
    assert abs(carriers.mean() - 0.25) < 0.05
    assert set(np.unique(table.prefix_id[carriers])) == {0, 1, 2}
    np.testing.assert_array_equal(table.prefix_len, np.where(carriers, 64, 0))
    assert (table.prompt_len[carriers] == 1024 + 64).all()
    assert (table.prompt_len[~carriers] == 1024).all()


def test_session_turns_resend_the_conversation() -> None:
    # 7 requests in conversations of 3 turns: 3 + 3 + 1. Turn k's prompt: earlier messages and
    # replies (15 tokens a turn) + its own message: 10, 25, 40.
    table = make_requests(
        fixed_lengths(num_prompts=7, request_rate=2.0, sessions={"turns": 3, "think_time_s": 1.5})
    )
    np.testing.assert_array_equal(table.prompt_len, [10, 25, 40, 10, 25, 40, 10])
    np.testing.assert_array_equal(table.session_id, [0, 0, 0, 1, 1, 1, 2])
    np.testing.assert_array_equal(table.follows, [-1, 0, 1, -1, 3, 4, -1])
    np.testing.assert_array_equal(table.think_s, [0, 1.5, 1.5, 0, 1.5, 1.5, 0])
    # three conversations arrive (the last at 3 / rate = 1.5 s); later turns carry their start
    starts = table.arrival_s[[0, 3, 6]]
    assert starts[-1] == pytest.approx(1.5)
    np.testing.assert_array_equal(table.arrival_s, np.repeat(starts, [3, 3, 1]))


def test_sessions_with_a_system_prompt_and_exponential_think_times() -> None:
    spec = fixed_lengths(
        num_prompts=4000,
        prefix={"tokens": 100, "share": 0.5},
        sessions={"turns": 4, "think_time_s": 2.0, "think_time": "exponential"},
    )
    table = make_requests(spec)
    per_session = table.prefix_id.reshape(-1, 4)
    assert (per_session == per_session[:, :1]).all()  # a conversation keeps its system prompt
    assert abs((per_session[:, 0] >= 0).mean() - 0.5) < 0.05
    np.testing.assert_array_equal(
        table.prompt_len, table.prefix_len + np.tile([10, 25, 40, 55], 1000)
    )
    later = table.think_s[table.follows >= 0]
    assert later.mean() == pytest.approx(2.0, rel=0.05) and (later > 0).all()
    assert (table.think_s[table.follows < 0] == 0).all()


def test_max_input_len_clamps_whole_prompts_and_their_prefix() -> None:
    table = make_requests(fixed_lengths(num_prompts=3, prefix={"tokens": 30}, max_input_len=20))
    assert (table.prompt_len == 20).all() and (table.prefix_len == 20).all()


def test_trace_session_and_prefix_columns(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(
        "t,in,out,conv,sys,sys_len\n"
        "0,100,10,a,s1,40\n"
        "1,130,10,b,,\n"
        "2,150,10,a,s1,40\n"
        "3,20,5,,s2,50\n"
    )
    spec = trace_spec(
        path, **COLUMNS, session_column="conv", prefix_column="sys", prefix_len_column="sys_len"
    )
    table = make_requests(spec)
    np.testing.assert_array_equal(table.session_id, [0, 1, 0, -1])
    np.testing.assert_array_equal(table.prefix_id, [0, -1, 0, 1])
    np.testing.assert_array_equal(table.prefix_len, [40, 0, 40, 20])  # at most the prompt
    assert not table.has_turns  # trace rows keep their own arrival times
    np.testing.assert_array_equal(table.prompt_len, [100, 130, 150, 20])


def test_sharing_specs_that_contradict_each_other(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("t,in,out,conv\n0,1,1,a\n")
    bad = [
        {"dataset": {"name": "azure-conv"}, "arrival": "trace", "sessions": {"turns": 2}},
        {
            "dataset": {"name": "trace", "path": str(path), "session_column": "conv"},
            "sessions": {"turns": 2},
        },
        {
            "dataset": {
                "name": "trace",
                "path": str(path),
                "prefix_column": "conv",
                "prefix_len_column": "in",
            },
            "prefix": {"tokens": 8},
        },
        {"dataset": {"name": "trace", "path": str(path), "prefix_column": "conv"}},
        {"dataset": {"name": "random"}, "num_prompts": 1, "prefix": {"tokens": 0}},
        {"dataset": {"name": "random"}, "num_prompts": 1, "sessions": {"turns": 0}},
    ]
    for data in bad:
        with pytest.raises(ValidationError):
            WorkloadSpec.model_validate(data)
    with pytest.raises(SpecError) as info:
        make_requests(trace_spec(path, **COLUMNS, session_column="nope"))
    assert info.value.field == "dataset.session_column"


@pytest.mark.parametrize(
    ("columns", "field"),
    [
        ({"arrival_s": [0.0, float("nan")]}, "arrival_s"),  # NaN once ran as t = 0
        ({"arrival_s": [float("nan")], "prompt_len": [5], "output_len": [5]}, "arrival_s"),
        ({"arrival_s": [0.0, float("inf")]}, "arrival_s"),
        ({"arrival_s": [1.0, 0.5]}, "arrival_s"),
        ({"prompt_len": [5, "five"]}, "prompt_len"),
        ({"output_len": [5]}, "output_len"),
        ({"prompt_len": [5, 0]}, "prompt_len / output_len"),
    ],
)
def test_request_table_refuses_bad_columns(columns: dict[str, list[float]], field: str) -> None:
    base = {"arrival_s": [0.0, 1.0], "prompt_len": [5, 5], "output_len": [5, 5]}
    with pytest.raises(SpecError) as err:
        RequestTable(**{k: np.asarray(v) for k, v in (base | columns).items()})
    assert err.value.field == field


def test_request_table_checks_the_sharing_columns() -> None:
    base = {"arrival_s": [0.0, 0.0], "prompt_len": [10, 20], "output_len": [1, 1]}
    for extra in (
        {"prefix_id": [0, 0], "prefix_len": [11, 0]},  # longer than its prompt
        {"prefix_len": [5, 0]},  # a length without an id
        {"follows": [1, -1]},  # a later row
        {"follows": [-1, 0], "think_s": [0.0, -1.0]},
    ):
        with pytest.raises(ValueError):
            RequestTable(**{k: np.asarray(v) for k, v in (base | extra).items()})
