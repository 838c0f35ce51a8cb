"""Disaggregated prefill/decode serving: hand-computed timelines on the narrative step-time
model of test_engine (a step with prefill chunks takes 10 ms + 10 us per prefill token, a
decode-only step 5 ms), the links resolved from the specs, scenarios and the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from clitools import run_cli as cli
from factories import (
    MS,
    fixed_group,
    make_requests,
    make_scheduler,
    scenario_data,
    times_ms,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.deployment import deployment
from simulator.errors import SpecError
from simulator.metrics.phases import PHASE_COLUMNS
from simulator.runs import runner
from simulator.runs.sweeps import expand, load_sweep
from simulator.serving.cluster import ReplicaGroup, SimResult, serve
from simulator.serving.disagg import serve_disaggregated
from simulator.serving.kv_transfer import TransferModel, transfer_links
from simulator.specs.loader import validate
from simulator.specs.scenario import Scenario, load_scenario
from simulator.specs.serving import KVTransferSpec
from simulator.workload.requests import RequestTable

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def link(*, ms_per_100_tokens: float, latency_ms: float = 0.0, layers: int = 10, **kw: object):
    """A link moving 100 prompt tokens' KV in `ms_per_100_tokens` (one GPU each side)."""
    values: dict[str, object] = {
        "kind": "test",
        "bandwidth_bytes_per_s": 1e9,
        "latency_s": latency_ms * MS,
        "bytes_per_token": ms_per_100_tokens * MS * 1e9 / 100,
        "parallel_links": 1,
        "num_layers": layers,
        "layerwise": False,
    }
    return TransferModel(**(values | kw))  # type: ignore[arg-type]


def group(num_blocks: int = 1000, count: int = 1, **sched: object) -> ReplicaGroup:
    return fixed_group(scheduler=make_scheduler(**sched), num_blocks=num_blocks, count=count)


def run_pair(
    requests: RequestTable,
    transfer: TransferModel,
    *,
    prefill: ReplicaGroup | None = None,
    decode: ReplicaGroup | None = None,
) -> SimResult:
    """One prefill group (group 0) and one decode group (group 1)."""
    return serve_disaggregated(
        requests,
        groups=[prefill or group(), decode or group()],
        roles=["prefill", "decode"],
        links={(0, 1): transfer},
    )


def row(result: SimResult, request_id: int) -> pd.Series:
    return result.requests.set_index("request_id").loc[request_id]


# -- one request through a prefill/decode pair, by hand ------------------------------------------
def test_one_request_through_a_disaggregated_pair() -> None:
    # Prefill replica: 100 tokens in one step, 10 + 1 = 11 ms: the first token at 11 ms (TTFT).
    # Transfer: 100 tokens x 1 MB at 1 GB/s = 100 ms on the wire, + 1 ms latency: KV in place
    # at 112 ms. Decode replica: 3 decode steps of 5 ms -> tokens at 117, 122, 127 ms.
    result = run_pair(make_requests((0.0, 100, 4)), link(ms_per_100_tokens=100, latency_ms=1))
    r = row(result, 0)
    assert r["first_token_s"] / MS == pytest.approx(11.0)
    assert r["finish_s"] / MS == pytest.approx(127.0)
    assert r["output_tokens"] == 4
    assert (r["prefill_replica"], r["replica"]) == (0, 1)
    assert r["prefill_queue_s"] == 0.0
    assert r["prefill_s"] / MS == pytest.approx(11.0)
    assert r["decode_queue_s"] == 0.0
    assert r["transfer_s"] / MS == pytest.approx(101.0)
    # ITL: the first decode token comes 106 ms after the first token, then 5 and 5 ms.
    gaps = np.repeat(result.itl_s, result.itl_weight.astype(int)) / MS
    assert sorted(gaps) == pytest.approx([5.0, 5.0, 106.0])
    # The prefill replica ran one step (the prompt), the decode replica three.
    steps = result.steps
    assert steps[steps["replica"] == 0]["prefill_tokens"].tolist() == [100]
    assert steps[steps["replica"] == 1]["decode_tokens"].tolist() == [1, 1, 1]


