"""A fleet power budget (`power_budget:`, serving.power): none, static and dynamic caps."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from clitools import one_line_error, run_cli

from simulator.runs import runner
from simulator.serving.power import capped_steps
from simulator.specs.hardware import with_power_cap
from simulator.specs.loader import load_hardware
from simulator.specs.scenario import Scenario

BUDGET = 2000.0  # W for 4 H100s (TDP 700 W each): 2800 W at full load
CAP = 400.0  # W per GPU under dynamic: 4 x 400 W fits the budget


def scenario(power: dict[str, Any] | None = None, **update: Any) -> Scenario:
    base: dict[str, Any] = {
        "name": "power-test",
        "model": "llama-3.1-8b",
        "replicas": [{"hardware": "h100_sxm", "count": 4}],
        "router": {"kind": "least_outstanding"},
        "workload": {
            "dataset": {"name": "random", "input_len": 2048, "output_len": 128},
            "num_prompts": 1600,
            "request_rate": 40,
        },
        "slo": {"ttft_ms": 1000, "tpot_ms": 50},
    }
    if power is not None:
        base["power_budget"] = power
    return Scenario.model_validate({**base, **update})


@cache
def result(policy: str | None) -> runner.RunResult:
    power = None
    if policy is not None:
        power = {"budget_w": BUDGET, "policy": policy, "cap_w": CAP}
        power |= {"reaction_s": 0.5, "window_s": 1.0, "sample_s": 0.25}
    return runner.run(scenario(power))


def test_policy_none_is_bit_identical_to_no_budget() -> None:
    plain, none = result(None), result("none")
    pd.testing.assert_frame_equal(plain.sim.requests, none.sim.requests)
    pd.testing.assert_frame_equal(plain.sim.steps, none.sim.steps)
    assert plain.sim.power is None and none.sim.power is not None
    assert none.summary["power_capped_share"] == 0.0
    # this load needs more than the budget: what the dynamic policy has to hold down
    assert none.summary["power_peak_window_w"] > BUDGET
    assert none.summary["power_over_budget_share"] > 0.2


def test_capped_steps_are_slower_than_uncapped() -> None:
    from simulator.costmodel.deployment import deployment
    from simulator.serving.group import replica_group
    from simulator.workload.requests import generate_requests

    hw = load_hardware("h100_sxm")
    base = scenario()
    requests = generate_requests(base.workload, rng=np.random.default_rng(0))
    timers = []
    for h in (hw, with_power_cap(hw, CAP)):
        dep = deployment(model=runner.load_model("llama-3.1-8b"), hardware=h, engine="vllm")
        group, _ = replica_group(dep, requests=requests)
        timers.append(group.timer)
    free, capped = timers
    prefill = [(2048, 0, True)] * 4
    assert capped.mixed(chunks=prefill, decode_contexts=[]) > 1.2 * free.mixed(
        chunks=prefill, decode_contexts=[]
    )
    decode_free = free.mixed(chunks=[], decode_contexts=[2048] * 64)
    assert capped.mixed(chunks=[], decode_contexts=[2048] * 64) >= decode_free
    # and the run: capping the whole fleet (static) lengthens the requests' latencies
    assert result("static").summary["mean_ttft_ms"] > result("none").summary["mean_ttft_ms"]


def longest_run(over: np.ndarray) -> int:
    best = run = 0
    for flag in over:
        run = run + 1 if flag else 0
        best = max(best, run)
    return best


def test_dynamic_holds_the_draw_to_the_budget_within_its_stated_overshoot() -> None:
    none, dynamic = result("none"), result("dynamic")
    spec = dynamic.scenario.power_budget
    assert spec is not None and 4 * CAP <= BUDGET
    frame = dynamic.sim.power
    assert frame is not None
    # the policy's bound: window_s + replicas x (reaction_s + sample_s) per excursion
    bound_s = spec.window_s + 4 * (spec.reaction_s + spec.sample_s)
    limit = math.ceil(bound_s / spec.sample_s)
    assert longest_run(frame["draw_w"].to_numpy() > BUDGET) <= limit
    assert none.sim.power is not None  # uncontrolled, the same load breaks it
    assert longest_run(none.sim.power["draw_w"].to_numpy() > BUDGET) > limit
    # a capped GPU draws at most the cap, an uncapped one at most its TDP (700 W)
    capped = frame["capped_replicas"]
    assert capped.max() >= 1
    assert (frame["draw_w"] <= capped * CAP + (4 - capped) * 700.0 + 1e-6).all()
    assert frame.loc[capped >= 1, "draw_w"].max() < 4 * 700.0
    s = dynamic.summary
    assert 0 < s["power_capped_share"] < 1  # caps come and go with the load
    assert s["power_over_budget_share"] < none.summary["power_over_budget_share"]


def test_static_caps_every_gpu_at_an_even_share() -> None:
    s = result("static").summary
    assert s["power_cap_w"] == BUDGET / 4 and s["power_capped_share"] == pytest.approx(1.0)
    assert s["power_peak_draw_w"] <= BUDGET + 1e-6


def test_cli_power_budget_flag_and_power_csv(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: p\nmodel: llama-3.1-8b\nreplicas: [{hardware: h100_sxm, count: 2}]\n"
        "workload: {dataset: {name: random, input_len: 1024, output_len: 32}, num_prompts: 40, "
        "request_rate: 20}\n"
    )
    out = tmp_path / "run"
    code, stdout, err = run_cli(
        capsys, "run", str(path), "--power-budget", "1000", "--power-policy", "dynamic",
        "--out", str(out), "--outputs", "requests",
    )  # fmt: skip
    assert code == 0, err
    assert "Power budget" in stdout and "Replica-time capped (%)" in stdout
    frame = pd.read_csv(out / "power.csv")
    assert list(frame.columns) == ["time_s", "draw_w", "window_w", "capped_replicas"]
    assert (frame["draw_w"] > 0).all()


@pytest.mark.parametrize(
    ("block", "words"),
    [
        ("{budget_w: -5}", "power_budget.budget_w"),
        ("{budget_w: 1000, policy: lots}", "power_budget.policy"),
        ("{budget_w: 1000, cap_threshold: 0.8, release_threshold: 0.9}", "release_threshold"),
        ("{budget_w: 1000, cap_threshold: 0.9, cap_all_threshold: 0.9}", "cap_all_threshold"),
        ("{budget_w: 100}", "power_budget.budget_w"),  # below the parked fleet
        ("{budget_w: 1000, cap_w: 50}", "power_budget.cap_w"),  # below idle
    ],
)
def test_bad_power_budget_exits_2_naming_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, block: str, words: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: p\nmodel: llama-3.1-8b\nreplicas: [{hardware: h100_sxm, count: 2}]\n"
        "workload: {dataset: {name: random, input_len: 64, output_len: 8}, num_prompts: 4}\n"
        f"power_budget: {block}\n"
    )
    err = one_line_error(capsys, "run", str(path))
    assert str(path) in err and words in err


def test_bad_power_budget_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(capsys, "run", "scenarios/quickstart.yaml", "--power-budget", "0")
    assert "--power-budget" in err


def test_capped_steps_are_priced_on_the_capped_hardware() -> None:
    static, dynamic = result("static"), result("dynamic")
    # every GPU capped at 500 W from the start: no step draws more
    assert static.energy["avg_power_w_per_gpu"] <= BUDGET / 4
    caps = dynamic.sim.power_caps
    assert caps is not None and len(caps)
    flags = capped_steps(dynamic.sim.steps, caps)
    assert 0 < flags.mean() < 1
    # a step is capped from the first cap event of its replica at or before its start
    first = caps.sort_values("time_s").iloc[0]
    rows = dynamic.sim.steps
    mine = (rows["replica"] == first["replica"]).to_numpy()
    before = mine & (rows["start_s"] < first["time_s"]).to_numpy()
    assert not flags[before].any()


def test_capped_steps_follows_each_replicas_events() -> None:
    steps = pd.DataFrame({"replica": [0, 0, 0, 1, 1], "start_s": [0.5, 1.5, 3.0, 0.5, 2.5]})
    caps = pd.DataFrame(
        {"time_s": [1.0, 2.0, 2.5], "replica": [0, 0, 1], "capped": [True, False, True]}
    )
    assert capped_steps(steps, caps).tolist() == [False, True, False, False, True]


def test_python_api_overrides_the_budget() -> None:
    import simulator

    small = scenario(
        workload={
            "dataset": {"name": "random", "input_len": 512, "output_len": 16},
            "num_prompts": 40,
            "request_rate": 40,
        }
    )
    res = simulator.run(small, power_budget_w=1600, power_policy="static")
    assert res.scenario.power_budget is not None
    assert res.summary["power_budget_w"] == 1600 and res.summary["power_cap_w"] == 400
    assert "power_budget_w" not in simulator.run(small).summary


def test_a_budget_refuses_partitioned_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    # a cap swaps a replica's step timer; a pd_partition replica runs a timer per stream
    err = one_line_error(
        capsys,
        "run",
        "scenarios/quickstart.yaml",
        "--power-budget",
        "5000",
        "--pd-partition",
        "dynamic:50",
    )
    assert "power_budget" in err and "pd_partition" in err


def _first_capped(priorities: list[int]) -> int:
    """The group of the replica the dynamic policy capped first, with two groups of two H100s
    at these power priorities (a round of caps is taken in order of priority)."""
    groups = [{"hardware": "h100_sxm", "count": 2, "power_priority": p} for p in priorities]
    power = {"budget_w": BUDGET, "policy": "dynamic", "cap_w": CAP}
    power |= {"reaction_s": 0.5, "window_s": 1.0, "sample_s": 0.25}
    sim = runner.run(scenario(power, replicas=groups)).sim
    caps = sim.power_caps
    first = caps[caps["capped"]].iloc[0]
    return int(first["replica"]) // 2


def test_power_priority_decides_which_group_is_capped_first() -> None:
    assert _first_capped([0, 0]) == 1  # equal: the later group first
    assert _first_capped([0, 5]) == 0  # the first group is the low-priority one
    assert _first_capped([1, 0]) == 1


def test_an_autoscaled_fleet_counts_only_its_replicas_that_are_on() -> None:
    """One H100 of up to four on at the start: the first samples draw at most one GPU's
    ceiling, where the fixed four draw at least their parked power; the fleet scales up
    under load, is capped under the budget and serves every request."""
    power = {"budget_w": 1800.0, "policy": "dynamic", "cap_w": 350.0}
    power |= {"reaction_s": 0.5, "window_s": 1.0, "sample_s": 0.25}
    scale = {"min_replicas": 1, "max_replicas": 4, "target": 16, "interval_s": 1}
    one = [{"hardware": "h100_sxm", "count": 1}]
    scaled = runner.run(scenario(power, replicas=one, autoscale=scale))
    fixed = runner.run(scenario(power))  # four H100 throughout
    ceiling = load_hardware("h100_sxm").power.ceiling_w
    parked = load_hardware("h100_sxm").power.between_steps_w
    assert scaled.sim.power is not None and fixed.sim.power is not None
    assert scaled.sim.power["draw_w"].iloc[0] <= ceiling + 1e-6
    assert fixed.sim.power["draw_w"].iloc[0] >= 4 * parked - 1e-6
    s = scaled.summary
    assert s["completed"] == 1600 and s["fleet_replicas_peak"] > 1
    assert s["power_capped_share"] > 0 and "fleet_gpu_hours" in s


def _first_round(**thresholds: float) -> list[int]:
    """The replicas of the dynamic policy's first round of caps, two groups of two H100s, the
    second at a higher power priority."""
    groups = [{"hardware": "h100_sxm", "count": 2, "power_priority": p} for p in (0, 5)]
    power = {"budget_w": BUDGET, "policy": "dynamic", "cap_w": CAP} | thresholds
    power |= {"reaction_s": 0.5, "window_s": 1.0, "sample_s": 0.25}
    caps = runner.run(scenario(power, replicas=groups)).sim.power_caps
    capped = caps[caps["capped"]]
    return sorted(capped[capped["time_s"] == capped["time_s"].min()]["replica"].tolist())


def test_polca_second_threshold_caps_every_replica_at_once() -> None:
    """Above cap_all_threshold x budget a round caps the whole fleet, the high-priority group
    too; below it (or without it) a round caps the low-priority replicas the estimate needs."""
    assert _first_round() == [0, 1]  # the low-priority group alone
    assert _first_round(cap_all_threshold=0.97) == [0, 1, 2, 3]
    # a second threshold the draw never reaches changes nothing
    assert _first_round(cap_all_threshold=1.0) == [0, 1]


def _disagg(power: dict[str, Any] | None, priorities: tuple[int, int] = (0, 0)) -> runner.RunResult:
    """scenarios/disagg_h100.yaml (2 prefill replicas of 2 H100s, 1 decode replica of 4),
    its first 150 requests, with `power` as its budget and these group priorities."""
    from simulator.specs.scenario import load_scenario

    data = load_scenario("scenarios/disagg_h100.yaml").model_dump(mode="json", exclude_unset=True)
    data["replicas"] = [
        dict(g, power_priority=p) for g, p in zip(data["replicas"], priorities, strict=True)
    ]
    data["workload"]["num_prompts"] = 150
    if power is not None:
        data["power_budget"] = power
    return runner.run(Scenario.model_validate(data))


def _capped_s(result: runner.RunResult, replica: int) -> float:
    """Seconds `replica` spent capped, from its cap events to the last sample."""
    caps = result.sim.power_caps
    end = float(result.sim.power["time_s"].iloc[-1])
    total, since = 0.0, None
    for _, event in caps[caps["replica"] == replica].iterrows():
        if event["capped"] and since is None:
            since = float(event["time_s"])
        elif not event["capped"] and since is not None:
            total, since = total + float(event["time_s"]) - since, None
    return total + (end - since if since is not None else 0.0)


def test_a_budget_covers_both_pools_of_a_disaggregated_fleet() -> None:
    """Sampling alone changes nothing; dynamic caps reach the prefill and the decode replicas
    and keep the windowed draw near the budget; capped prefill stretches TTFT, decode barely
    moves; the decode group's higher power priority spares it."""
    plain = _disagg(None)
    none = _disagg({"budget_w": 2600, "policy": "none"})
    pd.testing.assert_frame_equal(plain.sim.requests, none.sim.requests)
    pd.testing.assert_frame_equal(plain.sim.steps, none.sim.steps)
    assert none.summary["power_peak_window_w"] > 2600  # what the budget has to hold down
    budget = {"budget_w": 2600, "policy": "dynamic", "cap_w": 320}
    capped = _disagg(budget)
    assert set(capped.sim.power_caps["replica"]) == {0, 1, 2}  # both pools
    assert capped.summary["power_capped_share"] > 0.2
    assert capped.summary["mean_ttft_ms"] > plain.summary["mean_ttft_ms"]
    assert capped.summary["mean_tpot_ms"] == pytest.approx(plain.summary["mean_tpot_ms"], rel=0.05)
    assert capped.energy["energy_per_output_token_j"] < plain.energy["energy_per_output_token_j"]
    spared = _disagg(budget, priorities=(0, 5))
    assert _capped_s(spared, 2) < _capped_s(capped, 2)
