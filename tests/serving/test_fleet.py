"""Fleet control: prefix-affinity and length routing, and autoscaling a replica group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clitools import run_cli

from simulator.runs import runner
from simulator.specs.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]


def scenario(**update: Any) -> Scenario:
    base: dict[str, Any] = {
        "name": "fleet-test",
        "model": "llama-3.1-8b",
        "replicas": [{"hardware": "h100_sxm"}],
        "workload": {
            "dataset": {"name": "random", "input_len": 256, "output_len": 64},
            "num_prompts": 10,
        },
    }
    return Scenario.model_validate({**base, **update})


def chat(kind: str) -> runner.RunResult:
    """Multi-turn chats on 4 replicas: each turn resends its conversation so far."""
    return runner.run(
        scenario(
            replicas=[{"hardware": "h100_sxm", "count": 4, "enable_prefix_caching": True}],
            router={"kind": kind},
            workload={
                "dataset": {"name": "sharegpt"},
                "num_prompts": 240,
                "request_rate": 4,
                "prefix": {"tokens": 500},
                "sessions": {"turns": 4, "think_time_s": 2},
            },
        )
    )


def test_prefix_affinity_raises_the_cache_hit_rate_over_round_robin() -> None:
    spread = chat("round_robin").summary["prefix_cache_hit_rate"]
    affine = chat("prefix_affinity").summary["prefix_cache_hit_rate"]
    assert affine > spread + 0.1


def test_length_routing_sends_long_requests_to_the_long_group() -> None:
    result = runner.run(
        scenario(
            replicas=[{"hardware": "a100_sxm_80gb", "count": 2}, {"hardware": "h100_sxm"}],
            router={"kind": "length", "length_threshold": 1500, "long_group": 1},
            workload={"dataset": {"name": "azure-code"}, "num_prompts": 300, "request_rate": 10},
        )
    )
    rows = result.sim.requests
    long = rows["prompt_tokens"] + rows["output_tokens"] > 1500
    assert long.any() and (~long).any()
    assert set(rows.loc[long, "replica"]) == {2}  # group 1's one replica comes after group 0's
    assert set(rows.loc[~long, "replica"]) <= {0, 1}


def diurnal_trace(folder: Path) -> Path:
    """A day compressed to 200 s: the arrival rate follows sin^4, from 1 request/s at night
    to 25 at noon (thinned deterministically: arrivals where the rate's integral crosses an
    integer)."""
    times = np.linspace(0, 200, 200_001)
    rate = 1 + 24 * np.sin(np.pi * times / 200) ** 4
    cumulative = np.cumsum(rate) * (times[1] - times[0])
    arrivals = times[np.searchsorted(cumulative, np.arange(1, int(cumulative[-1])))]
    path = folder / "diurnal.csv"
    rows = [f"{t:.4f},1024,256" for t in arrivals]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def diurnal(folder: Path, min_replicas: int, count: int) -> runner.RunResult:
    """The diurnal trace on H100 replicas scaled between `min_replicas` and 3."""
    return runner.run(
        scenario(
            replicas=[{"hardware": "h100_sxm", "count": count}],
            router={"kind": "least_outstanding"},
            autoscale={
                "min_replicas": min_replicas,
                "max_replicas": 3,
                "target": 8,
                "interval_s": 2,
                "scale_down_delay_s": 10,
            },
            workload={
                "dataset": {"name": "trace", "path": str(diurnal_trace(folder))},
                "arrival": "trace",
            },
            slo={"ttft_ms": 2000},
        )
    )


def test_autoscaling_scales_up_within_max_and_pays_the_load_time(tmp_path: Path) -> None:
    result = diurnal(tmp_path, 1, 1)
    fleet, rows, s = result.sim.fleet, result.sim.requests, result.summary
    assert fleet is not None
    on = fleet["serving"] + fleet["loading"] + fleet["draining"]
    assert on.max() <= 3
    assert s["fleet_replicas_peak"] == 3 and s["fleet_scale_ups"] >= 2
    load = s["fleet_load_s"]
    assert load > 1.0  # 16 GB from NVMe at 7 GB/s
    started = fleet.loc[fleet["loading"].diff() > 0, "time_s"]
    first_load = float(started.iloc[0])
    for replica in (1, 2):  # added replicas: nothing arrives before their load is over
        mine = rows[rows["replica"] == replica]
        assert len(mine) and mine["arrival_s"].min() >= first_load + load
    assert 0 <= s["slo_attainment"] <= 1
    assert fleet["draining"].max() >= 1  # after the peak it scales down again
    assert int(fleet["serving"].iloc[-1]) == 1


def test_weights_load_faster_from_host_memory_than_from_nvme() -> None:
    result = runner.run(scenario())
    dep, plan = result.deployments[0], result.memory[0]
    host = dep.hardware.host
    nvme = runner.load_seconds(dep, plan, "storage")
    assert nvme == pytest.approx(plan.weights_bytes / host.nvme_bw_bytes_per_s)
    link = host.pcie_bw_bytes_per_s * dep.hardware.efficiency.host_link_fraction
    assert runner.load_seconds(dep, plan, "host") == pytest.approx(plan.weights_bytes / link)
    assert runner.load_seconds(dep, plan, "host") < nvme


def test_kv_usage_autoscaling_scales_with_the_kv_held(tmp_path: Path) -> None:
    result = runner.run(
        scenario(
            autoscale={
                "min_replicas": 1,
                "max_replicas": 3,
                "metric": "kv_usage",
                "target": 0.02,
                "interval_s": 2,
            },
            workload={
                "dataset": {"name": "trace", "path": str(diurnal_trace(tmp_path))},
                "arrival": "trace",
            },
        )
    )
    fleet = result.sim.fleet
    assert fleet is not None and fleet["serving"].max() > 1
    assert (fleet["serving"] + fleet["loading"] + fleet["draining"]).max() <= 3


def test_a_fixed_fleet_uses_more_gpu_hours_than_an_autoscaled_one(tmp_path: Path) -> None:
    scaled, fixed = diurnal(tmp_path, 1, 1).summary, diurnal(tmp_path, 3, 3).summary
    assert fixed["fleet_replicas_mean"] == pytest.approx(3) and fixed["fleet_scale_ups"] == 0
    assert scaled["fleet_gpu_hours"] < 0.8 * fixed["fleet_gpu_hours"]
    assert scaled["fleet_replicas_mean"] < 2.5


@pytest.mark.slow
def test_the_bundled_trace_autoscales_with_fewer_gpu_hours() -> None:
    scaled = runner.run(ROOT / "scenarios/fleet_autoscale.yaml").summary
    fixed = runner.run(ROOT / "scenarios/fleet_fixed.yaml").summary
    assert scaled["fleet_gpu_hours"] < 0.75 * fixed["fleet_gpu_hours"]
    assert scaled["slo_attainment"] >= 0.95


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ("{min_replicas: 3, max_replicas: 2, target: 8}", "above max_replicas"),
        ("{min_replicas: 1, max_replicas: 2, target: 0}", "target"),
        ("{group: 4, min_replicas: 1, max_replicas: 2, target: 8}", "not a replica group"),
        ("{min_replicas: 1, max_replicas: 2, metric: kv_usage, target: 3}", "fraction"),
        ("[]", "empty list"),
        (
            "[{group: 0, min_replicas: 1, max_replicas: 2, target: 8}, "
            "{group: 0, min_replicas: 1, max_replicas: 3, target: 4}]",
            "autoscaled twice",
        ),
    ],
)
def test_bad_autoscale_config_exits_2_with_one_line(
    tmp_path: Path, block: str, reason: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: bad\nmodel: llama-3.1-8b\nreplicas: [{hardware: h100_sxm}]\n"
        f"autoscale: {block}\n"
        "workload: {dataset: {name: random, input_len: 8, output_len: 8}, num_prompts: 4}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "run", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.yaml" in lines[0] and reason in lines[0]


def test_bad_router_config_is_refused() -> None:
    with pytest.raises(ValueError, match="length_threshold"):
        scenario(router={"kind": "length"})
    with pytest.raises(ValueError, match="two or more"):
        scenario(router={"kind": "length", "length_threshold": 100})


def test_one_autoscale_mapping_is_a_list_of_one(tmp_path: Path) -> None:
    block = {"min_replicas": 1, "max_replicas": 2, "target": 4, "interval_s": 2}
    base: dict[str, Any] = {
        "replicas": [{"hardware": "h100_sxm"}],
        "router": {"kind": "least_outstanding"},
        "workload": {
            "dataset": {"name": "trace", "path": str(diurnal_trace(tmp_path))},
            "arrival": "trace",
            "num_prompts": 600,
        },
    }
    one = runner.run(scenario(autoscale=block, **base)).summary
    listed = runner.run(scenario(autoscale=[block], **base)).summary
    for s in (one, listed):
        s.pop("wall_time_s", None)
    assert one == listed


def scaler(group: int, max_replicas: int, target: float, **more: Any) -> dict[str, Any]:
    """An autoscale entry scaling `group` from 1 replica, evaluated every 2 s, down after 10."""
    return {
        "group": group,
        "min_replicas": 1,
        "max_replicas": max_replicas,
        "target": target,
        "interval_s": 2,
        "scale_down_delay_s": 10,
        **more,
    }


def diurnal_fleet(folder: Path, **update: Any) -> runner.RunResult:
    """The diurnal trace, least-outstanding routing and a 2 s TTFT SLO, on `update`'s fleet."""
    workload = {"dataset": {"name": "trace", "path": str(diurnal_trace(folder))}}
    base = {"router": {"kind": "least_outstanding"}, "slo": {"ttft_ms": 2000}}
    return runner.run(scenario(workload={**workload, "arrival": "trace"}, **(base | update)))


