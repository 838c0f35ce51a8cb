"""Tensor parallelism across nodes: a TP group filling whole nodes, its hierarchical
collectives (NVLink inside a node, each GPU's NIC between nodes), and the layouts refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clitools import one_line_error, run_cli
from factories import plan_data, scenario_data, write_yaml

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.bound import hardware_bound
from simulator.costmodel.deployment import Deployment, deployment
from simulator.costmodel.op import collective
from simulator.costmodel.roofline import evaluate
from simulator.costmodel.step import step_cost
from simulator.errors import SpecError
from simulator.planning.layouts import enumerate_layouts, measure, traffic
from simulator.planning.spec import PlanSpec
from simulator.specs import load_hardware, load_model
from simulator.specs.deployment import Parallelism


def dep(model: str, tp: int, pp: int = 1, cp: int = 1) -> Deployment:
    return deployment(
        model=model,
        hardware="h100_sxm",
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        context_parallel_size=cp,
    )


def op_totals(d: Deployment, batch: BatchShape) -> dict[str, float]:
    cost = step_cost(d.model, d.hardware, d.layout, d.precision, batch, engine=d.engine)
    return {c.op.name: float(c.total_s[0]) for c in cost.costs}


def step_s(d: Deployment, batch: BatchShape) -> float:
    cost = step_cost(d.model, d.hardware, d.layout, d.precision, batch, engine=d.engine)
    return cost.seconds


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather"])
def test_a_collective_over_two_nodes_is_priced_hierarchically_by_hand(kind: str) -> None:
    """16 H100 in two nodes of 8, a 4 MiB message. All-reduce: reduce-scatter in the node
    (7/8 of it over NVLink), an all-reduce of each GPU's 1/8 share with its peer in the other
    node over its own NIC (2 x 1/2 of 512 KiB at 50 GB/s), then an all-gather in the node;
    latency: two intra-node collectives plus one NIC hop per ring step (2 for k = 2)."""
    hw = load_hardware("h100_sxm")
    ic, coll = hw.interconnect, hw.efficiency.collective
    msg = 4.0 * 2**20
    op = collective("x", kind, msg_bytes=msg, group=16, count=1)  # type: ignore[arg-type]
    cost = evaluate([op], hw)[0]
    eff_in = coll.busbw_fraction * float(coll.size_curve(msg))
    eff_out = coll.busbw_fraction * float(coll.size_curve(msg / 8))
    intra = 7 / 8 * msg / (ic.link_bw_bytes_per_s * eff_in)
    lat_in = coll.latency_s * float(coll.latency_group_curve(8.0))
    if kind == "all_reduce":
        inter = 2 * (1 / 2) * (msg / 8) / (ic.scale_out_bw_bytes_per_s * eff_out)
        want_net, want_lat = 2 * intra + inter, 2 * lat_in + 2 * ic.scale_out_latency_s
    else:
        inter = (1 / 2) * (msg / 8) / (ic.scale_out_bw_bytes_per_s * eff_out)
        want_net, want_lat = intra + inter, lat_in + ic.scale_out_latency_s
    assert float(cost.network_s[0]) == pytest.approx(want_net, rel=1e-9)
    assert float(cost.latency_s[0]) == pytest.approx(want_lat, rel=1e-9)
    # slower than the same collective inside one node, far faster than a flat ring over NICs
    inside = evaluate([collective("x", kind, msg_bytes=msg, group=8, count=1)], hw)[0]  # type: ignore[arg-type]
    assert float(inside.time_s[0]) < float(cost.time_s[0])
    flat = (2 if kind == "all_reduce" else 1) * 15 / 16 * msg / ic.scale_out_bw_bytes_per_s
    assert float(cost.network_s[0]) < flat / 2


def test_tp16_runs_and_a_decode_step_is_slower_than_tp8_on_one_node() -> None:
    """Llama-3.1-70B fits one node at TP8. At TP16 each GPU reads half the weights, but each
    of the 161 all-reduces of a decode step now crosses the NIC: two intra-node collectives
    and two NIC hops instead of one intra-node all-reduce. At 8 sequences the weight reads
    saved (about 17 GB / 16 vs / 8 at 3.35 TB/s) are fewer than the extra latency."""
    batch = BatchShape.decode(batch_size=8, context_len=1024)
    tp8, tp16 = dep("llama-3.1-70b", 8), dep("llama-3.1-70b", 16)
    assert tp16.layout.num_devices == 16
    one, two = op_totals(tp8, batch), op_totals(tp16, batch)
    assert two["tp_all_reduce"] > 1.5 * one["tp_all_reduce"]
    assert two["down_proj"] < one["down_proj"]  # half the weights per GPU
    assert step_s(tp16, batch) > step_s(tp8, batch)


def test_tp16_beats_tp8_pp2_per_token_for_405b_bf16_decode_at_small_batch() -> None:
    """Llama-3.1-405B bf16 (810 GB: two H100 nodes). Per token, TP8 x PP2 reads each
    stage's half of the weights one stage after the other (all 8 GPUs of a node busy while the
    other waits), TP16 reads all of them at once on 16 GPUs, paying the hierarchical all-reduce
    on every layer: TP16's step is shorter, and the all-reduce its largest extra cost."""
    batch = BatchShape.decode(batch_size=1, context_len=256)
    tp16, tp8pp2 = dep("llama-3.1-405b", 16), dep("llama-3.1-405b", 8, pp=2)
    assert step_s(tp16, batch) < step_s(tp8pp2, batch)
    a, b = op_totals(tp16, batch), op_totals(tp8pp2, batch)
    assert a["tp_all_reduce"] > b["tp_all_reduce"]


