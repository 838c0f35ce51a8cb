"""The API server in front of a replica (`FrontEndCost`): request handling, the one tokenizer
thread, the first token's way back. Narrative cases on the fixed step model of
test_engine.py (a step with prefill chunks: 10 ms + 10 us per prefill token; a decode step:
5 ms), then the engine profiles and whole runs."""

from __future__ import annotations

import numpy as np
import pytest
from factories import MS, fixed_group, make_requests, scenario_data, times_ms
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.deployment import deployment
from simulator.errors import SpecError
from simulator.runs.runner import run
from simulator.serving.cluster import SimResult, serve
from simulator.serving.disagg import serve_disaggregated
from simulator.serving.kv_transfer import TransferModel
from simulator.specs import load_engine
from simulator.specs.engine import FrontEnd, FrontEndCost
from simulator.specs.loader import validate
from simulator.specs.scenario import Scenario
from simulator.specs.serving import RouterSpec
from simulator.workload.requests import RequestTable

US = 1e-6
FRONT = FrontEndCost(request_s=2 * MS, tokenize_s_per_token=10 * US, first_token_s=1 * MS)


def serve_with(
    requests: RequestTable, frontend: FrontEndCost | None, **kwargs: object
) -> SimResult:
    group = fixed_group(frontend=frontend, **kwargs)  # type: ignore[arg-type]
    return serve(requests, groups=[group])


def test_one_request_pays_the_front_end_before_and_after_its_steps() -> None:
    # t=0 sent; 2 ms of request handling; 100 tokens x 10 us = 1 ms on the tokenizer: it
    # reaches the scheduler at 3 ms. Prefill 10 + 1 = 11 ms -> sampled at 14 ms, seen at
    # 15 ms; two decode steps of 5 ms -> sampled at 19 and 24 ms, the last seen at 25 ms.
    df = serve_with(make_requests((0.0, 100, 3)), FRONT).requests
    assert times_ms(df, "first_scheduled_s") == [3.0]
    assert times_ms(df, "first_token_s") == [15.0]
    assert times_ms(df, "finish_s") == [25.0]
    bare = serve_with(make_requests((0.0, 100, 3)), None).requests
    assert times_ms(bare, "first_token_s") == [11.0]
    # TPOT is untouched: every token comes back equally late
    tpot = (df["finish_s"] - df["first_token_s"]) / (df["output_tokens"] - 1)
    bare_tpot = (bare["finish_s"] - bare["first_token_s"]) / (bare["output_tokens"] - 1)
    assert tpot.tolist() == pytest.approx(bare_tpot.tolist())


def test_requests_queue_on_the_one_tokenizer_thread() -> None:
    # Both sent at t=0 with 1000-token prompts: both handled by 2 ms; the tokenizer takes the
    # first from 2 to 12 ms and the second from 12 to 22 ms. The first's prefill runs from 12
    # to 32 ms (10 + 10 ms), so the second, in at 22 ms, waits for the next step at 32 ms;
    # tokenized side by side, both would have shared the step at 12 ms.
    df = serve_with(make_requests((0.0, 1000, 1), (0.0, 1000, 1)), FRONT).requests
    assert times_ms(df, "first_scheduled_s") == [12.0, 32.0]


def test_a_request_arriving_later_finds_the_tokenizer_idle() -> None:
    df = serve_with(make_requests((0.0, 100, 1), (0.5, 100, 1)), FRONT).requests
    assert times_ms(df, "first_scheduled_s") == [3.0, 503.0]


