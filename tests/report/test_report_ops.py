"""Per-op costs of representative steps: they are the cost model's, and add up to the step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from factories import cost_model_step_s, gpu_step

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment, deployment
from simulator.report import run_op_costs, step_op_costs
from simulator.report.load import RunFolder, load
from simulator.report.ops import representative_shapes


@pytest.fixture(scope="module")
def dep() -> Deployment:
    return deployment(model="llama-3.1-8b", hardware="h100_sxm")


def test_prefill_ops_are_the_cost_model_ops(dep: Deployment) -> None:
    costs = step_op_costs(dep, prompt_tokens=512, decode_batch=0, context_len=0)
    assert set(costs["phase"]) == {"prefill"}
    m = dep.model
    qkv = costs[costs["op"] == "qkv_proj"].iloc[0]
    heads, kv_heads, d = m.attention.num_heads, m.attention.num_kv_heads, m.attention.head_dim
    # 2 x tokens x (q + k + v outputs) x hidden, once per layer
    assert qkv["flops"] == pytest.approx(
        2 * 512 * (heads + 2 * kv_heads) * d * m.hidden_size * m.num_layers
    )
    assert qkv["intensity_flop_per_byte"] == pytest.approx(qkv["flops"] / qkv["bytes"])
    assert qkv["achieved_flops_per_s"] == pytest.approx(qkv["flops"] / qkv["total_s"])
    gpu = costs[costs["kind"] != "engine"]["total_s"].sum()
    exact = gpu_step(dep, BatchShape.prefill(batch_size=1, prompt_len=512))
    assert gpu == pytest.approx(exact.seconds)


@pytest.mark.parametrize("enforce_eager", [False, True])
def test_each_phase_adds_up_to_the_engine_step_time(dep: Deployment, enforce_eager: bool) -> None:
    costs = step_op_costs(
        dep, prompt_tokens=300, decode_batch=16, context_len=700, enforce_eager=enforce_eager
    )
    wall = (costs["total_s"] - costs["hidden_s"]).groupby(costs["phase"]).sum()
    batch = BatchShape.decode(batch_size=16, context_len=700)
    expected = cost_model_step_s(dep, batch, num_seqs=16, enforce_eager=enforce_eager)
    assert wall["decode"] == pytest.approx(expected)
    engine = costs[(costs["kind"] == "engine") & (costs["phase"] == "decode")]
    launch = "launch_eager" if enforce_eager else "launch_graph"
    assert set(engine["op"]) == {"cpu_step", "cpu_per_seq", launch}
    assert costs[costs["kind"] == "engine"]["intensity_flop_per_byte"].isna().all()


def test_representative_shapes_are_the_medians() -> None:
    requests = pd.DataFrame(
        {
            "prompt_tokens": [100, 200, 300, 999],
            "output_tokens": [10, 20, 30, 0],
            "finish_s": [1.0, 2.0, 3.0, np.nan],  # the unfinished one is left out
        }
    )
    steps = pd.DataFrame(
        {
            "num_seqs": [1, 2, 4, 4, 7],
            "prefill_tokens": [100, 0, 0, 0, 50],
            "decode_tokens": [0, 2, 4, 4, 6],
        }
    )
    # prompt 200, decode batch median(2, 4, 4) = 4, context 200 + 20 / 2
    assert representative_shapes(requests, steps) == (200, 4, 210)
    prefill_only = steps.assign(decode_tokens=0, prefill_tokens=10)
    assert representative_shapes(requests, prefill_only)[1] == 0


def test_run_op_costs_of_a_saved_run(run_folder: Path) -> None:
    run = load(run_folder)
    assert isinstance(run, RunFolder) and run.scenario is not None
    ops = run_op_costs(run.scenario, run.requests, run.steps)
    assert ops.deployment.hardware.id == "h100_sxm"
    assert 128 <= ops.prompt_tokens <= 384  # input_len 256, range_ratio 0.5
    assert ops.decode_batch >= 1
    assert set(ops.costs["phase"]) == {"prefill", "decode"}
