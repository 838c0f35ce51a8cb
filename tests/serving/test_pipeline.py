"""Pipeline micro-batching: a 2-stage timeline by hand, the stage split of the cost model, and
the engine against the plain replica."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from clitools import run_cli
from factories import (
    MS,
    cost_model_step_s,
    fixed_group,
    make_requests,
    make_scheduler,
    times_ms,
)

import simulator as sim
from simulator.costmodel.batch import BatchShape
from simulator.errors import SpecError
from simulator.serving.cluster import ReplicaGroup, SimResult, replica_group, serve
from simulator.serving.kv_tiers import KVTiers
from simulator.serving.pipeline import BatchTimes, MicroBatching, StageClock, with_micro_batching
from simulator.serving.replica import Chunk
from simulator.specs import load_hardware
from simulator.specs.serving import SchedulerSpec
from simulator.workload.requests import RequestTable


class HandClock:
    """The narrative's 2 stages: a stage takes 10 ms for a batch with prompt tokens, 4 ms for
    decodes only; each batch first costs 0.5 ms of engine CPU; the hand-off takes 1 ms."""

    stages = 2

    def times(self, *, chunks: list[Chunk], decodes: list[int]) -> BatchTimes:
        stage = 10 * MS if chunks else 4 * MS
        return BatchTimes(cpu_s=0.5 * MS, stage_s=(stage, stage), send_s=(1 * MS,))


def run_pipeline(requests: RequestTable, scheduler: SchedulerSpec) -> SimResult:
    group = fixed_group(scheduler=scheduler, loop=MicroBatching(clock=HandClock()))
    return serve(requests, groups=[group])


def test_two_stages_two_micro_batches_by_hand() -> None:
    # A and B (100-token prompts, 2 tokens out) at t=0; a 100-token budget puts them in
    # separate batches. Times in ms; cpu: engine core, s0/s1: stages, -> the 1 ms hand-off.
    #   b1 (A prefill):  cpu 0-0.5,   s0 0.5-10.5,   -> 11.5, s1 11.5-21.5   A's 1st token 21.5
    #   b2 (B prefill):  cpu 0.5-1.0, s0 10.5-20.5,  -> 21.5, s1 21.5-31.5   B's 1st token 31.5
    #   two in flight: wait for b1 (21.5); A is runnable again
    #   b3 (A decode):   cpu 21.5-22, s0 22-26,      -> 27,   s1 31.5-35.5   (waits for b2)
    #   wait for b2 (31.5); B is runnable
    #   b4 (B decode):   cpu 31.5-32, s0 32-36,      -> 37,   s1 37-41
    #   b3 lands at 35.5: A done; b4 at 41: B done.
    result = run_pipeline(
        make_requests((0.0, 100, 2), (0.0, 100, 2)),
        make_scheduler(max_num_batched_tokens=100),
    )
    req = result.requests
    assert times_ms(req, "first_token_s") == [21.5, 31.5]
    assert times_ms(req, "finish_s") == [35.5, 41.0]
    steps = result.steps.sort_values("start_s")
    assert [round(x / MS, 6) for x in steps["start_s"]] == [0.0, 0.5, 21.5, 31.5]
    assert [round(x / MS, 6) for x in steps["end_s"]] == [21.5, 31.5, 35.5, 41.0]
    assert list(steps["prefill_tokens"]) == [100, 100, 0, 0]
    # A's inter-token gap: 35.5 - 21.5 = 14 ms; B's: 41 - 31.5 = 9.5 ms
    gaps = sorted(np.round(np.repeat(result.itl_s, result.itl_weight.astype(int)) / MS, 6))
    assert gaps == [9.5, 14.0]


def test_one_batch_at_a_time_when_all_requests_fit_one() -> None:
    # Both prompts fit the budget: one batch, nothing left for a second (vLLM's engine core
    # then waits for it), so the pipeline runs one batch at a time: 0.5 + 10 + 1 + 10 = 21.5
    # ms to the first tokens, 21.5 + 0.5 + 4 + 1 + 4 = 31 ms to the second.
    result = run_pipeline(
        make_requests((0.0, 100, 2), (0.0, 100, 2)), make_scheduler(max_num_batched_tokens=200)
    )
    assert times_ms(result.requests, "first_token_s") == [21.5, 21.5]
    assert times_ms(result.requests, "finish_s") == [31.0, 31.0]


def test_max_num_seqs_counts_requests_in_flight() -> None:
    # max_num_seqs 2, four 10-token prompts at t=0, a 10-token budget: two batches of one
    # prompt each fill the pipeline, and no third request is admitted while both are in flight.
    result = run_pipeline(
        make_requests(*[(0.0, 10, 3)] * 4),
        make_scheduler(max_num_seqs=2, max_num_batched_tokens=10),
    )
    steps = result.steps
    in_flight = [
        int(steps[(steps.start_s <= t) & (steps.end_s > t)].num_seqs.sum()) for t in steps.start_s
    ]
    assert max(in_flight) == 2
    assert len(result.requests) == 4


# -- the stage split on a real deployment ------------------------------------------------------
def llama_405b_pp2() -> sim.Deployment:
    return sim.deployment(
        model="llama-3.1-405b",
        hardware=load_hardware("h100_sxm", calibrated=False),
        tensor_parallel_size=8,
        pipeline_parallel_size=2,
        quantization="fp8",
    )


def pipeline_groups(
    dep: sim.Deployment, requests: RequestTable
) -> tuple[ReplicaGroup, ReplicaGroup]:
    """`dep`'s replica group for `requests` without, then with micro-batching."""
    group, _ = replica_group(dep, requests=requests)
    return group, with_micro_batching(group, dep)