def test_layerwise_transfer_overlaps_the_prefill() -> None:
    # Link-bound: X = 100 ms, prefill S = 11 ms over L = 10 layers. The link starts after the
    # first layer (1.1 ms) and runs to 101.1 ms; + 1 ms latency: KV in place at 102.1 ms, an
    # exposed transfer of X - S (L - 1) / L + latency = 100 - 9.9 + 1 = 91.1 ms.
    slow = link(ms_per_100_tokens=100, latency_ms=1, layerwise=True)
    r = row(run_pair(make_requests((0.0, 100, 4)), slow), 0)
    assert r["transfer_s"] / MS == pytest.approx(91.1)
    assert r["finish_s"] / MS == pytest.approx(102.1 + 15.0)
    # Compute-bound: X = 5 ms <= S; only the last layer's X / L = 0.5 ms is exposed, + 1 ms.
    fast = link(ms_per_100_tokens=5, latency_ms=1, layerwise=True)
    assert row(run_pair(make_requests((0.0, 100, 4)), fast), 0)["transfer_s"] / MS == (
        pytest.approx(1.5)
    )


def test_decode_kv_capacity_backs_up_into_the_prefill_pool() -> None:
    # Prefill cache 8 blocks of 16, decode cache 7: one 100-token prompt (7 blocks) at a time.
    # r0: prefill 0-11 ms, decode admits it (7 blocks for 101 tokens), transfer 1 ms -> 12 ms;
    #     9 decode steps: 12 + 45 = 57 ms.
    # r1: cannot enter the prefill cache until r0's KV has left it (12 ms): prefill 12-23 ms.
    #     The decode cache is full until r0 finishes (57 ms): decode queue 57 - 23 = 34 ms, its
    #     prefill blocks held meanwhile; transfer 57-58 ms; 9 decode steps -> 103 ms.
    result = run_pair(
        make_requests((0.0, 100, 10), (0.0, 100, 10)),
        link(ms_per_100_tokens=1),
        prefill=group(num_blocks=8),
        decode=group(num_blocks=7),
    )
    df = result.requests
    assert times_ms(df, "first_token_s") == [11.0, 23.0]
    assert times_ms(df, "finish_s") == [57.0, 103.0]
    assert times_ms(df, "prefill_queue_s") == [0.0, 12.0]
    assert times_ms(df, "decode_queue_s") == [0.0, 34.0]
    assert times_ms(df, "transfer_s") == [1.0, 1.0]
    prefill_kv = result.steps[result.steps["replica"] == 0]["kv_used_blocks"]
    assert prefill_kv.max() <= 8


def test_transfers_sharing_a_link_queue() -> None:
    # Two 100-token prompts prefilled in one step (10 + 2 = 12 ms) on one prefill replica,
    # 10 ms each on the wire: r0's KV in place at 22 ms, r1's waits for the link: 32 ms.
    result = run_pair(make_requests((0.0, 100, 2), (0.0, 100, 2)), link(ms_per_100_tokens=10))
    assert times_ms(result.requests, "transfer_s") == [10.0, 20.0]


def test_a_single_output_token_finishes_on_the_prefill_replica() -> None:
    result = run_pair(make_requests((0.0, 100, 1)), link(ms_per_100_tokens=10))
    r = row(result, 0)
    assert r["finish_s"] / MS == pytest.approx(11.0)
    assert (r["replica"], r["prefill_replica"]) == (0, 0)
    assert np.isnan(r["transfer_s"]) and np.isnan(r["decode_queue_s"])


def test_colocated_rows_carry_empty_phase_columns() -> None:
    result = serve(make_requests((0.0, 100, 3)), groups=[group()])
    assert set(PHASE_COLUMNS) <= set(result.requests.columns)
    assert result.requests["prefill_replica"].tolist() == [-1]
    assert result.requests[list(PHASE_COLUMNS[1:])].isna().all().all()


