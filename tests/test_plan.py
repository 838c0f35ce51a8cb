"""`llmsim plan`: the fleet integer program, the rate search, the analytical pre-screen, a
tiny end-to-end plan, and the command line."""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from clitools import run_cli
from factories import plan_data, request_latencies, write_yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from simulator.errors import SpecError
from simulator.planning.fleet import (
    FleetOption,
    cheapest_fleet,
    replacement,
    single_layout_fleet,
)
from simulator.planning.layouts import Layout, Prepared, prepare, scenario, traffic
from simulator.planning.plan import PlanResult, plan
from simulator.planning.search import judge, search_max_rate
from simulator.planning.spec import PlanSpec, load_plan
from simulator.planning.tables import pareto_frontier, rank
from simulator.runs import runner
from simulator.specs import load_model
from simulator.workload.requests import generate_requests

FEW = settings(max_examples=40, deadline=None)
REPO = Path(__file__).resolve().parents[1]


# -- factories ----------------------------------------------------------------------------------
def option(key: str, rate: float, usd: float, *, hw: str = "", gpus: int = 1) -> FleetOption:
    return FleetOption(key, hw or key, gpus, rate, usd)


# -- the fleet ----------------------------------------------------------------------------------
A = option("A", 15.0, 4.0)  # $0.267 per req/s
B = option("B", 6.0, 1.5)  # $0.25 per req/s


def test_a_mix_beats_either_layout_alone() -> None:
    # Target 20: A alone needs 2 ($8.00, 30 req/s), B alone 4 ($6.00, 24 req/s); one of each
    # covers 21 req/s for $5.50, and nothing cheaper covers 20 (A + B is the only pair under
    # $6 reaching it: 3 B = 18, A = 15).
    fleet = cheapest_fleet([A, B], target_rate=20)
    assert fleet is not None
    assert (fleet.replicas, fleet.usd_per_hour, fleet.rate, fleet.gpus) == (
        {"A": 1, "B": 1},
        5.5,
        21,
        2,
    )
    assert single_layout_fleet(A, target_rate=20)[0].usd_per_hour == 8.0
    assert single_layout_fleet(B, target_rate=20)[0].usd_per_hour == 6.0


def test_gpu_limits_are_respected() -> None:
    # Target 30 unlimited: 5 B for $7.50 (A2 $8, A1+B3 $8.50). With 2 GPUs of B's type:
    # A1+B2 reaches only 27, so 2 A for $8.00.
    assert cheapest_fleet([A, B], target_rate=30).replicas == {"B": 5}  # type: ignore[union-attr]
    limited = cheapest_fleet([A, B], target_rate=30, gpu_limits={"B": 2})
    assert limited is not None and limited.replicas == {"A": 2}
    # Two-GPU replicas count two GPUs each against the limit.
    wide = option("W", 16.0, 3.0, hw="gpu", gpus=2)
    narrow = option("N", 5.0, 2.0, hw="gpu")
    capped = cheapest_fleet([wide, narrow], target_rate=30, gpu_limits={"gpu": 4})
    assert capped is not None and capped.replicas == {"W": 2} and capped.gpus == 4
    assert cheapest_fleet([wide, narrow], target_rate=40, gpu_limits={"gpu": 4}) is None
    alone, why = single_layout_fleet(B, target_rate=30, gpu_limit=2)
    assert alone.replicas == {"B": 5} and why == "needs 5 B GPUs, 2 available"


def test_replica_ranges_and_exclusions() -> None:
    # At least two replicas of any layout used: A+B is out; 4 B ($6) beats 2 A ($8).
    assert cheapest_fleet([A, B], target_rate=20, min_replicas=2).replicas == {"B": 4}  # type: ignore[union-attr]
    # At most one replica per layout: A+B is the only fleet reaching 20.
    assert cheapest_fleet([A, B], target_rate=20, max_replicas=1).replicas == {"A": 1, "B": 1}  # type: ignore[union-attr]
    assert cheapest_fleet([A, B], target_rate=25, max_replicas=1) is None
    # A fleet that failed its check is excluded with every fleet that has no more of anything.
    again = cheapest_fleet([A, B], target_rate=20, exclude=[{"A": 1, "B": 1}])
    assert again is not None and again.replicas == {"B": 4}


