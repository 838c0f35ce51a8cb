"""A cluster's distributed KV pool (serving/kv_pool.py, Infinite-LLM): borrowing, the block
count it conserves, its price, the mode off changing nothing, and bad values refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.deployment import deployment
from simulator.errors import SpecError
from simulator.runs import runner
from simulator.serving.kv_cache import BlockManager
from simulator.serving.kv_pool import (
    KvPool,
    PooledBlockManager,
    PoolLink,
    pool_link,
    pool_plan,
    query_bytes_per_token,
    replica_nodes,
)
from simulator.serving.request import Request
from simulator.specs.scenario import Scenario
from simulator.specs.serving import KvPoolSpec
from tests.clitools import one_line_error

LINK = PoolLink(
    kind="nvlink",
    bandwidth_bytes_per_s=100e9,
    latency_s=3e-6,
    bytes_per_token_layer=16640.0,
    num_layers=32,
)


def pool_of(
    *sizes: int,
    fraction: float = 1.0,
    nodes: tuple[int, ...] = (),
    link: PoolLink = LINK,
    local_link: PoolLink | None = None,
) -> tuple[KvPool, list[PooledBlockManager]]:
    """A pool of caches of `sizes` blocks on `nodes` (default: all on node 0)."""
    pool = KvPool(KvPoolSpec(mode="distributed", max_lend_fraction=fraction))
    members = [
        PooledBlockManager(
            num_blocks=n,
            block_size=16,
            watermark=0.0,
            host_blocks=0,
            pool=pool,
            link=link,
            node=node,
            local_link=local_link,
        )
        for n, node in zip(sizes, nodes or (0,) * len(sizes), strict=True)
    ]
    return pool, members


def request(i: int, prompt: int, output: int = 16) -> Request:
    return Request(id=i, arrival_s=0.0, prompt_len=prompt, output_len=output)


def test_a_full_replica_borrows_what_it_would_otherwise_queue() -> None:
    plain = BlockManager(num_blocks=20, block_size=16, watermark=0.0)
    _, (debtor, creditor) = pool_of(20, 20)
    long = request(0, prompt=30 * 16 - 16)  # 30 blocks in all: more than one cache
    assert not plain.can_admit(long, long.prompt_len)
    assert debtor.can_admit(long, long.prompt_len)
    assert debtor.allocate(long, long.prompt_len)
    assert long.blocks == 29 and debtor.own_free == 0 and debtor.borrowed == 9
    # the creditor's own admission sees less room
    assert creditor.own_free == 11 and creditor.lent == 9
    assert not creditor.can_admit(request(1, prompt=15 * 16), 15 * 16)
    debtor.release(long)
    assert debtor.own_free == 20 and creditor.own_free == 20
    assert creditor.lent == 0 and debtor.borrowed == 0
    assert creditor.can_admit(request(1, prompt=15 * 16), 15 * 16)


def test_a_lender_does_not_borrow_and_the_cap_holds() -> None:
    _, (a, b, c) = pool_of(10, 10, 10, fraction=0.5)
    big = request(0, prompt=18 * 16)
    assert a.allocate(big, big.prompt_len)  # 10 own + 5 from each
    assert b.lent == 4 or b.lent == 5
    assert b.lent + c.lent == 8 and b.lent <= 5 and c.lent <= 5
    other = request(1, prompt=12 * 16)  # b lends: it may use its own room only
    assert b.free == b.own_free
    assert not b.allocate(other, other.prompt_len)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=2, max_size=4),
    ops=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(1, 400), st.booleans()),
        max_size=60,
    ),
)
def test_the_pool_conserves_its_blocks(sizes: list[int], ops: list[Any]) -> None:
    pool, members = pool_of(*sizes)
    live: dict[int, tuple[PooledBlockManager, Request]] = {}
    next_id = 0
    for who, slot, tokens, release in ops:
        kv = members[who % len(members)]
        if release and slot in live:
            owner, req = live.pop(slot)
            owner.release(req)
        elif slot in live:
            owner, req = live[slot]
            owner.allocate(req, tokens)
            req.num_computed = min(req.num_computed + tokens, req.blocks * 16)
        else:
            req = request(next_id, prompt=tokens)
            next_id += 1
            if kv.allocate(req, tokens):
                req.num_computed = tokens
                live[slot] = (kv, req)
        held = sum(req.blocks for _, req in live.values())
        in_use = sum(m.num_blocks - m.own_free for m in members)
        assert held == in_use <= sum(sizes)
        assert all(m.own_free >= 0 and m.lent >= 0 and m.borrowed >= 0 for m in members)
        assert sum(m.lent for m in members) == sum(m.borrowed for m in members) == pool.on_loan
        for m in members:
            owed = sum(loans.get(m.member, 0) for d in members for loans in d.loans.values())
            assert owed == m.lent


def test_the_exchange_is_priced_from_the_model_dims() -> None:
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    # 32 heads x (128 query + 128 output) x 2 bytes + 32 x (max, sum) in fp32
    assert query_bytes_per_token(dep) == 32 * 256 * 2 + 32 * 8
    tp2 = deployment(model="llama-3.1-8b", hardware="h100_sxm", tensor_parallel_size=2)
    assert query_bytes_per_token(tp2) == query_bytes_per_token(dep) / 2
    (link,) = pool_link(KvPoolSpec(mode="distributed"), [(dep, 4)])
    assert link.kind == "nvlink" and link.num_layers == 32
    assert link.exchange_s(0) == 0.0
    one, ten = link.exchange_s(1), link.exchange_s(10)
    assert one == pytest.approx(32 * (2 * link.latency_s + 16640 / link.bandwidth_bytes_per_s))
    assert ten - one == pytest.approx(32 * 9 * 16640 / link.bandwidth_bytes_per_s)
    (far,) = pool_link(KvPoolSpec(mode="distributed"), [(dep, 16)])  # two nodes
    assert far.kind == "scale-out" and far.exchange_s(10) > ten


def test_replicas_fill_nodes_in_turn() -> None:
    h100 = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    tp2 = deployment(model="llama-3.1-8b", hardware="h100_sxm", tensor_parallel_size=2)
    tp16 = deployment(model="llama-3.1-70b", hardware="h100_sxm", tensor_parallel_size=16)
    a100 = deployment(model="llama-3.1-8b", hardware="a100_sxm_80gb")
    assert replica_nodes([(h100, 16)]) == [0] * 8 + [1] * 8
    assert replica_nodes([(tp2, 3), (h100, 3)]) == [0, 0, 0, 0, 0, 1]  # 6 + 1 + 1, then 1
    assert replica_nodes([(tp16, 2), (h100, 1)]) == [0, 2, 4]
    assert replica_nodes([(h100, 2), (a100, 2)]) == [0, 0, 1, 1]  # another type: a new node


def test_a_debtor_borrows_on_its_node_first_and_pays_each_link() -> None:
    """Two nodes: the debtor's node neighbour has less room than the far creditor, yet lends
    first; a request whose blocks sit on its node pays the fabric's exchange, one whose blocks
    sit on the other node the network's, one with both the longer of the two."""
    far = PoolLink(
        kind="scale-out",
        bandwidth_bytes_per_s=40e9,
        latency_s=10e-6,
        bytes_per_token_layer=16640.0,
        num_layers=32,
    )
    _, (debtor, near, other) = pool_of(20, 12, 40, nodes=(0, 0, 1), link=far, local_link=LINK)
    req = request(0, prompt=(20 + 10) * 16)
    assert debtor.allocate(req, req.prompt_len)
    assert debtor.loans[req.id] == {near.member: 10}  # its neighbour, not the roomier one
    both = request(1, prompt=20 * 16)
    assert debtor.allocate(both, both.prompt_len)  # 2 more from its neighbour, 18 from far
    assert debtor.loans[both.id] == {near.member: 2, other.member: 18}
    assert LINK.exchange_s(1) < far.exchange_s(1)


