"""Plans with margin: the error-band margin, seeds, single-layout fleets, the scheduler-knob
search, and the named cases a plan must get right (`llmsim plan --confidence --seeds`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from clitools import run_cli
from factories import plan_data, write_yaml

from simulator.metrics import bands
from simulator.planning.layouts import enumerate_layouts
from simulator.planning.margins import plan_margin
from simulator.planning.plan import PlanResult, plan
from simulator.planning.report import save_plan
from simulator.planning.search import judge
from simulator.planning.spec import PlanSpec, load_plan
from simulator.planning.trials import Trial, needed, over_seeds
from simulator.report.build import write_report
from simulator.report.costfigures import cost_frontier
from simulator.runs import runner

REPO = Path(__file__).resolve().parents[1]
H100 = bands.target(hardware="h100_sxm", vendor="nvidia", engine="vllm")
L40S = bands.target(hardware="l40s", vendor="nvidia", engine="vllm")


def margin_on(**overrides: Any) -> dict[str, Any]:
    """The small plan of the factories, judged with the margin (and `overrides`)."""
    data = plan_data(**overrides)
    data["search"] = {**data["search"], "band_margin": True}
    return data


def nominal_verdicts(
    result: PlanResult, *, rate: float, seeds: range, num_prompts: int
) -> list[Any]:
    """The plan's fleet simulated at `rate` on other seeds, judged at the point prediction."""
    spec = result.spec
    verdicts = []
    for seed in seeds:
        run = result.fleet_scenario(rate=rate, num_prompts=num_prompts, seed=seed)
        sim = runner.run(run).sim
        verdicts.append(
            judge(
                sim.requests,
                itl_s=sim.itl_s,
                itl_weight=sim.itl_weight,
                slo=spec.slo,
                max_queueing_ms=spec.search.max_queueing_ms,
            )
        )
    return verdicts


# -- the margin ---------------------------------------------------------------------------------
def test_the_margin_is_the_upper_edge_of_the_band_and_never_below_one() -> None:
    rows = bands.load_residuals()
    m = bands.margin([H100], confidence=0.9)
    band = bands.group_band(
        rows,
        family="ttft",
        regime="online",
        device_family="nvidia",
        engine_family="vllm",
        coverage=0.8,
        model_family="dense",
    )
    assert band is not None and m.latency["ttft"] == pytest.approx(max(1.0, math.exp(band.high)))
    assert m.backed and m.note is None and "e2e_serving" in m.source
    assert all(f >= 1.0 for f in [m.capacity, *m.scale().values()])
    # E2EL takes the hull of TTFT and TPOT; ITL takes TPOT's; nothing below the capacity's
    assert m.latency["e2el"] == max(m.latency["ttft"], m.latency["tpot"])
    assert m.latency_factor("itl") == max(m.latency["tpot"], m.capacity)


def test_more_confidence_never_narrows_the_margin() -> None:
    low, high = (bands.margin([H100], confidence=c) for c in (0.7, 0.95))
    assert high.capacity >= low.capacity
    assert all(high.scale()[k] >= low.scale()[k] for k in bands.LATENCY_FAMILIES)


def test_an_unbacked_setup_takes_the_pooled_bands_and_says_so() -> None:
    m = bands.margin([L40S], confidence=0.9)
    assert not m.backed and "l40s under vllm" in (m.note or "")
    pooled = bands.margin([L40S], confidence=0.9, note="why")
    assert pooled.capacity == m.capacity and pooled.note == "why"
    both = bands.worst([bands.margin([H100], confidence=0.9), m])
    assert both.capacity == max(m.capacity, bands.margin([H100], confidence=0.9).capacity)
    assert both.note == m.note
    with pytest.raises(ValueError, match="confidence"):
        bands.margin([H100], confidence=0.5)


def test_a_plan_without_margin_has_none() -> None:
    spec = PlanSpec.model_validate(plan_data())
    assert plan_margin(spec, []).trivial


