"""Disaggregated candidates in `llmsim plan`: units of prefill and decode replicas, their
bounds, fleets over two hardware types, and small plans end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clitools import run_cli
from factories import plan_data, request_latencies, write_yaml

from simulator.planning.fleet import FleetOption, cheapest_fleet, single_layout_fleet
from simulator.planning.layouts import Layout, Prepared, measure, scenario, traffic
from simulator.planning.plan import plan
from simulator.planning.spec import PlanSpec, load_plan
from simulator.planning.units import Unit, build_units
from simulator.runs import runner
from simulator.specs import load_model

REPO = Path(__file__).resolve().parents[1]
H100 = Layout("h100_sxm", "vllm", None, "auto", 1, 1)


def units_of(data: dict[str, Any], *layouts: Layout) -> tuple[PlanSpec, list[Unit], list[Prepared]]:
    spec = PlanSpec.model_validate(data)
    flow, model = traffic(spec), load_model(spec.model)
    measured = [measure(spec, lay, model=model, flow=flow) for lay in layouts]
    assert all(isinstance(m, Prepared) for m in measured), measured
    ready = [m for m in measured if isinstance(m, Prepared)]
    units, _ = build_units(spec, ready, flow)
    return spec, units, ready


# -- fleets of units ----------------------------------------------------------------------------
def test_a_unit_over_two_hardware_types_counts_against_both_limits() -> None:
    # U1: 1 H100 prefill + 2 L40S decode, 10 req/s for $5/h; U2: 2 H100, 6 req/s for $4/h.
    # Target 30: alone, 3 x U1 = $15 (the optimum) or 5 x U2 = $20. With 4 L40S available U1
    # fits twice: 2 x U1 + 2 x U2 = 32 req/s for $18 (1 x U1 + 4 x U2 = $21; 3 x U1 is out).
    u1 = FleetOption("U1", "h100", 3, 10.0, 5.0, (("h100", 1), ("l40s", 2)))
    u2 = FleetOption("U2", "h100", 2, 6.0, 4.0, (("h100", 2),))
    assert cheapest_fleet([u1, u2], target_rate=30).replicas == {"U1": 3}  # type: ignore[union-attr]
    limited = cheapest_fleet([u1, u2], target_rate=30, gpu_limits={"l40s": 4})
    assert limited is not None and limited.replicas == {"U1": 2, "U2": 2}
    assert (limited.usd_per_hour, limited.gpus) == (18.0, 10)
    _, why = single_layout_fleet(u1, target_rate=30, gpu_limits={"l40s": 4, "h100": None})
    assert why == "needs 6 l40s GPUs, 4 available"
    assert cheapest_fleet([u1, u2], target_rate=30, gpu_limits={"l40s": 4, "h100": 5}) is None


# -- units and their bounds ---------------------------------------------------------------------
def test_units_pair_layouts_in_lowest_terms_with_their_costs_and_ceilings() -> None:
    data = plan_data(
        mode="disaggregated", disaggregated={"prefill_replicas": [1, 2], "decode_replicas": [1, 2]}
    )
    spec, units, (h100,) = units_of(data, H100)
    # (1, 1), (1, 2), (2, 1); (2, 2) is two units of (1, 1)
    assert sorted((u.prefill_replicas, u.decode_replicas) for u in units) == [
        (1, 1),
        (1, 2),
        (2, 1),
    ]
    flow = traffic(spec)
    wide = flow.requests(flow.clamp(spec.search.max_prompts))
    prefill, decode = (h100.pool_ceiling(wide, phase=p) for p in ("prefill", "decode"))
    # the colocated ceiling is at most either pool's alone
    assert h100.ceiling <= min(prefill, decode) + 1e-9
    price = h100.usd_per_gpu_hour  # $3.78 (the spec's on-demand price)
    for u in units:
        p, d = u.prefill_replicas, u.decode_replicas
        assert u.ceiling == pytest.approx(min(p * prefill, d * decode))
        assert (u.gpus, u.usd_per_hour) == (p + d, pytest.approx((p + d) * price))
        assert u.gpus_by_hardware == (("h100_sxm", p + d),)
        groups = u.groups(spec, count=3)
        assert [(g.role, g.count) for g in groups] == [("prefill", 3 * p), ("decode", 3 * d)]
    keys = {(u.prefill_replicas, u.decode_replicas): u.key for u in units}
    assert keys[1, 2] == "1P+2D h100_sxm/vllm/none/tp1"


def test_unit_floors_and_ceiling_bound_the_simulation() -> None:
    data = plan_data(
        mode="disaggregated",
        slo={"ttft_ms": 100000, "tpot_ms": 100000},
        disaggregated={"prefill_replicas": 1, "decode_replicas": 1},
    )
    spec, (unit,), _ = units_of(data, H100)
    flow = traffic(spec)
    margin = spec.search.prescreen_margin
    for rate in (0.05, unit.ceiling / 2):
        run = scenario(spec, unit.groups(spec), flow.at(unit.num_prompts, rate), name="t")
        ttft, tpot = request_latencies(runner.run(run).sim.requests)
        assert np.all(ttft >= unit.floors.ttft_s * (1 - margin)), rate
        assert np.all(tpot >= unit.floors.tpot_s * (1 - margin)), rate
    burst = flow.at(unit.num_prompts, 1.0).model_copy(update={"request_rate": math.inf})
    result = runner.run(scenario(spec, unit.groups(spec), burst, name="t"))
    assert result.summary["request_throughput"] <= unit.ceiling


def test_pairs_whose_kv_caches_differ_make_no_unit() -> None:
    fp8_kv = Layout("h100_sxm", "vllm", None, "fp8", 1, 1)
    data = plan_data(
        mode="disaggregated", disaggregated={"prefill_replicas": 1, "decode_replicas": 1}
    )
    _, units, _ = units_of(data, H100, fp8_kv)
    assert sorted(u.key for u in units) == [
        "1P+1D h100_sxm/vllm/none/tp1",
        "1P+1D h100_sxm/vllm/none/tp1/kv-fp8",
    ]


# -- plans end to end ---------------------------------------------------------------------------
def test_a_tiny_disaggregated_plan() -> None:
    data = plan_data(
        mode="disaggregated",
        candidates={"hardware": ["h100_sxm"]},
        disaggregated={"prefill_replicas": 1, "decode_replicas": [1, 2]},
    )
    result = plan(PlanSpec.model_validate(data))
    c = result.candidates
    assert set(c["mode"]) == {"disaggregated"}
    ok = c[c["status"] == "feasible"]
    assert len(ok) >= 1 and ok["usd_per_hour"].is_monotonic_increasing
    assert (ok["max_rate"] <= ok["ceiling_rate"]).all()
    assert (ok["replicas"] == np.ceil(result.target_rate / ok["max_rate"])).all()
    fleet = result.fleet_summary
    assert fleet["found"] and fleet["verification"]["meets_slos"], fleet
    assert fleet["rate"] >= result.target_rate
    (row,) = result.fleet.to_dict("records")
    assert (
        row["mode"] == "disaggregated" and row["gpus"] == row["replicas"] * row["gpus_per_replica"]
    )
    json.dumps(result.as_json())


@pytest.mark.slow  # a plan over both kinds of fleet, each simulated (about 3-6 s)
def test_mode_any_ranks_both_kinds_and_keeps_fleets_apart(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = plan_data(
        mode="any",
        candidates={"hardware": ["h100_sxm"]},
        disaggregated={"prefill_replicas": 1, "decode_replicas": 1},
    )
    path = write_yaml(tmp_path / "plan.yaml", data)
    code, out, err = run_cli(capsys, "plan", str(path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    modes = {c["mode"] for c in doc["candidates"] if c["status"] == "feasible"}
    assert modes == {"colocated", "disaggregated"}
    fleet_modes = {r["mode"] for r in doc["fleet"]["replicas"]}
    assert len(fleet_modes) == 1  # one kind or the other
    feasible = [c for c in doc["candidates"] if c["status"] == "feasible" and c["available"]]
    assert doc["fleet"]["usd_per_hour"] <= min(c["usd_per_hour"] for c in feasible) + 1e-9
    code, out, _ = run_cli(capsys, "plan", str(path))
    assert code == 0 and "1P+1D h100_sxm/vllm/none/tp1" in out


def test_the_bundled_disaggregated_plan_loads() -> None:
    spec = load_plan(REPO / "scenarios" / "plan_disagg.yaml")
    assert spec.mode == "any" and spec.disaggregated.decode_replicas == [1, 2]