def test_a_pool_over_two_nodes_prices_neighbours_over_the_fabric() -> None:
    dep = deployment(model="llama-3.1-8b", hardware="h100_sxm")
    plan = pool_plan(KvPoolSpec(mode="distributed"), [(dep, 16)])
    assert plan is not None and plan.nodes == tuple([0] * 8 + [1] * 8)
    ((link,), (local,)) = plan.links, plan.local_links
    assert link.kind == "scale-out" and local is not None and local.kind == "nvlink"
    assert local.exchange_s(10) < link.exchange_s(10)
    one = pool_plan(KvPoolSpec(mode="distributed"), [(dep, 4)])  # one node: one link
    assert one is not None and one.local_links == (None,)
    named = pool_plan(KvPoolSpec(mode="distributed", link="infiniband"), [(dep, 16)])
    assert named is not None and named.local_links == (None,)  # the spec's link for every one


def scenario(pool: dict[str, Any] | None, **group: Any) -> Scenario:
    data: dict[str, Any] = {
        "name": "pool-test",
        "model": "llama-3.1-8b",
        "replicas": [{"hardware": "h100_sxm", "count": 2, **group}],
        "workload": {
            "dataset": {"name": "random", "input_len": 6000, "output_len": 64, "range_ratio": 0.9},
            "num_prompts": 16,
            "request_rate": 2.0,
        },
    }
    if pool is not None:
        data["kv_pool"] = pool
    return Scenario.model_validate(data)


def test_mode_off_is_todays_run_bit_for_bit() -> None:
    today = runner.run(scenario(None))
    off = runner.run(scenario({"mode": "off"}))
    assert today.sim.requests.equals(off.sim.requests)
    assert today.sim.steps.equals(off.sim.steps)
    assert off.sim.kv_pool is None and "kv_pool" not in off.summary