def assert_within(fleet: Any, limits: dict[int, int]) -> None:
    """Each autoscaled group of `fleet` (its frame) stays within 1 .. its limit replicas."""
    assert fleet is not None and set(fleet["group"]) == set(limits)
    for g, most in limits.items():
        mine = fleet[fleet["group"] == g]
        on = mine["serving"] + mine["loading"] + mine["draining"]
        assert on.max() <= most and mine["serving"].min() >= 1


def two_groups(folder: Path) -> runner.RunResult:
    """The diurnal trace on an H100 group and an A100 group, each scaled on its own: the
    H100s on outstanding requests between 1 and 3, the A100s on KV usage between 1 and 2."""
    return diurnal_fleet(
        folder,
        replicas=[{"hardware": "h100_sxm"}, {"hardware": "a100_sxm_80gb"}],
        autoscale=[
            scaler(0, 3, 8),
            scaler(1, 2, 0.02, metric="kv_usage", interval_s=3, weights_from="host"),
        ],
    )


def test_two_groups_scale_each_within_its_own_limits(tmp_path: Path) -> None:
    result = two_groups(tmp_path)
    fleet, s, rows = result.sim.fleet, result.summary, result.sim.requests
    limits = {0: 3, 1: 2}
    assert_within(fleet, limits)
    for g, most in limits.items():  # the noon peak needs every replica of both
        assert fleet[fleet["group"] == g]["serving"].max() == most
    by_group = {g["group"]: g for g in s["fleet_by_group"]}
    assert set(by_group) == {0, 1}
    assert s["fleet_gpu_hours"] == pytest.approx(sum(g["gpu_hours"] for g in by_group.values()))
    assert s["fleet_replicas_peak"] <= 5
    assert s["fleet_scale_ups"] == sum(g["scale_ups"] for g in by_group.values())
    # group 1's replicas are indices 3 and 4 (group 0 is built with its max_replicas, 3)
    assert set(rows["replica"]) == {0, 1, 2, 3, 4}
    assert result.energy["gpu_hours"] == pytest.approx(s["fleet_gpu_hours"], rel=0.05)