def test_the_router_counts_a_request_in_the_front_end_as_its_replicas() -> None:
    # Two replicas, least outstanding: request 0 (sent at 0) is still in replica 0's front-end
    # when request 1 is sent at 1 ms (it reaches the scheduler at 3 ms), so request 1 goes to
    # replica 1; request 2, sent at 50 ms when both are busy decoding one each, goes to 0
    # (lowest index), in at 53 ms, where request 0's decode step from 49 ms ends at 54 ms.
    group = fixed_group(frontend=FRONT, count=2)
    reqs = make_requests((0.0, 100, 20), (0.001, 100, 20), (0.05, 100, 1))
    df = serve(reqs, groups=[group], router=RouterSpec(kind="least_outstanding")).requests
    assert df.sort_values("request_id")["replica"].tolist() == [0, 1, 0]
    assert times_ms(df, "first_scheduled_s") == [3.0, 4.0, 54.0]


def test_max_concurrency_slot_frees_when_the_client_sees_the_last_token() -> None:
    # One slot: request 1 is sent when the client has read request 0's only token: in at 3 ms,
    # sampled at 14 ms, read at 15 ms.
    group = fixed_group(frontend=FRONT)
    df = serve(make_requests((0.0, 100, 1), (0.0, 100, 1)), groups=[group], max_concurrency=1)
    first = df.requests.sort_values("request_id")
    assert times_ms(first, "finish_s")[0] == 15.0
    assert times_ms(first, "arrival_s") == [0.0, 15.0]


@settings(max_examples=30, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=0.5),
            st.integers(min_value=1, max_value=3000),
            st.integers(min_value=1, max_value=20),
        ),
        min_size=1,
        max_size=12,
    ),
    request_ms=st.floats(min_value=0, max_value=20),
    per_token_us=st.floats(min_value=0, max_value=20),
    back_ms=st.floats(min_value=0, max_value=5),
)
def test_no_token_before_its_front_end(
    rows: list[tuple[float, int, int]], request_ms: float, per_token_us: float, back_ms: float
) -> None:
    rows = sorted(rows)
    cost = FrontEndCost(
        request_s=request_ms * MS,
        tokenize_s_per_token=per_token_us * US,
        first_token_s=back_ms * MS,
    )
    df = serve_with(make_requests(*rows), cost, num_blocks=4000).requests
    ttft = df["first_token_s"] - df["arrival_s"]
    floor = cost.request_s + cost.tokenize_s_per_token * df["prompt_tokens"] + cost.first_token_s
    assert (ttft >= floor - 1e-12).all()
    # ...and the scheduler never sees a request before its handling and tokenization are done
    reach = df["first_scheduled_s"] - df["arrival_s"]
    assert (reach >= floor - cost.first_token_s - 1e-12).all()
    # ...and every request still gets all its tokens
    assert (df["output_tokens"].to_numpy() == [r[2] for r in rows]).all()


# -- engine profiles ------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["vllm", "vllm-0.6", "vllm-0.2", "sglang", "trtllm"])
def test_serving_profiles_have_a_sourced_server_front_end_and_none_offline(engine: str) -> None:
    spec = load_engine(engine)
    assert spec.frontend.server is not None and spec.frontend.offline is None
    assert spec.front_end() == spec.frontend.server  # entrypoint "server" by default
    offline = spec.on_device(hardware_id="h100_sxm", memory_bytes=80e9, entrypoint="offline")
    assert offline.entrypoint == "offline" and offline.front_end() is None


def test_front_end_is_per_profile() -> None:
    fronts = {e: load_engine(e).front_end() for e in ("vllm", "sglang", "trtllm-0.6", "llamacpp")}
    assert fronts["sglang"] != fronts["vllm"]  # SGLang's detokenizer process: a longer way back
    assert fronts["trtllm-0.6"] is None  # a C++ benchmark loop, no server
    assert fronts["llamacpp"] is None  # not modelled


def test_deployment_carries_the_entrypoints_front_end() -> None:
    server = deployment(model="llama-3.1-8b", hardware="h100_sxm", engine="vllm")
    offline = deployment(
        model="llama-3.1-8b", hardware="h100_sxm", engine="vllm", entrypoint="offline"
    )
    assert server.engine.front_end() is not None
    assert offline.engine.front_end() is None