# -- properties -----------------------------------------------------------------------------------
workloads = st.lists(
    st.tuples(st.floats(0, 0.3), st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=20
)


@settings(max_examples=150, deadline=None)
@given(
    rows=workloads,
    pools=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    blocks=st.tuples(st.integers(25, 120), st.integers(25, 120)),
    wire_ms=st.floats(0.0, 20.0),
    layerwise=st.booleans(),
    decode_seqs=st.integers(1, 8),
    kind=st.sampled_from(["continuous", "prefill_first"]),
)
def test_every_request_finishes_once_with_its_tokens(
    rows: list[tuple[float, int, int]],
    pools: tuple[int, int],
    blocks: tuple[int, int],
    wire_ms: float,
    layerwise: bool,
    decode_seqs: int,
    kind: str,
) -> None:
    rows.sort()
    result = run_pair(
        make_requests(*rows),
        link(ms_per_100_tokens=wire_ms, latency_ms=0.5, layerwise=layerwise),
        prefill=group(num_blocks=blocks[0], count=pools[0], kind=kind),
        decode=group(num_blocks=blocks[1], count=pools[1], kind=kind, max_num_seqs=decode_seqs),
    )
    df = result.requests.sort_values("request_id")
    assert df["request_id"].tolist() == list(range(len(rows)))
    assert df["output_tokens"].tolist() == [r[2] for r in rows]
    assert df["prompt_tokens"].tolist() == [r[1] for r in rows]
    assert (df["first_token_s"] >= df["arrival_s"]).all()
    assert (df["finish_s"] >= df["first_token_s"]).all()
    phases = df[list(PHASE_COLUMNS[1:])]
    assert (phases.fillna(0.0) >= -1e-12).all().all()
    decoded = df["output_tokens"] > 1
    assert df.loc[decoded, "replica"].ge(pools[0]).all()  # decode replicas follow the prefill
    assert df["prefill_replica"].between(0, pools[0] - 1).all()
    # each KV cache stays within its size
    steps = result.steps
    for replica, size in [(i, blocks[0]) for i in range(pools[0])] + [
        (pools[0] + i, blocks[1]) for i in range(pools[1])
    ]:
        assert (steps.loc[steps["replica"] == replica, "kv_used_blocks"] <= size).all()
    # every token after the first is one inter-token gap
    assert result.itl_weight.sum() == pytest.approx(float((df["output_tokens"] - 1).sum()))


# -- links from the specs -----------------------------------------------------------------------
def links_of(kv: dict[str, object] | None, *pools: tuple[str, str, int, int]) -> dict:
    """(role, hardware, tp, count) per group, Llama-3.1-8B."""
    deps = [
        (role, deployment(model="llama-3.1-8b", hardware=hw, tensor_parallel_size=tp), count)
        for role, hw, tp, count in pools
    ]
    spec = KVTransferSpec(**kv) if kv is not None else None  # type: ignore[arg-type]
    return transfer_links(spec, pools=deps)


def test_links_resolved_from_the_specs() -> None:
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131,072 B per token.
    one_node = links_of(None, ("prefill", "h100_sxm", 1, 2), ("decode", "h100_sxm", 2, 2))
    nv = one_node[0, 1]
    assert nv.kind == "nvlink"
    assert nv.bandwidth_bytes_per_s == pytest.approx(450e9 * 0.84)  # NVLink4 x nvlink_fraction
    assert nv.latency_s == pytest.approx(3e-6)
    assert nv.bytes_per_token == 131072
    assert nv.parallel_links == 1
    # 1000 tokens: 131 MB over one 378 GB/s link: 0.347 ms
    assert nv.wire_s(1000) == pytest.approx(1000 * 131072 / 378e9)
    # 12 GPUs do not fit one 8-GPU node: the NICs, 50 GB/s x network_fraction 0.87
    two_nodes = links_of(None, ("prefill", "h100_sxm", 2, 2), ("decode", "h100_sxm", 4, 2))
    net = two_nodes[0, 1]
    assert (net.kind, net.parallel_links) == ("scale-out", 2)
    assert net.bandwidth_bytes_per_s == pytest.approx(50e9 * 0.87)
    # L40S has no GPU fabric: PCIe, 32 GB/s x its measured host link fraction 0.81
    pcie = links_of(None, ("prefill", "l40s", 1, 1), ("decode", "l40s", 1, 1))[0, 1]
    assert pcie.kind == "pcie"
    assert pcie.bandwidth_bytes_per_s == pytest.approx(32e9 * 0.81)
    # H100 prefill, A100 decode: different nodes; overrides replace the specs' figures
    mixed = links_of(
        {"kind": "roce", "bandwidth_bytes_per_s": "25 GB/s", "latency_s": "10 us"},
        ("prefill", "h100_sxm", 1, 1),
        ("decode", "a100_sxm_80gb", 1, 1),
    )[0, 1]
    assert (mixed.kind, mixed.bandwidth_bytes_per_s) == ("roce", 25e9)
    assert mixed.latency_s == pytest.approx(1e-5)


def test_nvlink_between_different_gpus_is_an_error() -> None:
    with pytest.raises(SpecError, match="nvlink") as err:
        links_of(
            {"kind": "nvlink"}, ("prefill", "h100_sxm", 1, 1), ("decode", "a100_sxm_80gb", 1, 1)
        )
    assert err.value.field == "kv_transfer.kind"


# -- scenarios ------------------------------------------------------------------------------------
def scenario(**over: object) -> dict[str, object]:
    pools = [
        {"hardware": "h100_sxm", "role": "prefill"},
        {"hardware": "h100_sxm", "role": "decode", "count": 2},
    ]
    base = scenario_data(
        name="pd", input_len=512, output_len=64, num_prompts=60, request_rate=10, replicas=pools
    )
    return base | over


@pytest.mark.parametrize(
    ("replicas", "extra", "message"),
    [
        ([{"hardware": "h100_sxm"}, {"hardware": "h100_sxm", "role": "decode"}], {}, "'both'"),
        ([{"hardware": "h100_sxm", "role": "prefill"}], {}, "needs a decode group"),
        ([{"hardware": "h100_sxm"}], {"kv_transfer": {"kind": "pcie"}}, "kv_transfer applies"),
        ([{"hardware": "h100_sxm"}], {"decode_router": {"kind": "least_kv"}}, "decode_router"),
    ],
)
def test_bad_role_combinations_are_spec_errors(
    replicas: list[dict[str, object]], extra: dict[str, object], message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        validate(Scenario, scenario(replicas=replicas, **extra), source="test")


def test_kv_cache_dtypes_must_match() -> None:
    groups = [
        {"hardware": "h100_sxm", "role": "prefill"},
        {"hardware": "h100_sxm", "role": "decode", "kv_cache_dtype": "fp8"},
    ]
    with pytest.raises(SpecError, match="KV cache") as err:
        runner.run(Scenario.model_validate(scenario(replicas=groups)))
    assert err.value.field == "replicas.1.kv_cache_dtype"


def test_a_disaggregated_scenario_runs_with_phases_energy_and_pools() -> None:
    result = runner.run(Scenario.model_validate(scenario()))
    s = result.summary
    assert s["completed"] == 60
    assert s["total_output_tokens"] == result.sim.requests["output_tokens"].sum()
    for key in ("mean_transfer_ms", "p99_decode_queue_ms", "mean_prefill_queue_ms"):
        assert s[key] >= 0
    assert 0 < s["prefill_pool_utilization"] <= 1 and 0 < s["decode_pool_utilization"] <= 1
    assert result.energy["num_gpus"] == 3
    df = result.sim.requests
    assert set(df["prefill_replica"]) == {0}
    assert set(df.loc[df["output_tokens"] > 1, "replica"]) <= {1, 2}
    # TTFT ends on the prefill replica: the first token is before any decode step
    assert (df["first_token_s"] <= df["finish_s"]).all()
    assert "mean_transfer_ms" not in runner.run(SCENARIOS / "quickstart.yaml").summary


def test_the_disaggregated_scenario_file_and_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    path = SCENARIOS / "disagg_h100.yaml"
    assert load_scenario(path).disaggregated
    code, out, err = cli(capsys, "run", str(path))
    assert code == 0, err
    assert "Prefill pool: 2 replica(s)" in out
    assert "KV transfer, group 0 -> 1: nvlink" in out
    assert "Phases, mean / p99 ms: prefill queue" in out
    code, _, err = cli(capsys, "run", str(SCENARIOS / "disagg_h100.yaml"), "--json")
    assert code == 0


def test_the_comparison_sweep_holds_equal_gpu_counts() -> None:
    runs = expand(load_sweep(SCENARIOS / "sweep_disagg_vs_colocated.yaml"))
    assert runs and all(r["error"] is None for r in runs)
    for r in runs:
        gpus = sum(
            g["count"] * g["tensor_parallel_size"] * g["pipeline_parallel_size"]
            for g in r["scenario"]["replicas"]
        )
        assert gpus == 8
    kinds = {any(g["role"] != "both" for g in r["scenario"]["replicas"]) for r in runs}
    assert kinds == {True, False}