def test_cost_ties_go_to_more_capacity() -> None:
    fleet = cheapest_fleet([option("X", 10.0, 2.0), option("Y", 12.0, 2.0)], target_rate=10)
    assert fleet is not None and fleet.replicas == {"Y": 1}


options_st = st.lists(
    st.tuples(st.integers(1, 20), st.integers(1, 12), st.integers(1, 2)),
    min_size=1,
    max_size=3,
)


@FEW
@given(options_st, st.integers(1, 40), st.integers(1, 3), st.booleans())
def test_the_program_matches_brute_force(
    raw: list[tuple[int, int, int]], target: int, min_replicas: int, limit_first: bool
) -> None:
    opts = [option(f"o{i}", r, c, hw=f"h{i}", gpus=g) for i, (r, c, g) in enumerate(raw)]
    limits = {"h0": 4} if limit_first else {}
    best = math.inf
    for counts in itertools.product(*(range(0, math.ceil(target / o.rate) + 4) for o in opts)):
        if any(0 < n < min_replicas for n in counts):
            continue
        if limit_first and counts[0] * opts[0].gpus_per_replica > 4:
            continue
        if sum(o.rate * n for o, n in zip(opts, counts, strict=True)) >= target:
            best = min(best, sum(o.usd_per_hour * n for o, n in zip(opts, counts, strict=True)))
    fleet = cheapest_fleet(opts, target_rate=target, gpu_limits=limits, min_replicas=min_replicas)
    if math.isinf(best):
        assert fleet is None
    else:
        assert fleet is not None and fleet.usd_per_hour == pytest.approx(best)
        assert fleet.rate >= target


@FEW
@given(options_st, st.integers(1, 40), st.integers(1, 30), st.integers(1, 30))
def test_a_replaced_layout_never_lowers_the_optimum(
    raw: list[tuple[int, int, int]], target: int, ceiling: int, cost: int
) -> None:
    """The pruning rule: a layout that `replacement` says is replaced by a known one cannot
    make the cheapest fleet cheaper, even running at its capacity ceiling."""
    opts = [option(f"o{i}", r, c) for i, (r, c, _) in enumerate(raw)]
    assume(any(replacement(o, rate_ceiling=ceiling, usd_per_hour=cost) for o in opts))
    without = cheapest_fleet(opts, target_rate=target)
    with_it = cheapest_fleet([*opts, option("L", ceiling, cost)], target_rate=target)
    assert without is not None and with_it is not None
    assert with_it.usd_per_hour == pytest.approx(without.usd_per_hour)


# -- the rate search ----------------------------------------------------------------------------
@FEW
@given(
    st.floats(0.5, 200.0),
    st.floats(0.05, 1.0),
    st.sampled_from([0.02, 0.05, 0.1]),
)
def test_bisection_finds_a_known_threshold(threshold: float, start_frac: float, tol: float) -> None:
    ceiling = 100.0
    tried: list[float] = []

    def feasible(rate: float) -> bool:
        tried.append(rate)
        return rate <= threshold

    out = search_max_rate(
        feasible,
        ceiling=ceiling,
        start=ceiling * start_frac,
        tolerance=tol,
        max_probes=30,
        min_rate=0.01,
    )
    assert out.converged
    assert all(r <= ceiling for r in tried) and len(out.probes) == len(tried)
    assert out.max_rate <= min(threshold, ceiling)  # only rates seen feasible are reported
    assert min(threshold, ceiling) <= out.max_rate * (1 + tol)


def test_the_search_gives_up_below_min_rate_and_respects_max_probes() -> None:
    out = search_max_rate(
        lambda r: False, ceiling=10.0, start=5.0, tolerance=0.05, max_probes=30, min_rate=0.1
    )
    assert out.max_rate == 0.0 and not out.converged
    assert [r for r, _ in out.probes] == [5.0, 2.5, 1.25, 0.625, 0.3125, 0.15625]
    capped = search_max_rate(
        lambda r: r < 3.3, ceiling=10.0, start=5.0, tolerance=1e-6, max_probes=4, min_rate=0.1
    )
    assert len(capped.probes) == 4 and 0 < capped.max_rate < 3.3 and not capped.converged