def test_bad_front_end_values_are_refused() -> None:
    with pytest.raises(ValueError, match="request_s"):
        validate(FrontEnd, {"server": {"request_s": -1}}, source="x")
    with pytest.raises(SpecError):
        validate(FrontEnd, {"server": {"tokenize_s_per_token": "fast"}}, source="x")


# -- whole runs ------------------------------------------------------------------------------------
def _low_load(entrypoint: str, engine: str = "vllm") -> tuple[float, float]:
    """Median TTFT (s) and TPOT of a light run (1 request/s, 128-token prompts)."""
    data = scenario_data(
        input_len=128,
        output_len=16,
        num_prompts=10,
        request_rate=1.0,
        group={"hardware": "h100_sxm", "engine": engine, "entrypoint": entrypoint},
    )
    summary = run(validate(Scenario, data, source="test")).summary
    return summary["median_ttft_ms"] / 1e3, summary["median_tpot_ms"] / 1e3


def test_server_runs_add_the_front_end_to_ttft_at_low_load_and_offline_runs_do_not() -> None:
    cost = load_engine("vllm").frontend.server
    assert cost is not None
    added = cost.request_s + cost.tokenize_s_per_token * 128 + cost.first_token_s
    server_ttft, server_tpot = _low_load("server")
    offline_ttft, offline_tpot = _low_load("offline")
    # at 1 request/s nothing queues: the server's TTFT is the offline one plus its front-end
    # (the offline batch defaults, 16384 tokens a step, price the steps a hair apart)
    assert server_ttft - offline_ttft == pytest.approx(added, abs=1e-6)
    assert server_tpot == pytest.approx(offline_tpot, rel=1e-9)


def test_an_engine_without_a_front_end_adds_nothing() -> None:
    assert _low_load("server", "llamacpp")[0] == pytest.approx(_low_load("offline", "llamacpp")[0])


def test_front_end_time_is_in_the_request_rows() -> None:
    data = scenario_data(input_len=500, output_len=4, num_prompts=5, request_rate=2.0)
    rows = run(validate(Scenario, data, source="test")).sim.requests
    cost = load_engine("vllm").frontend.server
    assert cost is not None
    wait = (rows["first_scheduled_s"] - rows["arrival_s"]).to_numpy()
    assert np.all(wait >= cost.request_s + 500 * cost.tokenize_s_per_token - 1e-12)


def test_disaggregated_arrivals_pass_the_prefill_groups_front_end() -> None:
    # As test_disagg's one request, behind FRONT: in at the prefill replica at 3 ms, first
    # token sampled at 14 ms and read at 15; a 1 ms link puts the KV in place at 15 ms; 3
    # decode steps of 5 ms sample the last token at 30 ms, read at 31 ms.
    link = TransferModel(  # 100 tokens' KV in 1 ms
        kind="test",
        bandwidth_bytes_per_s=1e9,
        latency_s=0.0,
        bytes_per_token=1e4,
        parallel_links=1,
        num_layers=10,
        layerwise=False,
    )
    result = serve_disaggregated(
        make_requests((0.0, 100, 4)),
        groups=[fixed_group(frontend=FRONT), fixed_group(frontend=FRONT)],
        roles=["prefill", "decode"],
        links={(0, 1): link},
    )
    r = result.requests.set_index("request_id").loc[0]
    assert (r["first_token_s"] / MS, r["finish_s"] / MS) == pytest.approx((15.0, 31.0))
    # the phases count from the engine's first token: they still partition arrival -> KV in
    # place (3 ms of front-end in the prefill queue), none negative
    assert r["prefill_queue_s"] / MS == pytest.approx(3.0)
    assert r["prefill_s"] / MS == pytest.approx(11.0)
    assert r["decode_queue_s"] == pytest.approx(0.0)
    assert r["transfer_s"] / MS == pytest.approx(1.0)