def test_layouts_within_a_node_are_priced_as_before() -> None:
    """A collective of a group within one node takes the flat ring path untouched."""
    hw = load_hardware("h100_sxm")
    ic, coll = hw.interconnect, hw.efficiency.collective
    msg = 2.0**20
    cost = evaluate([collective("x", "all_reduce", msg_bytes=msg, group=8, count=1)], hw)[0]
    eff = coll.busbw_fraction * float(coll.size_curve(msg))
    assert float(cost.network_s[0]) == pytest.approx(
        2 * 7 / 8 * msg / (ic.link_bw_bytes_per_s * eff), rel=1e-9
    )
    assert float(cost.latency_s[0]) == pytest.approx(
        coll.latency_s * float(coll.latency_group_curve(8.0)), rel=1e-9
    )


def test_tp_not_filling_whole_nodes_or_without_a_network_is_refused() -> None:
    model = load_model("llama-3.1-405b")
    h100 = load_hardware("h100_sxm")
    Parallelism(tp=16).check(model, h100)
    Parallelism(tp=16, cp=2).check(model, h100)  # each CP rank two whole nodes
    six = h100.model_copy(
        update={"interconnect": h100.interconnect.model_copy(update={"gpus_per_node": 6})}
    )
    with pytest.raises(SpecError, match="multiple"):
        Parallelism(tp=16).check(model, six)
    with pytest.raises(SpecError, match="scale-out"):
        Parallelism(tp=16).check(load_model("llama-3.1-8b"), load_hardware("l40s"))


def test_tp16_with_cp2_sends_its_ring_over_the_nic() -> None:
    d = dep("llama-3.1-70b", 16, cp=2)
    batch = BatchShape.prefill(batch_size=1, prompt_len=8192)
    cost = step_cost(d.model, d.hardware, d.layout, d.precision, batch, engine=d.engine)
    ring = next(c for c in cost.costs if c.op.name == "cp_ring_kv")
    assert ring.op.scale_out


# -- the CLI ------------------------------------------------------------------------------------
def test_bench_latency_tp16_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys,
        *("bench", "latency", "--model", "llama-3.1-405b", "--hardware", "h100_sxm"),
        *("-tp", "16", "--batch-size", "1", "--input-len", "64", "--output-len", "8"),
        *("--num-iters", "1"),
    )
    assert code == 0, err
    assert "tp_all_reduce" in out


def test_tp_beyond_a_node_that_is_not_a_multiple_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    six = write_yaml(
        tmp_path / "six.yaml", {"base": "h100_sxm", "interconnect": {"gpus_per_node": 6}}
    )
    args = ("bench", "latency", "--model", "llama-3.1-405b", "--hardware", str(six), "-tp", "16")
    err = one_line_error(capsys, *args)
    assert "tensor_parallel_size" in err and "multiple" in err


def test_tp_beyond_a_pcie_node_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("bench", "latency", "--model", "llama-3.1-8b", "--hardware", "l40s", "-tp", "16")
    err = one_line_error(capsys, *args)
    assert "tensor_parallel_size" in err and "scale-out" in err


def test_a_scenario_runs_tp16_on_two_nodes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = scenario_data(
        input_len=256,
        output_len=8,
        num_prompts=8,
        group={"hardware": "h100_sxm", "tensor_parallel_size": 16},
    )
    data["model"] = "llama-3.1-405b"
    path = write_yaml(tmp_path / "tp16.yaml", data)
    code, out, err = run_cli(capsys, "run", str(path), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["completed"] == 8 and summary["num_gpus"] == 16


def test_a_plan_prices_tp16_only_when_listed() -> None:
    data = plan_data(
        model="llama-3.1-70b",
        candidates={"hardware": ["h100_sxm"], "tensor_parallel_size": [8, 16]},
    )
    spec = PlanSpec.model_validate(data)
    layouts = enumerate_layouts(spec)
    assert [layout.tp for layout in layouts] == [8, 16]
    model = load_model("llama-3.1-70b")
    got = measure(spec, layouts[1], model=model, flow=traffic(spec))
    assert not isinstance(got, str), got
    default = PlanSpec.model_validate(plan_data(candidates={"hardware": ["h100_sxm"]}))
    assert [layout.tp for layout in enumerate_layouts(default)] == [1]


def test_llmsim_op_allreduce_prices_whole_nodes_hierarchically(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("op", "allreduce", "--hardware", "h100_sxm", "--size-bytes", "1048576", "--json")
    code, out, err = run_cli(capsys, *args, "--num-devices", "16")
    assert code == 0, err
    hw = load_hardware("h100_sxm")
    op = collective("x", "all_reduce", msg_bytes=2.0**20, group=16, count=1)
    assert json.loads(out)["latency_s"] == pytest.approx(float(evaluate([op], hw)[0].time_s[0]))
    err = one_line_error(capsys, *args, "--num-devices", "12")
    assert "num_devices" in err


def test_the_hardware_bound_counts_the_hierarchical_all_reduce() -> None:
    """The bound's network time of TP16: per token and layer two all-reduces of the hidden
    state, 2 x 7/8 of it over NVLink and 2 x 1/2 of its 1/8 share over the NIC, at datasheet
    speeds."""
    d = dep("llama-3.1-405b", 16)
    ic = d.hardware.interconnect
    bound = hardware_bound(d, prompt_len=512, output_len=128)
    msg = d.model.hidden_size * 2.0
    per_token = 2.0 * d.model.num_layers * (512 + 127)
    intra = 2 * 7 / 8 * msg / ic.link_bw_bytes_per_s
    inter = 2 * 1 / 2 * msg / 8 / ic.scale_out_bw_bytes_per_s
    assert bound.network_s == pytest.approx((intra + inter) * per_token, rel=1e-9)