# -- judging one run ----------------------------------------------------------------------------
def test_judge_reads_percentiles_goodput_and_backlog() -> None:
    n = 100
    arrival = np.arange(n, dtype=float)
    ttft = np.where(np.arange(n) < 90, 0.1, 2.0)  # 10 slow first tokens
    frame = pd.DataFrame(
        {
            "arrival_s": arrival,
            "first_scheduled_s": arrival + 0.01,
            "first_token_s": arrival + ttft,
            "finish_s": arrival + ttft + 9 * 0.02,  # 10 tokens: TPOT 20 ms
            "output_tokens": 10,
        }
    )
    slo = PlanSpec.model_validate(
        {**plan_data(), "slo": {"ttft_ms": {"p": 50, "max": 500}, "tpot_ms": 25, "goodput": 0.85}}
    ).slo
    v = judge(frame, itl_s=[0.02], itl_weight=[9.0], slo=slo, max_queueing_ms=100)
    assert v.feasible, v.reason
    assert v.latency_ms["p50_ttft_ms"] == pytest.approx(100.0)
    assert v.latency_ms["p99_tpot_ms"] == pytest.approx(20.0)
    assert v.goodput_fraction == pytest.approx(0.9)
    assert v.ratios["goodput"] == pytest.approx(0.1 / 0.15)
    strict = slo.model_copy(update={"goodput": 0.95})
    v = judge(frame, itl_s=[0.02], itl_weight=[9.0], slo=strict, max_queueing_ms=100)
    assert not v.feasible and "goodput 90.0%" in v.reason
    # A queue that grows: the last quarter waits 1 s on average for the first step.
    late = frame.assign(first_scheduled_s=arrival + np.where(arrival >= 75, 1.0, 0.0))
    v = judge(late, itl_s=[0.02], itl_weight=[9.0], slo=slo, max_queueing_ms=500)
    assert not v.feasible and "does not keep up" in v.reason


# -- the pre-screen -----------------------------------------------------------------------------
def prepared(data: dict[str, Any], hardware: str, **layout: Any) -> Prepared:
    spec = PlanSpec.model_validate({**data, "candidates": {"hardware": [hardware]}})
    lay = Layout(hardware, "vllm", layout.get("q"), "auto", layout.get("tp", 1), 1)
    got = prepare(spec, lay, model=load_model(spec.model), flow=traffic(spec))
    assert isinstance(got, Prepared), got
    return got


@pytest.mark.parametrize(
    ("hardware", "q", "tp"), [("h100_sxm", None, 1), ("l40s", "fp8", 1), ("a100_sxm_80gb", None, 2)]
)
def test_floors_bound_every_simulated_request(hardware: str, q: str | None, tp: int) -> None:
    """The pre-screen prunes on per-request floors: each must lie below what the simulator
    gives that request, alone (a trickle) or under load (up to the capacity ceiling)."""
    data = plan_data(slo={"ttft_ms": 100000, "tpot_ms": 100000})
    p = prepared(data, hardware, q=q, tp=tp)
    spec = PlanSpec.model_validate(data)
    flow = traffic(spec)
    margin = spec.search.prescreen_margin
    for rate in (0.05, p.ceiling / 2, p.ceiling):
        run = scenario(spec, [p.layout.replica_group(spec)], flow.at(p.num_prompts, rate), name="t")
        ttft, tpot = request_latencies(runner.run(run).sim.requests)
        assert np.all(ttft >= p.floors.ttft_s * (1 - margin)), rate
        assert np.all(tpot >= p.floors.tpot_s * (1 - margin)), rate