def bundled_pair(name: str, gpu_hours: float, goodput: float) -> dict[str, Any]:
    """scenarios/NAME.yaml (autoscaled) against NAME_fixed.yaml on the same 3,000 requests:
    the autoscaled run's GPU-hours below `gpu_hours` x the fixed one's, its goodput above
    `goodput` x; returns the autoscaled run's summary."""
    scaled_run = runner.run(ROOT / f"scenarios/{name}.yaml")
    fixed_run = runner.run(ROOT / f"scenarios/{name}_fixed.yaml")
    scaled, fixed = scaled_run.summary, fixed_run.summary
    assert scaled["completed"] == fixed["completed"] == 3000
    assert scaled_run.energy["gpu_hours"] < gpu_hours * fixed_run.energy["gpu_hours"]
    assert scaled["request_goodput"] > goodput * fixed["request_goodput"]
    return scaled


@pytest.mark.slow
def test_the_bundled_two_group_fleet_saves_gpu_hours() -> None:
    scaled = bundled_pair("autoscale_two_groups", gpu_hours=0.9, goodput=0.9)
    assert {g["group"] for g in scaled["fleet_by_group"]} == {0, 1}


def disaggregated(folder: Path) -> runner.RunResult:
    """The diurnal trace on a prefill pool of L40S scaled 1-3 on outstanding requests and a
    decode pool of H100 scaled 1-2 on KV usage, each its own autoscaler."""
    return diurnal_fleet(
        folder,
        replicas=[
            {"hardware": "l40s", "role": "prefill"},
            {"hardware": "h100_sxm", "role": "decode"},
        ],
        decode_router={"kind": "least_kv"},
        autoscale=[scaler(0, 3, 2), scaler(1, 2, 0.05, metric="kv_usage")],
    )