def test_judge_scales_latencies_and_waits() -> None:
    requests = pd.DataFrame(
        {
            "arrival_s": [0.0, 1.0],
            "first_scheduled_s": [0.0, 1.1],
            "first_token_s": [0.1, 1.2],
            "finish_s": [1.1, 2.2],
            "output_tokens": [11, 11],
        }
    )
    slo = PlanSpec.model_validate(plan_data(slo={"ttft_ms": 250, "tpot_ms": 150})).slo
    kw: dict[str, Any] = {"itl_s": [0.1], "itl_weight": [1.0], "slo": slo}
    plain = judge(requests, max_queueing_ms=150, **kw)
    assert plain.feasible
    slow = judge(
        requests, max_queueing_ms=150, scale={"ttft": 2.0, "tpot": 1.2}, wait_scale=2.0, **kw
    )
    assert slow.latency_ms["p99_ttft_ms"] == pytest.approx(2 * plain.latency_ms["p99_ttft_ms"])
    assert slow.latency_ms["p99_tpot_ms"] == pytest.approx(1.2 * plain.latency_ms["p99_tpot_ms"])
    assert not slow.feasible and "TTFT" in slow.reason
    waits = judge(requests, max_queueing_ms=150, wait_scale=2.0, **kw)
    assert waits.late_queueing_ms == pytest.approx(2 * plain.late_queueing_ms)
    assert not waits.feasible and "keep up" in waits.reason


# -- seeds --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("confidence", "seeds", "need"), [(0.9, 5, 5), (0.8, 5, 4), (0.9, 20, 18)])
def test_the_seeds_needed(confidence: float, seeds: int, need: int) -> None:
    assert needed(confidence, seeds) == need


def test_over_seeds_stops_once_the_count_cannot_be_reached() -> None:
    results = {0: True, 1: False, 2: False, 3: True, 4: True}
    ran: list[int] = []

    def one(seed: int) -> Any:
        ran.append(seed)
        verdict = type("V", (), {"feasible": results[seed]})()
        return Trial(seed, verdict, None, 1.0)

    trials, met = over_seeds(one, list(results), need=4)
    assert ran == [0, 1, 2] and met == 1 and len(trials) == 3  # 1 + 2 left < 4
    ran.clear()
    trials, met = over_seeds(one, list(results), need=0)
    assert ran == list(results) and met == 3


# -- plans --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def point() -> PlanResult:
    return plan(PlanSpec.model_validate(plan_data(candidates={"hardware": ["h100_sxm"]})))


@pytest.fixture(scope="module")
def margined() -> PlanResult:
    data = margin_on(candidates={"hardware": ["h100_sxm"]}, seeds=3)
    return plan(PlanSpec.model_validate(data))


def test_the_margin_credits_less_rate_and_simulates_it_faster(
    point: PlanResult, margined: PlanResult
) -> None:
    def row(r: PlanResult) -> dict[str, Any]:
        return dict(r.candidates.iloc[0])

    a, b = row(point), row(margined)
    assert b["margin_capacity"] > 1 and a["margin_capacity"] == 1
    assert b["max_rate"] < a["max_rate"]
    probes = margined.probes
    assert np.allclose(probes["simulated_rate"], probes["rate"] * b["margin_capacity"])
    assert margined.fleet_summary["usd_per_hour"] >= point.fleet_summary["usd_per_hour"]


def test_a_plan_json_names_attainment_binding_slo_headroom_and_bands(
    margined: PlanResult,
) -> None:
    doc = json.loads(json.dumps(margined.as_json()))
    fleet = doc["fleet"]
    assert doc["confidence"] == 0.9 and doc["seeds"] == 3
    assert fleet["slo_attainment"] == 1.0 and fleet["verification"]["seeds"] == 3
    assert fleet["binding_slo"] in {"ttft", "tpot"} and 0 < fleet["binding_slo_ratio"] <= 1
    assert fleet["headroom"] == pytest.approx(fleet["rate"] / doc["target_rate"] - 1)
    assert fleet["headroom"] >= 0
    assert fleet["margin"]["capacity_factor"] > 1 and "e2e_serving" in fleet["margin"]["source"]
    prediction = fleet["prediction"]
    low, high = prediction["p99_ttft_ms_interval"]
    assert low < high and prediction["interval_coverage"] == 0.8
    # the edge is at least as slow as the point prediction
    assert fleet["verification"]["p99_ttft_ms"] >= prediction["p99_ttft_ms"]
    # the layout in the fleet had its rate checked on every seed
    first = doc["candidates"][0]
    assert first["seeds_met"] == 3 and first["seeds"] == 3
    assert doc["simulations"] > len(margined.probes)