def stage_clock(dep: sim.Deployment, requests: RequestTable) -> StageClock:
    _, piped = pipeline_groups(dep, requests)
    assert isinstance(piped.loop, MicroBatching)
    return piped.loop.clock


def test_stage_split_of_llama_405b_over_two_nodes() -> None:
    # tp=8 fills a node, so the boundary crosses nodes: 64 decodes hand over 64 x 16384 x 2 =
    # 2,097,152 bytes at 50 GB/s x busbw 0.8 = 52.4288 us, plus 5 us scale-out latency.
    dep = llama_405b_pp2()
    clock = stage_clock(dep, make_requests((0.0, 2000, 100)))
    decodes = [1500] * 64
    times = clock.times(chunks=[], decodes=decodes)
    assert times.send_s == pytest.approx((5e-6 + 2_097_152 / 40e9,), rel=1e-9)
    # the stages and the hand-off add up to the step's GPU time (a batch alone in the
    # pipeline takes as long as without micro-batching)
    whole = clock.timer.kernel_s(chunks=[], decode_contexts=decodes)
    assert sum(times.stage_s) + sum(times.send_s) == pytest.approx(whole, rel=1e-12)
    # the last stage also runs the LM head and sampler
    assert times.stage_s[1] > times.stage_s[0]
    ov = dep.engine.overhead
    assert times.cpu_s == pytest.approx(ov.step_s + 64 * ov.per_seq_s)
    # and the whole agrees with the cost model's step (the timer's tables interpolate)
    step = cost_model_step_s(dep, BatchShape.decode(batch_size=64, context_len=1500), num_seqs=64)
    assert whole + times.cpu_s == pytest.approx(step, rel=0.01)


def test_a_lone_request_sees_no_pipelining() -> None:
    # One request: every batch is alone in the pipeline, so micro-batching changes nothing.
    dep = llama_405b_pp2()
    requests = make_requests((0.0, 3000, 40))
    plain, piped = pipeline_groups(dep, requests)
    a = serve(requests, groups=[plain]).requests
    b = serve(requests, groups=[piped]).requests
    for column in ("first_token_s", "finish_s"):
        assert float(b[column].iloc[0]) == pytest.approx(float(a[column].iloc[0]), rel=0.01)


def test_micro_batches_raise_offline_throughput() -> None:
    dep = llama_405b_pp2()
    requests = make_requests(*[(0.0, 1024, 16)] * 64)
    plain, piped = pipeline_groups(dep, requests)
    t_plain = float(serve(requests, groups=[plain]).requests["finish_s"].max())
    t_piped = float(serve(requests, groups=[piped]).requests["finish_s"].max())
    assert t_piped < 0.75 * t_plain  # two stages busy at once most of the time


def test_micro_batching_keeps_power_within_tdp() -> None:
    # overlapping batches outrun the span in summed step time: the stages' waits once counted
    # each of them too, and a pp=4 replica drew 1046 W a GPU against a 700 W TDP
    def energy(pp: int, micro: bool) -> dict[str, float]:
        replica = {"hardware": "h100_sxm", "pipeline_parallel_size": pp}
        replica["pipeline_micro_batching"] = micro
        dataset = {"name": "random", "input_len": 2048, "output_len": 64}
        scenario = sim.Scenario.model_validate(
            {"name": "pp", "model": "llama-3.1-8b", "replicas": [replica],
             "workload": {"dataset": dataset, "num_prompts": 64, "request_rate": "inf"}}
        )  # fmt: skip
        return sim.run(scenario).energy

    tdp = load_hardware("h100_sxm").power.tdp_w
    for pp in (2, 4):
        piped = energy(pp, True)
        assert piped["parked_energy_j"] <= piped["energy_j"]
        assert piped["avg_power_w_per_gpu"] <= tdp
    plain = energy(2, False)  # without overlap: a stage waits parked while the others run
    assert plain["parked_energy_j"] > 0 and plain["avg_power_w_per_gpu"] <= tdp


def test_micro_batching_needs_a_pipeline() -> None:
    dep = sim.deployment(model="llama-3.1-8b", hardware="h100_sxm")
    with pytest.raises(SpecError, match="pipeline_parallel_size > 1"):
        pipeline_groups(dep, make_requests((0.0, 10, 2)))


def test_bench_throughput_flag(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "throughput", "--hardware", "h100_sxm", "--model", "llama-3.1-8b", "-pp", "2"]
    args += ["--input-len", "512", "--output-len", "16", "--num-prompts", "128", "--json"]
    code, plain, err = run_cli(capsys, *args)
    assert code == 0, err
    code, piped, err = run_cli(capsys, *args, "--pipeline-micro-batching")
    assert code == 0, err
    rate = [json.loads(out)["requests_per_second"] for out in (plain, piped)]
    assert rate[1] > 1.3 * rate[0]
    code, _, err = run_cli(capsys, *args[:6], "--pipeline-micro-batching", "--num-prompts", "2")
    assert code == 2 and "pipeline_parallel_size > 1" in err


def test_micro_batching_refuses_kv_tiers() -> None:
    # KV tiers load between the plain loop's steps; the pipelined loop does not model them.
    dep = llama_405b_pp2()
    plain, _ = pipeline_groups(dep, make_requests((0.0, 10, 2)))
    tiers = KVTiers(backend="native", replica_block_bytes=1.0, cpu_blocks=8, cpu_s_per_block=1e-3)
    tiered = dataclasses.replace(plain, enable_prefix_caching=True, kv_tiers=tiers)
    with pytest.raises(SpecError, match="KV offload tiers"):
        with_micro_batching(tiered, dep)
