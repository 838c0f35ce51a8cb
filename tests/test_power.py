"""Energy, power and cost (`simulator.runs.energy`): the power law's bounds and monotonicity, idle
gaps, power caps, a hand-computed step, cost arithmetic, and whole runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from factories import scenario_data
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator as sim
from simulator.cli import main
from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment
from simulator.costmodel.step import step_cost
from simulator.errors import SpecError
from simulator.metrics.recorder import STEP_COLUMNS
from simulator.runs.energy import (
    ENERGY_KEYS,
    GroupAccount,
    PowerModel,
    fleet_energy,
    sampler_memory_s,
    step_power_w,
    step_utilisation,
    step_work_s,
    steps_batch,
)
from simulator.runs.runner import RunResult, run, save_run
from simulator.specs import list_hardware, load_hardware
from simulator.specs.hardware import with_power_cap
from simulator.specs.scenario import Scenario, load_scenario
from simulator.specs.workload import SamplingSpec
from simulator.validate import data
from simulator.validate.sampler import PATHS as SAMPLER_PATHS

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
HARDWARE = list_hardware()
unit = st.floats(min_value=0.0, max_value=1.0)
POWER_COLUMNS = ["case", "batch", "vocab", "calls", "call_ms", "bytes_per_call", "power_w",
                 "power_p90_w", "sm_clock_mhz", "mem_clock_mhz", "samples"]  # fmt: skip


# -- factories ------------------------------------------------------------------------------------
def make_steps(rows: list[tuple[float, ...]]) -> pd.DataFrame:
    """Steps as (replica, start_s, end_s, num_seqs, prefill_tokens, decode_tokens, kv_blocks)."""
    df = pd.DataFrame(rows, columns=list(STEP_COLUMNS), dtype=float)
    for col in ("replica", "num_seqs", "prefill_tokens", "decode_tokens", "kv_used_blocks"):
        df[col] = df[col].astype(np.int64)
    return df


def make_requests(*, arrival_s: float, finish_s: float, n: int = 1, out: int = 100) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "arrival_s": [arrival_s] * n,
            "finish_s": [finish_s] * n,
            "prompt_tokens": [1000] * n,
            "output_tokens": [out] * n,
        }
    )


def account(dep: Deployment, *, count: int = 1, usd: float = 2.0) -> GroupAccount:
    return GroupAccount(deployment=dep, count=count, block_size=16, usd_per_gpu_hour=usd)


def small_scenario(**group: object) -> Scenario:
    data = scenario_data(
        name="t",
        group={"hardware": "h100_sxm", **group},
        input_len=512,
        output_len=64,
        num_prompts=40,
        request_rate=8,
    )
    return Scenario.model_validate(data)


# -- the power law --------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(hw_id=st.sampled_from(HARDWARE), uc=unit, um=unit)
def test_power_stays_between_parked_and_tdp(hw_id: str, uc: float, um: float) -> None:
    model = PowerModel.from_hardware(load_hardware(hw_id))
    p = float(model.power_w(u_compute=uc, u_memory=um))
    assert model.idle_w <= model.parked_w <= p <= model.tdp_w


@settings(max_examples=200, deadline=None)
@given(hw_id=st.sampled_from(HARDWARE), uc=unit, um=unit, d=unit)
def test_power_is_monotone_in_each_utilisation(hw_id: str, uc: float, um: float, d: float) -> None:
    model = PowerModel.from_hardware(load_hardware(hw_id))
    base = float(model.power_w(u_compute=uc, u_memory=um))
    assert float(model.power_w(u_compute=min(uc + d, 1.0), u_memory=um)) >= base
    assert float(model.power_w(u_compute=uc, u_memory=min(um + d, 1.0))) >= base


def test_a_step_draws_more_than_idle_and_full_compute_reaches_tdp() -> None:
    model = PowerModel.from_hardware(load_hardware("a100_sxm_80gb"))
    # active term: 60 + 340 x 0.115 = 99.1 W for a step that does nothing measurable (above the
    # parked 98 W)
    assert float(model.power_w(u_compute=0.0, u_memory=0.0)) == pytest.approx(99.1, abs=0.1)
    assert float(model.power_w(u_compute=0.9, u_memory=0.1)) == 400.0
    # decode at half the bandwidth: 60 + 340 x (0.115 + 0.992 x 0.5) = 267.74 W
    assert float(model.power_w(u_compute=0.0, u_memory=0.5)) == pytest.approx(267.74, abs=0.1)


def test_boost_lets_power_exceed_tdp_only_when_the_spec_allows_it() -> None:
    hw = load_hardware("a100_sxm_80gb")
    boosted = hw.model_copy(update={"power": hw.power.model_copy(update={"boost_w": 450.0})})
    assert float(PowerModel.from_hardware(hw).power_w(u_compute=1, u_memory=1)) == 400.0
    assert float(PowerModel.from_hardware(boosted).power_w(u_compute=1, u_memory=1)) == 450.0


def test_power_spec_rejects_inconsistent_limits() -> None:
    power = load_hardware("h100_sxm").power
    with pytest.raises(ValueError, match="boost_w"):
        type(power).model_validate({**power.model_dump(), "boost_w": 600})
    with pytest.raises(ValueError, match="cap_w"):
        type(power).model_validate({**power.model_dump(), "cap_w": 50})
    for parked in (60, 700):  # below the bare board's idle, at TDP
        with pytest.raises(ValueError, match="parked_w"):
            type(power).model_validate({**power.model_dump(), "parked_w": parked})


def test_parked_draw_defaults_to_idle_and_floors_every_step() -> None:
    power = load_hardware("h100_sxm").power
    bare = type(power).model_validate({**power.model_dump(), "parked_w": None})
    assert bare.between_steps_w == bare.idle_w == 70.0
    assert power.between_steps_w == 125.0
    # H100's fitted shape has no active term: a step that does next to nothing would come out
    # at the bare board's 70 W; it runs with the clocks up, so it draws at least the parked 125
    model = PowerModel.from_hardware(load_hardware("h100_sxm"))
    assert float(model.power_w(u_compute=0.0, u_memory=0.0)) == 125.0
    assert float(model.power_w(u_compute=0.0, u_memory=0.5)) > 125.0
    # a cap below the parked draw holds it too
    assert with_power_cap(load_hardware("h100_sxm"), 100.0).power.between_steps_w == 100.0


def test_h100_parked_draw_is_its_readings_with_a_context_open() -> None:
    """The H100's parked_w is the median of the `idle` rows of the bundled power readings
    (tools/measure_*_power.py: a CUDA context open, nothing running, clocks up)."""
    idle = pd.concat(
        data.read_measured(f"llmsim/h100_sxm/{name}_power.csv", ["case", "power_w", "sm_clock_mhz"])
        for name in ("sampler", "gemm")
    ).query("case == 'idle'")
    assert len(idle) == 4 and (idle["sm_clock_mhz"] >= 1900).all()  # clocks held up
    parked = load_hardware("h100_sxm").power.parked_w
    assert parked == pytest.approx(float(idle["power_w"].median()), abs=1.0)
    assert parked > 1.7 * load_hardware("h100_sxm").power.idle_w


# -- power caps -----------------------------------------------------------------------------------
def test_cap_scales_compute_peaks_by_the_cubic_clock_law() -> None:
    hw = load_hardware("h100_sxm")
    capped = with_power_cap(hw, 350.0)
    factor = ((350.0 - 70.0) / (700.0 - 70.0)) ** (1 / 3)  # = 0.763
    assert capped.power.clock_factor == pytest.approx(factor)
    for dtype, peak in hw.compute.peak_flops_per_s.items():
        assert capped.compute.peak_flops_per_s[dtype] == pytest.approx(peak * factor)
    assert capped.memory.bandwidth_bytes_per_s == hw.memory.bandwidth_bytes_per_s
    assert capped.power.ceiling_w == 350.0
    # re-capping starts from the uncapped clock, and a cap at TDP changes nothing
    assert with_power_cap(capped, 500.0).compute.peak_flops_per_s["bf16"] == pytest.approx(
        with_power_cap(hw, 500.0).compute.peak_flops_per_s["bf16"]
    )
    assert with_power_cap(hw, 700.0).compute == hw.compute


@pytest.mark.parametrize("cap", [0.0, 30.0, 70.0])
def test_cap_at_or_below_idle_is_a_spec_error(cap: float) -> None:
    with pytest.raises(SpecError) as err:
        with_power_cap(load_hardware("h100_sxm"), cap)
    assert err.value.field == "power_cap_w"


@settings(max_examples=40, deadline=None)
@given(
    cap=st.floats(min_value=100.0, max_value=800.0),
    tokens=st.integers(min_value=1, max_value=8192),
    seqs=st.integers(min_value=1, max_value=256),
)
def test_a_cap_never_makes_a_step_faster(cap: float, tokens: int, seqs: int) -> None:
    dep = sim.deployment(model="llama-3.1-8b", hardware="h100_sxm")
    capped = with_power_cap(dep.hardware, cap)
    for batch in (
        BatchShape.prefill(batch_size=1, prompt_len=tokens),
        BatchShape.decode(batch_size=seqs, context_len=tokens),
    ):
        base = step_cost(dep.model, dep.hardware, dep.layout, dep.precision, batch).seconds
        slow = step_cost(dep.model, capped, dep.layout, dep.precision, batch).seconds
        assert slow >= base * (1 - 1e-12)


def test_a_cap_stretches_prefill_and_leaves_decode_nearly_alone() -> None:
    dep = sim.deployment(model="llama-3.1-8b", hardware="h100_sxm")
    capped = with_power_cap(dep.hardware, 350.0)  # clock x 0.763

    def ratio(batch: BatchShape) -> float:
        args = (dep.model, capped, dep.layout, dep.precision, batch)
        base = step_cost(dep.model, dep.hardware, dep.layout, dep.precision, batch).seconds
        return step_cost(*args).seconds / base

    assert ratio(BatchShape.prefill(batch_size=1, prompt_len=4096)) > 1.2  # compute-bound
    assert ratio(BatchShape.decode(batch_size=8, context_len=1024)) < 1.03  # memory-bound


def test_half_power_on_splitwise_h100_steps_is_near_splitwises_own_factors() -> None:
    # splitwise-sim prices its H100s capped at 350 W as prompt x1.3, tokens x1.0
    # (docs/energy-and-cost.md)
    from simulator.specs import load_engine
    from simulator.validate.iteration import iteration_cases

    hw, engine, rows = (
        load_hardware("h100_sxm"),
        load_engine("vllm-0.2"),
        data.splitwise("h100_sxm"),
    )
    free = iteration_cases(hw, engine, rows)
    capped = iteration_cases(with_power_cap(hw, 350.0), engine, rows)
    ratio = capped["predicted_s"].to_numpy() / free["predicted_s"].to_numpy()
    prefill = free["kind"].str.startswith("prefill").to_numpy()  # past the step too
    assert np.allclose(ratio[~prefill], 1.0)  # eager decode steps wait on the host, not the SMs
    assert ratio[prefill].min() >= 1.0 and ratio[prefill].max() < 1.3
    assert np.median(ratio[prefill]) == pytest.approx(1.17, abs=0.01)


def test_power_cap_in_a_scenario_slows_prefill_and_caps_power() -> None:
    base = run(small_scenario())
    capped = run(small_scenario(power_cap_w="350 W"))
    assert capped.deployments[0].hardware.power.cap_w == 350.0
    assert capped.summary["mean_ttft_ms"] > base.summary["mean_ttft_ms"]
    assert capped.energy["avg_power_w_per_gpu"] <= 350.0


def test_power_cap_below_idle_in_a_scenario_is_a_spec_error() -> None:
    with pytest.raises(SpecError) as err:
        run(small_scenario(power_cap_w=50))
    assert err.value.field == "power_cap_w"


# -- utilisation and energy of steps --------------------------------------------------------------
def test_hand_computed_decode_step_and_idle_gap() -> None:
    dep = sim.deployment(model="llama-3.1-8b", hardware="h100_sxm")
    # One decode step of one sequence (16 KV tokens: one block) from 0.5 s to 0.51 s; the request
    # arrives at 0 and finishes at 1 s. The step reads the weights but for the embedding table
    # (it gathers one row): 2 B x (8,030,261,248 - 128,256 x 4,096) = 15.01 GB, over 3.35 TB/s =
    # 4.481 ms, u_memory = 0.448; FLOPs 2 x 7.505e9 over 989.4 TFLOP/s = 15.2 us, u_compute =
    # 0.0015. With H100's fitted shape, P = 70 + 630 x (0 + 1.315 x 0.0015 + 0.913 x 0.448)
    # = 329.2 W.
    steps = make_steps([(0, 0.5, 0.51, 1, 0, 1, 1)])
    watts = step_power_w(steps, account(dep))
    assert watts[0] == pytest.approx(329.2, rel=0.002)
    # energy: the step at 329.2 W for 10 ms, then 0.99 s parked (context open) at 125 W, not
    # the bare board's 70 W: 3.29 + 123.75 = 127.04 J
    out = fleet_energy(
        steps=steps, requests=make_requests(arrival_s=0.0, finish_s=1.0), groups=[account(dep)]
    )
    assert out["energy_j"] == pytest.approx(127.04, rel=0.002)
    assert out["parked_energy_j"] == pytest.approx(123.75)
    assert out["avg_power_w_per_gpu"] == pytest.approx(127.04, rel=0.002)
    assert out["energy_per_output_token_j"] == pytest.approx(out["energy_j"] / 100)


def test_sampler_passes_count_their_bytes_in_u_memory() -> None:
    """A decode step of 256 Llama-3.1-8B sequences on H100 whose requests sample at a
    temperature with top-p and a repetition penalty moves, beyond the greedy step's bytes, the
    vllm profile's draw, sort and penalty bytes per logit (40 + 378 + 80 B x 256 x 128256 =
    16.4 GB); no sampling given is greedy, and SGLang's profile (no passes priced) moves none."""
    dep = sim.deployment(model="llama-3.1-8b", hardware="h100_sxm")
    steps = make_steps([(0, 0.0, 0.05, 256, 0, 256, 256 * 80)])
    sampled = SamplingSpec(temperature=0.8, top_p=0.95, repetition_penalty=1.1)
    greedy = step_utilisation(steps, dep, block_size=16, sampling=SamplingSpec())
    assert step_utilisation(steps, dep, block_size=16)[1] == pytest.approx(greedy[1])
    busy = step_utilisation(steps, dep, block_size=16, sampling=sampled)
    engine = dep.engine
    per_logit = sum(
        w.bytes_per_logit
        for w in (engine.random_sample, engine.top_p, engine.penalties)
        if w is not None
    )
    extra = per_logit * 256 * 128256 / dep.hardware.memory.bandwidth_bytes_per_s / 0.05
    assert busy[1] - greedy[1] == pytest.approx(extra, rel=1e-9)
    assert busy[0] == pytest.approx(greedy[0], rel=1e-12)  # FLOPs untouched
    hotter = GroupAccount(deployment=dep, count=1, block_size=16, usd_per_gpu_hour=2.0,
                          sampling=sampled)  # fmt: skip
    assert step_power_w(steps, hotter)[0] > step_power_w(steps, account(dep))[0]
    sglang = sim.deployment(model="llama-3.1-8b", hardware="h100_sxm", engine="sglang")
    plain = step_utilisation(steps, sglang, block_size=16, sampling=SamplingSpec())
    assert step_utilisation(steps, sglang, block_size=16, sampling=sampled)[1] == pytest.approx(
        plain[1], rel=1e-12
    )