@pytest.mark.slow
def test_requests_longer_than_one_cache_run_on_the_pool() -> None:
    small = {"gpu_memory_utilization": 0.245, "enable_prefix_caching": False}
    with pytest.raises(SpecError, match="the cache holds"):
        runner.run(scenario(None, **small))
    result = runner.run(scenario({"mode": "distributed"}, **small))
    assert len(result.sim.requests) == 16
    assert result.sim.requests["finish_s"].notna().all()
    pool = result.summary["kv_pool"]
    assert pool["requests_borrowing"] > 0 and pool["peak_blocks_on_loan"] > 0
    assert pool["exchange_s"] > 0 and pool["remote_attention_s"] > 0


def test_over_two_nodes_neighbours_lend_over_the_fabric() -> None:
    """Sixteen H100 replicas (two nodes), caches a quarter of the GPU: with the link `auto`
    debtors borrow from their own node first, over NVLink, and spend a fraction of the
    exchange time of the same pool with every creditor over InfiniBand."""

    def run(link: str) -> dict[str, float]:
        small = {"gpu_memory_utilization": 0.245, "enable_prefix_caching": False}
        base = scenario({"mode": "distributed", "link": link}, **small)
        group = base.replicas[0].model_copy(update={"count": 16})
        load = base.workload.model_copy(update={"num_prompts": 96, "request_rate": 16.0})
        result = runner.run(base.model_copy(update={"replicas": [group], "workload": load}))
        return result.summary["kv_pool"]

    near, far = run("auto"), run("infiniband")
    assert near["requests_borrowing"] > 0 and far["requests_borrowing"] > 0
    assert near["exchange_s"] < 0.5 * far["exchange_s"]


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ("{mode: shared}", "kv_pool.mode"),
        ("{mode: distributed, max_lend_fraction: 0}", "max_lend_fraction"),
        ("{mode: distributed, link: carrier_pigeon}", "kv_pool.link"),
        ("{mode: distributed}", "kv_pool: a distributed kv_pool needs two or more replicas"),
    ],
)
def test_bad_kv_pool_values_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], block: str, reason: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: bad\nmodel: llama-3.1-8b\nreplicas: [{hardware: h100_sxm}]\n"
        f"kv_pool: {block}\n"
        "workload: {dataset: {name: random, input_len: 8, output_len: 8}, num_prompts: 4}\n"
    )
    err = one_line_error(capsys, "run", str(path))
    assert "bad.yaml" in err and reason in err


def test_a_pool_refuses_prefix_caching_set_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cached.yaml"
    path.write_text(
        "name: cached\nmodel: llama-3.1-8b\n"
        "replicas: [{hardware: h100_sxm, count: 2, enable_prefix_caching: true}]\n"
        "kv_pool: {mode: distributed}\n"
        "workload: {dataset: {name: random, input_len: 8, output_len: 8}, num_prompts: 4}\n"
    )
    err = one_line_error(capsys, "run", str(path))
    assert "replicas.0.enable_prefix_caching" in err and "prefix caching" in err


def test_the_cli_flag_pools_the_dp_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(
        capsys,
        "bench",
        "throughput",
        "--model",
        "llama-3.1-8b",
        "--hardware",
        "h100_sxm",
        "--kv-pool",
        "distributed",
        "--num-prompts",
        "4",
    )
    assert "two or more replicas" in err
    from tests.clitools import run_cli

    code, out, err = run_cli(
        capsys,
        "bench",
        "throughput",
        "--model",
        "llama-3.1-8b",
        "--hardware",
        "h100_sxm",
        "-dp",
        "2",
        "--kv-pool",
        "distributed",
        "--input-len",
        "512",
        "--output-len",
        "16",
        "--num-prompts",
        "8",
    )
    assert code == 0, err
    assert "Throughput:" in out


def test_the_python_api_pools_through_engine_args() -> None:
    import simulator as sim

    result, summary = sim.bench_throughput(
        model="llama-3.1-8b",
        hardware="h100_sxm",
        input_len=512,
        output_len=16,
        num_prompts=8,
        engine_args=sim.EngineArgs(data_parallel_size=2, kv_pool="distributed"),
    )
    assert result.scenario.kv_pool is not None and result.scenario.kv_pool.mode == "distributed"
    assert result.sim.kv_pool is not None and summary["num_requests"] == 8


def test_an_autoscaled_scenario_cannot_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "scaled.yaml"
    path.write_text(
        "name: scaled\nmodel: llama-3.1-8b\nreplicas: [{hardware: h100_sxm, count: 2}]\n"
        "autoscale: {min_replicas: 1, max_replicas: 4, target: 4}\n"
        "kv_pool: {mode: distributed}\n"
        "workload: {dataset: {name: random, input_len: 8, output_len: 8}, num_prompts: 4}\n"
    )
    err = one_line_error(capsys, "run", str(path))
    assert "scaled.yaml: kv_pool: " in err and "an autoscaled scenario" in err