def test_a_plans_sampling_prices_its_floors_and_simulations() -> None:
    """A plan's workload may sample (top-p, penalties): its step times, so its floors and
    the scenarios it simulates, carry the cost."""
    sampling = {"temperature": 0.8, "top_p": 0.95, "repetition_penalty": 1.1}
    data = plan_data()
    data["workload"] = {**data["workload"], "sampling": sampling}
    greedy, sampled = prepared(plan_data(), "h100_sxm"), prepared(data, "h100_sxm")
    assert np.all(sampled.floors.tpot_s > greedy.floors.tpot_s)
    spec = PlanSpec.model_validate(data)
    assert traffic(spec).at(sampled.num_prompts, 1.0).sampling.model_dump() == {
        "top_k": -1,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "logprobs": None,
        **sampling,
    }


@pytest.mark.parametrize("hardware", ["h100_sxm", "l40s"])
def test_the_ceiling_bounds_saturated_throughput(hardware: str) -> None:
    p = prepared(plan_data(), hardware)
    spec = PlanSpec.model_validate(plan_data())
    burst = traffic(spec).at(p.num_prompts, 1.0).model_copy(update={"request_rate": math.inf})
    result = runner.run(scenario(spec, [p.layout.replica_group(spec)], burst, name="t"))
    assert result.summary["request_throughput"] <= p.ceiling


def test_the_prescreen_prunes_only_what_the_simulator_rejects() -> None:
    """SLOs between the floor and a little above it: not pruned; below the floor: pruned, and
    the simulator, with each request alone, misses them too."""
    base = plan_data(slo={"ttft_ms": 100000})
    p = prepared(base, "l40s")
    floor_ms = float(np.percentile(p.floors.ttft_s, 99)) * 1000
    loose = plan_data(slo={"ttft_ms": floor_ms * 1.02})
    assert isinstance(prepared(loose, "l40s"), Prepared)
    tight = plan_data(slo={"ttft_ms": floor_ms / 1.2})
    spec = PlanSpec.model_validate(tight)
    lay = Layout("l40s", "vllm", None, "auto", 1, 1)
    reason = prepare(spec, lay, model=load_model(spec.model), flow=traffic(spec))
    assert isinstance(reason, str) and reason.startswith("hopeless: p99 TTFT")
    flow = traffic(spec)
    run = scenario(spec, [lay.replica_group(spec)], flow.at(p.num_prompts, 0.05), name="t")
    sim = runner.run(run).sim
    v = judge(
        sim.requests, itl_s=sim.itl_s, itl_weight=sim.itl_weight, slo=spec.slo, max_queueing_ms=1e9
    )
    assert not v.feasible


def test_layouts_that_cannot_run_are_pruned_with_the_reason() -> None:
    spec = PlanSpec.model_validate(plan_data(model="llama-3.1-70b"))
    flow, model = traffic(spec), load_model(spec.model)
    big = prepare(spec, Layout("l40s", "vllm", None, "auto", 1, 1), model=model, flow=flow)
    assert isinstance(big, str) and "does not fit" in big
    odd = prepare(spec, Layout("h100_sxm", "vllm", None, "auto", 3, 1), model=model, flow=flow)
    assert isinstance(odd, str) and "does not divide" in odd