def test_sampler_power_against_h100_readings() -> None:
    """vLLM's sampler run back to back on an H100 (tools/measure_sampler_power.py, bundled,
    fitted to nothing): with the passes' bytes in u_memory (`sampler_memory_s`, beside the
    greedy pick's 8 B) the draw is within 30% of the readings; without, over 60% low."""
    dep = sim.deployment(model="llama-3.1-8b", hardware="h100_sxm")  # vocabulary 128256
    power = PowerModel.from_hardware(dep.hardware)
    readings = data.read_measured("llmsim/h100_sxm/sampler_power.csv", POWER_COLUMNS)
    cases = readings[readings["case"].isin(["random", "top_p", "penalties", "logprobs"])]
    assert len(cases) == 4 and set(cases["vocab"]) == {dep.model.vocab_size}
    for r in cases.itertuples():
        sampling = SamplingSpec.model_validate(SAMPLER_PATHS[r.case][0])
        call_s = r.call_ms * 1e-3
        pick = 8.0 * r.batch * r.vocab / dep.hardware.memory.bandwidth_bytes_per_s / call_s
        passes = float(sampler_memory_s(dep, sampling, float(r.batch))) / call_s
        counted = float(np.ravel(power.power_w(u_compute=0.0, u_memory=pick + passes))[0])
        uncounted = float(np.ravel(power.power_w(u_compute=0.0, u_memory=pick))[0])
        assert counted == pytest.approx(r.power_w, rel=0.3), r.case
        assert uncounted < 0.4 * r.power_w, r.case


