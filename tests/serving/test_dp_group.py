"""DP attention with wide EP: attention ranks stepping in lockstep, timelines by hand, the
lockstep step against the cost model, and the scenario fields."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from clitools import run_cli
from factories import (
    MS,
    cost_model_step_s,
    fixed_group,
    make_requests,
    make_scheduler,
    scenario_data,
    times_ms,
)

import simulator as sim
from simulator.costmodel.batch import BatchShape
from simulator.costmodel.ops import expert_imbalance_from_skew
from simulator.errors import SpecError
from simulator.runs import runner
from simulator.serving.cluster import SimResult, replica_group, serve
from simulator.serving.dp_group import (
    DPAttention,
    EPGroupTimes,
    LockstepTimer,
    with_dp_attention,
)
from simulator.serving.replica import Chunk
from simulator.specs import load_model
from simulator.specs.scenario import Scenario, load_scenario
from simulator.specs.serving import RouterSpec
from simulator.workload.requests import RequestTable

SCENARIO = Path(__file__).parents[2] / "scenarios" / "deepseek_v3_ep_h100.yaml"


class HandLockstep:
    """The narrative's lockstep step: 5 ms, plus 10 us per prompt token of the rank with the
    most (the slowest rank sets every rank's step)."""

    def step(self, batches: Sequence[tuple[list[Chunk], list[int]]]) -> float:
        return 5 * MS + 0.01 * MS * max(sum(c[0] for c in chunks) for chunks, _ in batches)


def run_ranks(requests: RequestTable, *, ranks: int = 2) -> SimResult:
    group = fixed_group(loop=DPAttention(ranks=ranks, timer=HandLockstep()))  # type: ignore[arg-type]
    return serve(requests, groups=[group], router=RouterSpec(kind="round_robin"))


def test_ranks_step_together_by_hand() -> None:
    # Round robin: A (100-token prompt, 3 out) to rank 0, B (1000, 2 out) to rank 1, at t=0.
    #   step 1, 0-15 ms: A and B prefill; the step lasts 5 + 0.01 x 1000 = 15 ms for both ranks
    #   step 2, 15-20:   both decode -> B done at 20 ms
    #   step 3, 20-25:   A decodes, rank 1 runs a dummy batch -> A done at 25 ms
    # Alone, A's prefill would have taken 5 + 1 = 6 ms: B's prompt delays A's first token.
    result = run_ranks(make_requests((0.0, 100, 3), (0.0, 1000, 2)))
    req = result.requests
    assert times_ms(req, "first_token_s") == [15.0, 15.0]
    assert times_ms(req, "finish_s") == [25.0, 20.0]
    assert list(req.sort_values("request_id")["replica"]) == [0, 1]
    steps = result.steps
    rank0, rank1 = steps[steps.replica == 0], steps[steps.replica == 1]
    assert [round(x / MS, 6) for x in rank0.end_s] == [15.0, 20.0, 25.0]
    assert [round(x / MS, 6) for x in rank1.end_s] == [15.0, 20.0]  # no rows for dummy batches


def test_a_prefill_on_one_rank_stretches_decodes_on_the_other() -> None:
    # A (10 tokens, 4 out) on rank 0 at t=0; B (2000 tokens, 1 out) on rank 1 at 7 ms.
    #   0-5.1: A's prefill (5 + 0.1);  5.1-10.1: A decodes (B arrives mid-step and waits)
    #   10.1-35.1: A decodes while B prefills (5 + 20)  -> B done;  35.1-40.1: A's last token
    # A's inter-token gaps: 5, 25, 5 ms.
    result = run_ranks(make_requests((0.0, 10, 4), (7 * MS, 2000, 1)))
    assert times_ms(result.requests, "finish_s") == [40.1, 35.1]
    gaps = np.repeat(result.itl_s, result.itl_weight.astype(int))
    assert sorted(np.round(gaps / MS, 6)) == [5.0, 5.0, 25.0]


def test_idle_group_waits_for_arrivals() -> None:
    # A at t=0 (prompt 100, 1 out): 0-6 ms. B at 50 ms on rank 1: 50-56 ms.
    result = run_ranks(make_requests((0.0, 100, 1), (50 * MS, 100, 1)))
    assert times_ms(result.requests, "finish_s") == [6.0, 56.0]


# -- DeepSeek-V3 on 16 H100: the lockstep step against the cost model --------------------------
@pytest.fixture(scope="module")
def deepseek() -> tuple[sim.Deployment, LockstepTimer]:
    dep = sim.deployment(
        model="deepseek-v3",
        hardware="h100_sxm",
        data_parallel_size=16,
        expert_parallel_size=16,
    )
    group, _ = replica_group(
        dep,
        requests=make_requests((0.0, 4000, 100)),
        scheduler=make_scheduler(max_num_seqs=64, max_num_batched_tokens=2048),
    )
    wide = with_dp_attention(group, dep, count=1)
    assert isinstance(wide.loop, DPAttention) and wide.count == 1
    return dep, wide.loop.timer


def test_equal_ranks_match_the_cost_models_step(
    deepseek: tuple[sim.Deployment, LockstepTimer],
) -> None:
    dep, timer = deepseek
    # the cost model's step of the wide-EP layout has every rank hold the same batch
    decode = BatchShape.decode(batch_size=32, context_len=1000)
    expected = cost_model_step_s(dep, decode, num_seqs=32)
    assert timer.step([([], [1000] * 32)] * 16) == pytest.approx(expected, rel=0.01)
    prefill = BatchShape.prefill(batch_size=1, prompt_len=1024)
    expected = cost_model_step_s(dep, prefill, num_seqs=1)
    assert timer.step([([(1024, 0, True)], [])] * 16) == pytest.approx(expected, rel=0.01)


def test_the_largest_rank_sets_the_step(deepseek: tuple[sim.Deployment, LockstepTimer]) -> None:
    _, timer = deepseek
    idle: tuple[list[Chunk], list[int]] = ([], [])
    decodes = [([], [1000] * 8)] * 16
    one_prefill = [([(2040, 0, True)], [1000] * 8), *decodes[1:]]
    assert timer.step(one_prefill) > timer.step(decodes)
    # 2048 tokens on one rank cost more than 128 on each of 16: the same expert work, but one
    # device sends them all (its NIC sets the all-to-all) and its attention runs them all.
    spread = [([(128, 0, True)], [])] * 16
    alone = [([(2048, 0, True)], []), *[idle] * 15]
    assert timer.step(alone) > timer.step(spread)
    shared_spread, _ = timer.shared.cost(group_tokens=2048, sender_tokens=128)
    shared_alone, _ = timer.shared.cost(group_tokens=2048, sender_tokens=2048)
    assert shared_alone > shared_spread


def test_imbalance_slows_the_shared_part() -> None:
    def shared_s(imbalance: float) -> float:
        dep = sim.deployment(
            model="deepseek-v3",
            hardware="h100_sxm",
            data_parallel_size=16,
            expert_parallel_size=16,
            expert_load_imbalance=imbalance,
        )
        times = EPGroupTimes(
            dep,
            max_rank_tokens=64,
        )
        return times.cost(group_tokens=16 * 64, sender_tokens=64)[0]

    assert shared_s(1.5) > 1.2 * shared_s(1.0)


# -- scenarios ---------------------------------------------------------------------------------
def test_the_scenario_numbers_each_rank_as_a_replica() -> None:
    scenario = load_scenario(SCENARIO)
    small = scenario.model_copy(
        update={"workload": scenario.workload.model_copy(update={"num_prompts": 64})}
    )
    result = runner.run(small)
    assert result.sim.num_replicas == 16
    assert result.energy["num_gpus"] == 16
    steps = result.sim.steps
    assert steps.replica.nunique() > 1
    # lockstep: every step that ends at a given time started at the same time on every rank
    assert (steps.groupby("end_s").start_s.nunique() == 1).all()


def group_spec(**fields: object) -> Scenario:
    data = scenario_data(
        name="t",
        model="deepseek-v3",
        group={"hardware": "h100_sxm", **fields},
        input_len=64,
        output_len=4,
        num_prompts=4,
    )
    return Scenario.model_validate(data)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"data_parallel_size": 16}, "data_parallel_size"),  # DP attention needs EP
        (
            {
                "data_parallel_size": 16,
                "enable_expert_parallel": True,
                "pipeline_parallel_size": 2,
                "pipeline_micro_batching": True,
            },
            "pipeline_micro_batching",
        ),
        (
            {
                "tensor_parallel_size": 8,
                "enable_expert_parallel": True,
                "expert_load_imbalance": 1.2,
                "expert_routing_skew": 0.5,
            },
            "expert_load_imbalance",
        ),
        ({"tensor_parallel_size": 8, "expert_load_imbalance": 1.2}, "expert_load_imbalance"),
    ],
)
def test_bad_group_fields(fields: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as err:
        runner.run(group_spec(**fields))
    assert err.value.field == field


def test_routing_skew_sets_the_imbalance() -> None:
    spec = group_spec(tensor_parallel_size=8, enable_expert_parallel=True, expert_routing_skew=0.5)
    dep = runner.group_deployment(load_model("deepseek-v3"), spec.replicas[0])
    expected = expert_imbalance_from_skew(num_experts=256, ep=8, skew=0.5)
    assert dep.layout.expert_load_imbalance == pytest.approx(expected)
    assert dep.layout.ep == 8


def test_bench_throughput_with_expert_parallel(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "throughput", "--hardware", "h100_sxm", "--model", "deepseek-v3"]
    args += ["--input-len", "256", "--output-len", "16", "--num-prompts", "64", "--json"]
    code, out, err = run_cli(capsys, *args, "-dp", "16", "--enable-expert-parallel")
    assert code == 0, err
    assert '"requests_per_second"' in out
    code, _, err = run_cli(capsys, *args, "-dp", "2")  # independent replicas: do not fit
    assert code == 2 and "does not fit" in err
    code, _, err = run_cli(
        capsys, "bench", "throughput", "--hardware", "h100_sxm", "--model", "llama-3.1-8b",
        "--enable-expert-parallel", "--num-prompts", "4",
    )  # fmt: skip
    assert code == 2 and "no experts" in err


def test_simulate_runs_a_wide_ep_layout_as_one_dp_group() -> None:
    dep = sim.deployment(
        model="deepseek-v3", hardware="h100_sxm", data_parallel_size=16, expert_parallel_size=16
    )
    result = sim.simulate(dep, requests=make_requests(*[(0.0, 500, 8)] * 32))
    assert result.num_replicas == 16
    assert (result.steps.groupby("end_s").start_s.nunique() == 1).all()