# -- the plan file ------------------------------------------------------------------------------
def test_the_short_forms_of_a_plan() -> None:
    spec = PlanSpec.model_validate(
        plan_data(
            candidates={
                "hardware": ["h100_sxm", {"id": "l40s", "max_gpus": 4, "usd_per_hour": 1.5}],
                "quantization": ["none", "fp8"],
                "tensor_parallel_size": 2,
                "data_parallel_size": 8,
            }
        )
    )
    c = spec.candidates
    assert spec.slo.targets()["tpot"].p == 99 and spec.slo.targets()["tpot"].max == 60
    assert c.quantization == [None, "fp8"] and c.tensor_parallel_size == [2]
    assert (c.data_parallel_size.min, c.data_parallel_size.max) == (1, 8)
    assert c.hardware[1].max_gpus == 4 and spec.router.kind == "least_kv"


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"mode": "hybrid"}, "mode", "'colocated', 'disaggregated' or 'any'"),
        ({"workload": {"dataset": {"name": "sharegpt"}}}, "workload", "request_rate"),
        (
            {"workload": {"dataset": {"name": "sharegpt"}, "request_rate": 2, "num_prompts": 9}},
            "workload",
            "search picks",
        ),
        ({"slo": {"goodput": 0.9}}, "slo", "goodput needs"),
        ({"candidates": {"hardware": ["l40s", "l40s"]}}, "candidates.hardware", "twice"),
    ],
)
def test_malformed_plans_name_the_field(
    tmp_path: Path, change: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(SpecError) as err:
        load_plan(write_yaml(tmp_path / "plan.yaml", plan_data(**change)))
    assert err.value.field.startswith(field) and words in err.value.reason


def test_unknown_ids_are_errors_naming_the_plan_field(tmp_path: Path) -> None:
    bad = plan_data(candidates={"hardware": ["h100_sxm", "h999"]})
    with pytest.raises(SpecError) as err:
        load_plan(write_yaml(tmp_path / "plan.yaml", bad))
    assert (
        err.value.field == "candidates.hardware.1.id" and "unknown hardware id" in err.value.reason
    )
    with pytest.raises(SpecError, match=r"candidates\.engine\.0"):
        plan(PlanSpec.model_validate(plan_data(candidates={"hardware": "l40s", "engine": "nope"})))


def test_a_trace_replay_sets_the_target_and_scales_to_any_rate() -> None:
    spec = PlanSpec.model_validate(
        plan_data(
            workload={"dataset": {"name": "azure-conv"}, "arrival": "trace", "num_prompts": 300}
        )
    )
    flow = traffic(spec)
    replay = spec.workload.sample(num_prompts=300, request_rate=1.0)  # at the trace's own pace
    native = generate_requests(replay, rng=np.random.default_rng(0))
    assert flow.target_rate == pytest.approx(300 / native.arrival_s[-1])
    fast = generate_requests(flow.at(120, 7.0), rng=np.random.default_rng(0))
    assert 120 / fast.arrival_s[-1] == pytest.approx(7.0)


# -- end to end ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny() -> PlanResult:
    return plan(PlanSpec.model_validate(plan_data()))


def test_a_tiny_plan_ranks_cheapest_first(tiny: PlanResult) -> None:
    c = tiny.candidates
    ok = c[c["status"] == "feasible"]
    assert len(ok) == 2 and list(ok["rank"]) == [1, 2]
    assert ok["usd_per_million_output_tokens"].is_monotonic_increasing
    assert ok["usd_per_hour"].is_monotonic_increasing
    # $/M at the target is the fleet's cost per hour over the target's tokens per hour.
    first = ok.iloc[0]
    tokens_per_hour = tiny.target_rate * tiny.mean_output_tokens * 3600
    assert first["usd_per_million_output_tokens"] == pytest.approx(
        first["usd_per_hour"] / tokens_per_hour * 1e6
    )
    assert (ok["replicas"] == np.ceil(tiny.target_rate / ok["max_rate"])).all()
    assert (ok["slo_ratio"] <= 1).all() and (ok["max_rate"] <= ok["ceiling_rate"]).all()


def test_a_tiny_plan_has_a_checked_fleet_and_a_frontier(tiny: PlanResult) -> None:
    summary = tiny.fleet_summary
    assert summary["found"] and summary["rate"] >= tiny.target_rate
    assert summary["usd_per_hour"] <= tiny.candidates["usd_per_hour"].min()
    assert summary["verification"]["meets_slos"], summary["verification"]["reason"]
    front = tiny.pareto
    assert not front.empty and front["usd_per_million_output_tokens"].is_monotonic_increasing
    assert front[tiny.pareto_metric].is_monotonic_decreasing
    assert set(front["layout"]) <= set(tiny.probes.loc[tiny.probes["feasible"], "layout"])
    doc = tiny.as_json()
    assert {"target_rate", "candidates", "fleet", "pareto", "pareto_metric"} <= set(doc)
    json.dumps(doc)


def test_rank_puts_fleets_that_can_be_had_first() -> None:
    rows = pd.DataFrame(
        {
            "layout": ["cheap-but-limited", "dear", "mid-unconverged", "gone", "failed"],
            "status": ["feasible", "feasible", "feasible", "pruned", "infeasible"],
            "reason": ["needs 9 x GPUs, 4 available", "", "search stopped below 9 req/s", "x", "y"],
            "available": [False, True, True, None, None],
            "usd_per_hour": [1.0, 3.0, 2.0, None, None],
            "max_rate_usd_per_million_output_tokens": [0.1, 0.3, 0.2, None, None],
        }
    )
    ranked = rank(rows)
    assert list(ranked["layout"]) == [
        "mid-unconverged",
        "dear",
        "cheap-but-limited",
        "failed",
        "gone",
    ]
    assert list(ranked["rank"]) == [1, 2, 3, 0, 0]


def test_pareto_keeps_only_unbeaten_points() -> None:
    points = pd.DataFrame(
        {
            "layout": list("abcde"),
            "rate": [1.0] * 5,
            "feasible": [True, True, True, True, False],
            "cost": [1.0, 2.0, 3.0, 2.5, 0.5],
            "lat": [50.0, 40.0, 10.0, 45.0, 1.0],
        }
    )
    front = pareto_frontier(points, cost="cost", latency="lat")
    assert list(front["layout"]) == ["a", "b", "c"]


# -- the command line ---------------------------------------------------------------------------
def test_cli_plan_prints_writes_and_reports_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write_yaml(tmp_path / "plan.yaml", plan_data(candidates={"hardware": ["h100_sxm"]}))
    code, out, err = run_cli(capsys, "plan", str(path), "--out", str(tmp_path / "o"), "--json")
    # stderr is not a terminal: each stage and candidate as a plain line, with counts
    assert code == 0
    assert err.splitlines() == [
        "llmsim: plan: priced 1 layouts: 1 can run, 1 worth simulating colocated",
        "llmsim: plan: [1/1] h100_sxm/vllm/none/tp1: simulated, "
        + err.split("simulated, ")[1].rstrip("\n"),
    ]
    doc = json.loads(out)
    assert {"name", "target_rate", "candidates", "fleet", "pareto", "simulations"} <= set(doc)
    assert doc["candidates"][0]["status"] == "feasible"
    assert {p.name for p in (tmp_path / "o").iterdir()} >= {
        "plan.json",
        "candidates.csv",
        "pareto.csv",
    }
    code, out, err = run_cli(capsys, "plan", str(path))
    assert code == 0 and "Cheapest fleet" in out and "Candidates" in out


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"candidates": {"hardware": ["h999"]}}, "candidates.hardware.0.id: h999"),
        ({"mode": "hybrid"}, "mode: Input should be 'colocated', 'disaggregated' or 'any'"),
        # a model no candidate can hold: bad input, not "no layout met the SLOs"
        (
            {"model": "llama-3.1-405b"},
            "candidates: no candidate layout can run llama-3.1-405b; the largest, "
            "h100_sxm/vllm/none/tp1: does not fit",
        ),
    ],
)
def test_cli_plan_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, change: dict[str, Any], words: str
) -> None:
    path = write_yaml(tmp_path / "plan.yaml", plan_data(**change))
    code, out, err = run_cli(capsys, "plan", str(path))
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and "Traceback" not in err and words in err


def test_cli_plan_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "plan", "--schema")
    assert code == 0 and "candidates" in json.loads(out)["properties"]


def test_the_bundled_plan_loads() -> None:
    spec = load_plan(REPO / "scenarios" / "plan_chat.yaml")
    assert spec.workload.request_rate and len(spec.candidates.hardware) == 3


def test_the_solver_cannot_write_into_json_output(capfd: pytest.CaptureFixture[str]) -> None:
    # HiGHS prints some MIP diagnostics from C++ straight to file descriptor 1, which would
    # break `llmsim plan --json`; the fleet program silences the descriptor while it solves.
    from simulator.outputs import held_fd

    with held_fd(1):
        os.write(1, b"HighsMipSolverData::transformNewIntegerFeasibleSolution\n")
    print("after")
    out, _ = capfd.readouterr()
    assert out == "after\n"