def test_gemm_power_against_h100_readings() -> None:
    """Llama 3.1 8B's projections at 1-4096 tokens and a square GEMM run back to back on an
    H100 (tools/measure_gemm_power.py, bundled, fitted to nothing): the model's draw at their
    utilisations is within 10% of the readings, at the cap where the board held it."""
    hw = load_hardware("h100_sxm")
    power = PowerModel.from_hardware(hw)
    columns = [
        "case",
        "m",
        "calls",
        "call_ms",
        "flops_per_call",
        "bytes_per_call",
        *POWER_COLUMNS[6:],
    ]
    readings = data.read_measured("llmsim/h100_sxm/gemm_power.csv", columns)
    gemms = readings[readings["case"].str.startswith("proj_") | (readings["case"] == "square")]
    assert len(gemms) == 7
    seconds = gemms["call_ms"].to_numpy(dtype=float) * 1e-3
    u_compute = gemms["flops_per_call"].to_numpy(dtype=float) / hw.peak_flops("bf16") / seconds
    u_memory = (
        gemms["bytes_per_call"].to_numpy(dtype=float) / hw.memory.bandwidth_bytes_per_s / seconds
    )
    watts = power.power_w(u_compute=u_compute, u_memory=u_memory)
    np.testing.assert_allclose(watts, gemms["power_w"].to_numpy(dtype=float), rtol=0.1)