def test_the_plan_report_shows_the_margin_the_backing_and_the_fleets_band(
    margined: PlanResult, tmp_path: Path
) -> None:
    html = write_report(save_plan(margined, tmp_path / "plan")).read_text()
    fleet = margined.fleet_summary
    assert f"meets the SLOs in {fleet['verification']['seeds_met']} of 3 seeds" in html
    assert f"Binding SLO: {fleet['binding_slo']} at" in html and "headroom +" in html
    assert "Point prediction at the target: p99 TTFT" in html and "(bands at 80%)" in html
    assert "What backs each device" in html and "e2e_serving" in html
    assert "chosen fleet (point prediction and its error band)" in html


def test_the_chosen_fleet_is_drawn_with_its_band_as_an_error_bar() -> None:
    probes = pd.DataFrame(
        {"layout": ["a"], "feasible": ["True"], "usd_per_million_output_tokens": [1.0]}
        | {"p99_tpot_ms": [20.0]}
    )
    fleet = {"x": 20.0, "band": [18.0, 29.0], "y": 1.5}
    star = cost_frontier(probes, metric="p99_tpot_ms", fleet=fleet).data[-1]
    assert (star.x[0], star.y[0], star.marker.symbol) == (20.0, 1.5, "star")
    assert list(star.error_x.array) == [9.0] and list(star.error_x.arrayminus) == [2.0]
    bare = cost_frontier(probes, metric="p99_tpot_ms", fleet=fleet | {"band": None}).data[-1]
    assert bare.error_x.array is None and "error band" not in bare.name


def test_every_layouts_rate_can_be_checked_over_the_seeds() -> None:
    data = margin_on(seeds=2)
    data["search"]["seed_check"] = "all"
    result = plan(PlanSpec.model_validate(data))
    feasible = result.candidates[result.candidates["status"] == "feasible"]
    assert len(feasible) == 2 and (feasible["seeds"] == 2).all()
    assert (feasible["max_rate"] <= feasible["searched_rate"]).all()


def test_a_single_layout_plan_uses_one_replica_shape() -> None:
    data = plan_data(
        workload={
            "dataset": {"name": "random", "input_len": 512, "output_len": 64, "range_ratio": 0.5},
            "request_rate": 30,
        },
        candidates={"hardware": ["h100_sxm", "l40s"]},
        single_layout=True,
    )
    result = plan(PlanSpec.model_validate(data))
    assert result.fleet_summary["found"] and len(result.fleet) == 1


def test_scheduler_knobs_are_searched_as_part_of_the_layout() -> None:
    data = plan_data(
        candidates={
            "hardware": ["h100_sxm"],
            "scheduler": {"max_num_seqs": 64},
            "scheduler_search": {"max_num_batched_tokens": [256, 2048], "chunked_prefill": True},
        }
    )
    spec = PlanSpec.model_validate(data)
    layouts = enumerate_layouts(spec)
    assert [lay.key for lay in layouts] == [
        "h100_sxm/vllm/none/tp1/tokens256/chunked",
        "h100_sxm/vllm/none/tp1/tokens2048/chunked",
    ]
    group = layouts[0].replica_group(spec)
    assert group.scheduler.max_num_batched_tokens == 256 and group.scheduler.max_num_seqs == 64
    result = plan(spec)
    rows = result.candidates.set_index("layout")
    assert list(rows.loc[[lay.key for lay in layouts], "max_num_batched_tokens"]) == [256, 2048]
    # a 256-token budget splits every prompt over several steps, each paying the step's fixed
    # costs: it can never beat the 2048-token one, and is dropped (or ranked below it) saying so
    small, large = rows.loc[layouts[0].key], rows.loc[layouts[1].key]
    assert large["rank"] == 1
    assert small["status"] == "feasible" or str(small["reason"]).startswith(
        f"dominated by {layouts[1].key}"
    )