def test_prefill_and_decode_pools_scale_apart(tmp_path: Path) -> None:
    result = disaggregated(tmp_path)
    fleet, s, rows = result.sim.fleet, result.summary, result.sim.requests
    assert_within(fleet, {0: 3, 1: 2})
    assert s["completed"] == len(rows) and rows["finish_s"].notna().all()
    for g in (0, 1):  # the noon peak needs more of each pool
        assert fleet[fleet["group"] == g]["serving"].max() > 1
    # prefill replicas are 0-2, decode replicas 3-4; a request is prefilled on one and
    # decoded on the other, and an added replica gets work only once its weights are in
    assert set(rows["prefill_replica"]) <= {0, 1, 2} and set(rows["replica"]) <= {3, 4}
    load = {g["group"]: g["load_s"] for g in s["fleet_by_group"]}
    steps = result.sim.steps
    for g, added in ((0, 1), (1, 4)):  # the first replica each pool adds
        mine = fleet[fleet["group"] == g]
        started = float(mine.loc[mine["loading"].diff() > 0, "time_s"].iloc[0])
        first_step = steps.loc[steps["replica"] == added, "start_s"].min()
        assert first_step >= started + load[g] - 1e-9
    assert 0 < result.energy["gpu_hours"] < 5 * float(rows["finish_s"].max()) / 3600


@pytest.mark.slow
def test_the_bundled_disaggregated_fleet_scales_its_pools() -> None:
    scaled = bundled_pair("autoscale_disagg", gpu_hours=0.6, goodput=0.95)
    prefill = next(g for g in scaled["fleet_by_group"] if g["group"] == 0)
    assert prefill["replicas_peak"] > 1  # the prefill pool grows with the trace


def test_run_prints_each_autoscaled_group(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "scaled.yaml"
    path.write_text(
        "name: scaled\nmodel: llama-3.1-8b\n"
        "replicas: [{hardware: h100_sxm, role: prefill}, {hardware: h100_sxm, role: decode}]\n"
        "autoscale: [{group: 0, min_replicas: 1, max_replicas: 2, target: 1, interval_s: 1},\n"
        "            {group: 1, min_replicas: 1, max_replicas: 3, target: 64, interval_s: 1}]\n"
        "workload: {dataset: {name: random, input_len: 2048, output_len: 32}, num_prompts: 200,"
        " request_rate: 40}\n"
    )
    code, out, err = run_cli(capsys, "run", str(path))
    assert code == 0, err
    assert "Group 0 replicas (mean / peak):" in out and "Group 1 replicas" in out
    assert "prefill pool: 1-2 x h100_sxm" in out and "decode pool: 1-3 x h100_sxm" in out
    assert "Prefill pool: up to 2 replica(s)" in out and "decode pool: up to 3 replica(s)" in out