def test_gap_energy_is_parked_power_times_gap_times_gpus() -> None:
    dep = sim.deployment(model="llama-3.1-8b", hardware="a100_sxm_80gb", tensor_parallel_size=2)
    requests = make_requests(arrival_s=3.0, finish_s=13.0)
    empty = make_steps([])
    out = fleet_energy(steps=empty, requests=requests, groups=[account(dep, count=3)])
    assert out["num_gpus"] == 6
    # from the run's start (t = 0, as the benchmark's duration), not the first arrival; every
    # GPU parked (the serving engine's context open) at 98 W, not the bare board's 60 W
    assert dep.hardware.power.between_steps_w == 98.0
    assert out["energy_j"] == out["parked_energy_j"] == pytest.approx(98.0 * 13.0 * 6)
    # adding a step adds (its power - parked) x its time x the replica's GPUs
    one = make_steps([(1, 5.0, 5.5, 4, 0, 4, 100)])
    with_step = fleet_energy(steps=one, requests=requests, groups=[account(dep, count=3)])
    watts = step_power_w(one, account(dep))[0]
    assert with_step["energy_j"] - out["energy_j"] == pytest.approx((watts - 98.0) * 0.5 * 2)


def test_pipeline_stages_are_busy_a_stage_share_of_each_step() -> None:
    dep = sim.deployment(model="llama-3.1-8b", hardware="h100_sxm", pipeline_parallel_size=2)
    steps = make_steps([(0, 0.0, 1.0, 8, 0, 8, 64)])
    out = fleet_energy(
        steps=steps, requests=make_requests(arrival_s=0.0, finish_s=1.0), groups=[account(dep)]
    )
    busy = step_power_w(steps, account(dep))[0]
    # each of the 2 GPUs runs its half of the layers for half the step and waits, parked at
    # 125 W, the other half
    assert out["energy_j"] == pytest.approx(2 * (busy + 125.0) / 2)
    assert out["parked_energy_j"] == pytest.approx(2 * 125.0 / 2)