def test_cli_plan_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "plan.yaml", margin_on(candidates={"hardware": ["h100_sxm"]}))
    code, out, err = run_cli(capsys, "plan", str(path), "--seeds", "2", "--confidence", "0.8")
    assert code == 0, err
    assert "80% edge of the error bands" in out and "in 2 of 2 seeds" in out
    assert "binding SLO" in out and "point prediction" in out
    for flag, value, words in [
        ("--confidence", "0.3", "--confidence: Input should be greater than 0.5"),
        ("--seeds", "0", "--seeds: Input should be greater than or equal to 1"),
    ]:
        code, out, err = run_cli(capsys, "plan", str(path), flag, value)
        assert code == 2 and out == "" and len(err.splitlines()) == 1 and words in err, err


# -- the named cases ----------------------------------------------------------------------------
@pytest.mark.slow
def test_8b_on_one_h100_sustains_its_planned_rate_on_every_seed() -> None:
    """Llama-3.1-8B on one H100, 1000 tokens in / 200 out, p99 TTFT < 1 s: the plan's
    sustainable rate holds on seeds it never simulated (the point-estimate planner once
    reported a rate at which a longer run collapsed)."""
    data = {
        "name": "one-h100",
        "model": "llama-3.1-8b",
        "workload": {
            "dataset": {"name": "random", "input_len": 1000, "output_len": 200},
            "request_rate": 20,
        },
        "slo": {"ttft_ms": {"p": 99, "max": 1000}},
        "candidates": {"hardware": ["h100_sxm"]},
    }
    result = plan(PlanSpec.model_validate(data))
    row = result.candidates.iloc[0]
    assert row["seeds_met"] >= needed(0.9, 5)
    rate = float(row["max_rate"])
    verdicts = nominal_verdicts(result, rate=rate, seeds=range(100, 110), num_prompts=1500)
    assert all(v.feasible for v in verdicts), [v.reason for v in verdicts]
    worst = max(v.latency_ms["p99_ttft_ms"] for v in verdicts)
    assert worst < 1000


@pytest.mark.slow
def test_70b_fp8_on_8_h100_chooses_a_fleet_that_meets_the_slos_over_seeds() -> None:
    """Llama-3.1-70B fp8 on at most 8 H100s, 4000 in / 300 out, colocated or disaggregated
    on the same footing: the fleet chosen meets its SLOs on seeds the plan never used."""
    data = {
        "name": "70b-pd",
        "model": "llama-3.1-70b",
        "mode": "any",
        "workload": {
            "dataset": {"name": "random", "input_len": 4000, "output_len": 300},
            "request_rate": 3,
        },
        "slo": {"ttft_ms": {"p": 99, "max": 2000}, "tpot_ms": {"p": 99, "max": 50}},
        "candidates": {
            "hardware": [{"id": "h100_sxm", "max_gpus": 8}],
            "quantization": "fp8",
            "tensor_parallel_size": [2, 4],
        },
        "disaggregated": {"prefill_replicas": [1, 2, 3], "decode_replicas": [1], "max_units": 6},
        "search": {"duration_s": 40, "max_probes": 6},
    }
    result = plan(PlanSpec.model_validate(data))
    fleet = result.fleet_summary
    assert fleet["found"] and fleet["verification"]["meets_slos"]
    assert fleet["gpus"] <= 8 and fleet["slo_attainment"] >= 0.9
    verdicts = nominal_verdicts(
        result, rate=result.target_rate, seeds=range(50, 56), num_prompts=150
    )
    assert all(v.feasible for v in verdicts), [v.reason for v in verdicts]


@pytest.mark.slow
def test_the_bundled_chat_plans_fleet_meets_its_slos_in_20_seeds() -> None:
    result = plan(load_plan(REPO / "scenarios" / "plan_chat.yaml"))
    assert result.fleet_summary["found"]
    n = result.fleet_summary["verification"]["num_prompts"]
    verdicts = nominal_verdicts(
        result, rate=result.target_rate, seeds=range(1000, 1020), num_prompts=n
    )
    met = sum(v.feasible for v in verdicts)
    assert met >= 19, [v.reason for v in verdicts if not v.feasible]
