"""Energy of a replica whose two streams run at once (intra-GPU prefill/decode partitioning,
`serving.pd_partition`; `runs.energy.stream_overlap`): the overlap's idle and active draw is
counted once, the busy time is the union of the steps, and a plain replica's account is the
one it always was."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.runs import runner
from simulator.runs.energy import EnergyAccumulator, PowerModel, fleet_energy, stream_overlap
from simulator.specs import load_hardware
from simulator.specs.loader import validate
from simulator.specs.scenario import Scenario
from tests.factories import scenario_data

H100 = PowerModel.from_hardware(load_hardware("h100_sxm"))
SHARED = H100.idle_w + (H100.tdp_w - H100.idle_w) * H100.active_fraction


def _steps(rows: list[tuple[int, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["replica", "start_s", "end_s"])


def test_steps_one_after_another_overlap_nowhere() -> None:
    steps = _steps([(0, 0.0, 1.0), (0, 1.0, 2.0), (1, 0.5, 1.5), (0, 3.0, 4.0)])
    assert stream_overlap(steps, np.full(4, 400.0), H100) == (0.0, 0.0)


def test_two_streams_count_the_shared_draw_once() -> None:
    # a prefill step over [0, 2] on replica 0; decode steps [0.5, 1] and [1.5, 3] beside it;
    # replica 1's step at the same time belongs to another GPU
    steps = _steps([(0, 1.5, 3.0), (0, 0.0, 2.0), (1, 0.0, 2.0), (0, 0.5, 1.0)])
    watts = np.array([300.0, 500.0, 500.0, 300.0])
    seconds, joules = stream_overlap(steps, watts, H100)
    assert seconds == pytest.approx(0.5 + 0.5)
    together = np.clip(800.0 - SHARED, H100.parked_w, H100.ceiling_w)
    assert joules == pytest.approx(1.0 * (800.0 - together))


def test_the_draw_of_two_streams_never_passes_the_ceiling() -> None:
    steps = _steps([(0, 0.0, 1.0), (0, 0.0, 1.0)])
    watts = np.full(2, H100.ceiling_w)
    seconds, joules = stream_overlap(steps, watts, H100)
    assert seconds == 1.0
    assert joules == pytest.approx(2 * H100.ceiling_w - H100.ceiling_w)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 0.5), st.floats(0.01, 1.0)), min_size=1, max_size=12),
    st.lists(st.tuples(st.floats(0.0, 0.5), st.floats(0.01, 1.0)), min_size=1, max_size=12),
)
def test_the_union_and_the_energy_of_any_two_streams(
    a: list[tuple[float, float]], b: list[tuple[float, float]]
) -> None:
    """Two streams of back-to-back steps (gaps, durations): the overlap removed leaves the
    union of their busy time, and between one stream's energy and the two summed."""

    def stream(parts: list[tuple[float, float]]) -> list[tuple[int, float, float]]:
        rows, t = [], 0.0
        for gap, length in parts:
            rows.append((0, t + gap, t + gap + length))
            t += gap + length
        return rows

    rows = stream(a) + stream(b)
    steps = _steps(rows)
    watts = np.linspace(H100.parked_w, H100.tdp_w, len(rows))
    seconds, joules = stream_overlap(steps, watts, H100)
    grid = np.linspace(0.0, 20.0, 200_001)  # the union measured on a fine grid
    busy = np.zeros_like(grid, dtype=bool)
    for _, lo, hi in rows:
        busy |= (grid >= lo) & (grid < hi)
    duration = steps["end_s"].to_numpy() - steps["start_s"].to_numpy()
    assert duration.sum() - seconds == pytest.approx(busy.mean() * 20.0, abs=2e-3)
    total = float(np.sum(duration * watts))
    alone = max(
        float(np.sum((duration * watts)[: len(a)])), float(np.sum((duration * watts)[len(a) :]))
    )
    assert joules >= 0.0
    assert alone - 1e-9 <= total - joules <= total


def _partitioned_run() -> runner.RunResult:
    group = {"hardware": "h100_sxm", "pd_partition": "static:0.5"}
    data = scenario_data(
        num_prompts=24, group=group, seed=0, input_len=2048, output_len=256, range_ratio=0.5
    )
    return runner.run(validate(Scenario, data, source="t"))


def test_a_partitioned_run_counts_its_gpu_once() -> None:
    result = _partitioned_run()
    sim = result.sim
    accounts = runner.group_accounts(result.scenario, result.deployments, result.memory)
    assert accounts[0].streams_overlap
    fixed = fleet_energy(steps=sim.steps, requests=sim.requests, groups=accounts)
    naive_groups = [dataclasses.replace(g, streams_overlap=False) for g in accounts]
    naive = fleet_energy(steps=sim.steps, requests=sim.requests, groups=naive_groups)
    assert fixed == result.energy
    assert fixed["energy_j"] < naive["energy_j"]
    span = float(sim.requests["finish_s"].max())
    gpus = fixed["num_gpus"]
    assert fixed["energy_j"] >= gpus * H100.parked_w * span
    # the busy time is the union of the steps: within the run, and more parked time than the
    # naive sum left
    account = EnergyAccumulator(accounts)
    account.add(sim.steps)
    assert account.busy_s[0] <= span * accounts[0].count + 1e-9
    assert fixed["parked_energy_j"] > naive["parked_energy_j"]


def test_a_plain_replica_keeps_its_account() -> None:
    data = scenario_data(
        num_prompts=24, group={"hardware": "h100_sxm"}, seed=0, input_len=512, output_len=64
    )
    result = runner.run(validate(Scenario, data, source="t"))
    accounts = runner.group_accounts(result.scenario, result.deployments, result.memory)
    assert not accounts[0].streams_overlap
    # one stream's steps never overlap: the overlap account changes nothing
    both = [dataclasses.replace(g, streams_overlap=True) for g in accounts]
    sim = result.sim
    again = fleet_energy(steps=sim.steps, requests=sim.requests, groups=both)
    assert again == pytest.approx(result.energy, rel=1e-12)