def test_steps_batch_reads_the_recorded_columns() -> None:
    # a mixed step: 2 chunks of 300 tokens and 3 decodes, 50 blocks of 16 held after it
    steps = make_steps([(0, 0.0, 0.1, 5, 600, 3, 50)])
    b = steps_batch(steps, block_size=16, window=None)
    got = {k: float(np.ravel(getattr(b, k))[0]) for k in b.__slots__}
    assert got == {
        "prefill_tokens": 600,
        "prefill_seqs": 2,
        "prefill_pairs": 2 * 300 * 301 / 2,  # two causal 300-token prompts
        "prefill_kv_tokens": 600,
        "decode_seqs": 3,
        "decode_kv_tokens": 50 * 16 - 600,
        "sampled": 5,
    }


@pytest.mark.parametrize(
    "model, tp, prefill_share",
    [
        ("llama-3.1-8b", 1, 0.98),  # one GPU, compute-bound: at the cap, as large GEMMs are
        # four GPUs: part of the step in all-reduces (links, not the SMs), so below it
        ("llama-3.1-70b", 4, 0.80),
    ],
)
def test_prefill_draws_more_than_decode(model: str, tp: int, prefill_share: float) -> None:
    dep = sim.deployment(model=model, hardware="h100_sxm", tensor_parallel_size=tp)
    hw, power = dep.hardware, PowerModel.from_hardware(dep.hardware)
    watts = []
    for batch in (
        BatchShape.prefill(batch_size=1, prompt_len=4096),
        BatchShape.decode(batch_size=8, context_len=2048),
    ):
        t = step_cost(dep.model, hw, dep.layout, dep.precision, batch).seconds
        c, m = step_work_s(dep.model, hw, dep.layout, dep.precision, batch)
        watts.append(float(power.power_w(u_compute=c / t, u_memory=m / t)[0]))
    assert watts[0] > watts[1] > power.idle_w
    assert watts[0] >= prefill_share * power.tdp_w


# -- cost -----------------------------------------------------------------------------------------
def test_cost_arithmetic_and_price_override() -> None:
    result = run(small_scenario(count=2, usd_per_gpu_hour=10.0))
    e = result.energy
    done = result.sim.requests
    assert e["num_gpus"] == 2
    assert e["gpu_hours"] == pytest.approx(2 * result.summary["duration"] / 3600)
    assert e["cost_usd"] == pytest.approx(e["gpu_hours"] * 10.0)
    out_tokens = done["output_tokens"].sum()
    all_tokens = out_tokens + done["prompt_tokens"].sum()
    assert e["usd_per_million_output_tokens"] == pytest.approx(e["cost_usd"] / out_tokens * 1e6)
    assert e["usd_per_million_tokens"] == pytest.approx(e["cost_usd"] / all_tokens * 1e6)
    assert e["energy_per_request_j"] == pytest.approx(e["energy_j"] / len(done))
    default = run(small_scenario(count=2)).energy
    assert default["cost_usd"] == pytest.approx(e["gpu_hours"] * 3.78)  # h100_sxm's price


def test_mixed_fleet_sums_groups_with_their_own_hardware_and_price() -> None:
    scenario = load_scenario(SCENARIOS / "mixed_fleet.yaml")
    workload = scenario.workload.model_copy(update={"num_prompts": 200})
    result = run(scenario.model_copy(update={"workload": workload}))
    e, hours = result.energy, result.summary["duration"] / 3600
    assert e["num_gpus"] == 3
    assert e["cost_usd"] == pytest.approx(hours * (3.78 + 2 * 2.50))
    # between all-idle and all-at-TDP of the three GPUs
    span = result.summary["duration"]
    assert (70 + 2 * 60) * span < e["energy_j"] < (700 + 2 * 400) * span


# -- integration ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quickstart() -> RunResult:
    return run(SCENARIOS / "quickstart.yaml")


def test_run_reports_energy_keys_with_sane_values(quickstart: RunResult) -> None:
    out = quickstart.as_json()
    assert set(ENERGY_KEYS) <= set(out)
    hw = load_hardware("h100_sxm")
    assert hw.power.idle_w < out["avg_power_w_per_gpu"] < hw.power.tdp_w
    assert 0 < out["energy_per_output_token_j"] < 10
    assert out["energy_j"] == pytest.approx(
        out["avg_power_w_per_gpu"] * out["num_gpus"] * quickstart.summary["duration"]
    )


def test_a_run_at_low_load_pays_the_parked_draw_while_it_waits(tmp_path: Path) -> None:
    """Between requests the GPU waits with the engine's context open: the run's energy over a
    spec parked at the bare idle is (parked - idle) x the GPU-seconds no step ran."""
    bare = tmp_path / "h100_bare.yaml"
    bare.write_text("base: h100_sxm\npower: {parked_w: 70 W}\n")
    runs = {
        path: run(
            Scenario.model_validate(
                scenario_data(
                    input_len=256,
                    output_len=16,
                    num_prompts=10,
                    request_rate=0.5,
                    group={"hardware": path},
                )
            )
        )
        for path in ("h100_sxm", str(bare))
    }
    parked, plain = runs["h100_sxm"], runs[str(bare)]
    steps = parked.sim.steps
    waiting = parked.summary["duration"] - float((steps["end_s"] - steps["start_s"]).sum())
    assert waiting > 0.8 * parked.summary["duration"]  # mostly waiting for the next request
    extra = parked.energy["energy_j"] - plain.energy["energy_j"]
    assert extra == pytest.approx((125.0 - 70.0) * waiting, rel=1e-6)
    assert parked.energy["parked_energy_j"] == pytest.approx(125.0 * waiting, rel=1e-6)
    assert 125.0 < parked.energy["avg_power_w_per_gpu"] < 1.5 * 125.0


def test_save_run_keeps_the_energy_keys(quickstart: RunResult, tmp_path: Path) -> None:
    folder = save_run(quickstart, tmp_path / "run")
    saved = json.loads((folder / "summary.json").read_text())
    assert saved["cost_usd"] == pytest.approx(quickstart.energy["cost_usd"])


def test_cli_run_prints_energy_and_cost(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(SCENARIOS / "quickstart.yaml")])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "J/output token" in text and "/M output tokens" in text
    assert "parked between steps" not in text  # the quickstart's GPU is never idle


def test_cli_run_says_how_much_energy_was_parked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "low.yaml"
    low = scenario_data(input_len=256, output_len=16, num_prompts=10, request_rate=0.5)
    path.write_text(json.dumps(low))  # JSON is YAML
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(path)])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "of the energy parked between steps" in text


def test_a_power_cap_reads_a_quantity_as_scenarios_do() -> None:
    hw = load_hardware("h100_sxm")
    assert with_power_cap(hw, "350 W") == with_power_cap(hw, 350.0)
    for bad in (None, "lots", "350 GB"):
        with pytest.raises(SpecError) as err:
            with_power_cap(hw, bad)  # type: ignore[arg-type]
        assert err.value.field == "power_cap_w"
