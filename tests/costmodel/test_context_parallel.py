"""Context parallelism: ring-attention prefill, KV-sharded decode, the N-fold KV capacity, the
fabric a CP group runs over, and the layouts it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from clitools import one_line_error, run_cli
from factories import cost_model_step_s, plan_data, scenario_data, write_yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment, deployment
from simulator.costmodel.ops import step_ops
from simulator.costmodel.roofline import evaluate
from simulator.costmodel.step import step_cost
from simulator.errors import SpecError
from simulator.planning.layouts import enumerate_layouts
from simulator.planning.spec import PlanSpec
from simulator.report.labels import replica_label
from simulator.serving.steptime import StepTimer
from simulator.specs import load_hardware, load_model
from simulator.specs.deployment import Parallelism

PROMPT = 131072  # 128K tokens


def llama70b(cp: int, hardware: str = "h100_sxm") -> Deployment:
    return deployment(
        model="llama-3.1-70b", hardware=hardware, tensor_parallel_size=8, context_parallel_size=cp
    )


def op_totals(dep: Deployment, batch: BatchShape) -> dict[str, float]:
    """Seconds of each op of a step (count x time), by name."""
    cost = step_cost(dep.model, dep.hardware, dep.layout, dep.precision, batch, engine=dep.engine)
    return {c.op.name: float(c.total_s[0]) for c in cost.costs}


def test_a_128k_prefill_on_two_tp8_nodes_takes_half_the_attention_plus_the_ring() -> None:
    """Llama-3.1-70B, one 128K-token prompt, TP8 on one H100 node vs TP8 x CP2 on two: each
    rank computes half of the causal pairs and the GEMMs of half the tokens; its KV shard
    (65,536 tokens x 1 KV head x 128 x K,V x 2 bytes = 33.6 MB a layer) crosses the node
    boundary once a layer, over the 50 GB/s NIC at the fabric's bus-bandwidth efficiency: about
    1 ms, under the 14 ms the rank attends to the block in hand, so none of it shows."""
    batch = BatchShape.prefill(batch_size=1, prompt_len=PROMPT)
    one, two = llama70b(1), llama70b(2)
    alone, split = op_totals(one, batch), op_totals(two, batch)
    assert split["attention_prefill"] / alone["attention_prefill"] == pytest.approx(0.5, abs=0.05)
    for gemm in ("qkv_proj", "o_proj", "up_proj", "down_proj"):
        assert split[gemm] / alone[gemm] == pytest.approx(0.5, rel=0.02)
    ops = {op.name: op for op in step_ops(two.model, two.layout, two.precision, batch)}
    ring = ops["cp_ring_kv"]
    assert ring.scale_out and ring.count == 80
    assert float(ring.msg_bytes) == pytest.approx(65536 * 2 * 128 * 2)
    raw = evaluate([ring], two.hardware, two.engine)[0].time_s[0]
    coll, net = two.hardware.efficiency.collective, two.hardware.interconnect
    eff = coll.busbw_fraction * float(coll.size_curve(float(ring.msg_bytes)))
    assert raw == pytest.approx(float(ring.msg_bytes) / (50e9 * eff) + net.scale_out_latency_s)
    assert raw < 1.5e-3
    assert split["cp_ring_kv"] == 0.0  # hidden under the attention
    total = sum(split.values())
    assert total / sum(alone.values()) == pytest.approx(0.5, abs=0.05)


def test_a_ring_slower_than_the_attention_shows_what_it_outlasts() -> None:
    """With a 1 GB/s scale-out link each of the ring's transfers (33.6 ms) outlasts the 14 ms
    of attention it overlaps: per layer the rank pays its attention plus (cp - 1) x the
    difference (Liu et al.'s max(compute, communication) per ring step)."""
    hw = load_hardware("h100_sxm")
    slow = hw.model_copy(
        update={
            "interconnect": hw.interconnect.model_copy(update={"scale_out_bw_bytes_per_s": 1e9})
        }
    )
    dep = llama70b(2, hardware=slow)  # type: ignore[arg-type]
    batch = BatchShape.prefill(batch_size=1, prompt_len=PROMPT)
    ops = step_ops(dep.model, dep.layout, dep.precision, batch)
    alone = {c.op.name: c for c in (evaluate([op], dep.hardware, dep.engine)[0] for op in ops)}
    transfer = float(alone["cp_ring_kv"].time_s[0])
    attention = float(alone["attention_prefill"].time_s[0])
    assert transfer > attention / 2
    split = op_totals(dep, batch)
    assert split["cp_ring_kv"] == pytest.approx(80 * (transfer - attention / 2))


def test_cp_ranks_in_one_node_talk_over_nvlink() -> None:
    dep = deployment(
        model="llama-3.1-8b", hardware="h100_sxm", tensor_parallel_size=2, context_parallel_size=4
    )
    batch = BatchShape.mixed(chunks=[(8192, 0, True)], decode_context_lens=[4000] * 4)
    ops = {op.name: op for op in step_ops(dep.model, dep.layout, dep.precision, batch)}
    assert not any(ops[n].scale_out for n in ("cp_ring_kv", "cp_decode_combine"))
    assert ops["cp_ring_kv"].count == 32 * 3


def test_decode_reads_a_cp_th_of_the_kv_and_merges_partial_results() -> None:
    """DistAttention (Infinite-LLM): each rank attends to its 1/cp of every sequence's KV, the
    queries gathered to all ranks and the partial outputs with their log-sum-exp gathered
    and merged, once a layer."""
    batch = BatchShape.decode(batch_size=8, context_len=100_000)
    one, four = llama70b(1), llama70b(4)
    kv = {
        cp: next(
            op.kv_bytes
            for op in step_ops(d.model, d.layout, d.precision, batch)
            if op.name == "attention_decode"
        )
        for cp, d in ((1, one), (4, four))
    }
    assert float(kv[4]) == pytest.approx(float(kv[1]) / 4)
    ops = {op.name: op for op in step_ops(four.model, four.layout, four.precision, batch)}
    heads = 64 // 8
    assert float(ops["cp_decode_q_all_gather"].msg_bytes) == 8 * heads * 128 * 2
    assert float(ops["cp_decode_combine"].msg_bytes) == 8 * heads * (128 * 2 + 4)
    assert ops["cp_decode_combine"].count == 80 and ops["cp_decode_combine"].group_size == 4
    assert ops["cp_decode_combine"].scale_out  # 32 GPUs: four nodes


def test_the_serving_timer_matches_the_cost_model_under_cp() -> None:
    dep = deployment(
        model="llama-3.1-8b", hardware="h100_sxm", tensor_parallel_size=4, context_parallel_size=4
    )
    timer = StepTimer(dep, max_num_seqs=64, max_num_batched_tokens=8192, max_context=65536)
    rng = np.random.default_rng(1)
    for _ in range(40):
        chunks = [
            (int(rng.integers(1, 2700)), int(rng.integers(0, 30000)), True)
            for _ in range(int(rng.integers(0, 3)))
        ]
        decodes = rng.integers(1, 60000, int(rng.integers(0 if chunks else 1, 40))).tolist()
        batch = BatchShape.mixed(chunks=chunks, decode_context_lens=decodes)
        want = cost_model_step_s(dep, batch, num_seqs=len(chunks) + len(decodes))
        got = timer.mixed(chunks=chunks, decode_contexts=decodes)
        assert got == pytest.approx(want, rel=0.01)


MODELS = ["llama-3.1-8b", "llama-3.1-70b", "mistral-7b", "qwen2.5-72b", "mixtral-8x7b"]
HARDWARE = ["h100_sxm", "a100_sxm_80gb", "l40s", "gh200", "mi300x"]


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    hardware=st.sampled_from(HARDWARE),
    tp=st.sampled_from([1, 2, 4, 8]),
    cp=st.integers(1, 16),
    tokens=st.sampled_from([2048, 8192, 32768]),
)
def test_cp_never_reduces_kv_capacity(
    model: str, hardware: str, tp: int, cp: int, tokens: int
) -> None:
    """A replica of cp ranks holds at least cp times the tokens one rank would: the weights per
    device are the same, activations shrink, and each token's KV is split cp ways."""
    try:
        alone = deployment(model=model, hardware=hardware, tensor_parallel_size=tp)
        split = deployment(
            model=model, hardware=hardware, tensor_parallel_size=tp, context_parallel_size=cp
        )
    except SpecError:
        return  # a layout the model or device does not take
    before = alone.memory(max_num_batched_tokens=tokens)
    after = split.memory(max_num_batched_tokens=tokens)
    assert after.kv_capacity_tokens >= before.kv_capacity_tokens
    assert after.kv_capacity_tokens >= cp * before.kv_capacity_tokens
    assert after.fits or not before.fits


def test_gpus_are_tp_x_pp_x_cp() -> None:
    layout = Parallelism(tp=8, pp=2, cp=4, dp=3)
    assert layout.devices_per_replica == 64 and layout.num_devices == 192
    assert layout.cp_crosses_nodes(8) and not Parallelism(tp=2, cp=4).cp_crosses_nodes(8)


def test_tp_groups_that_would_straddle_nodes_are_refused() -> None:
    hw = load_hardware("h100_sxm")
    six = hw.model_copy(
        update={"interconnect": hw.interconnect.model_copy(update={"gpus_per_node": 6})}
    )
    model = load_model("llama-3.1-8b")
    Parallelism(tp=4, cp=1).check(model, six)
    with pytest.raises(SpecError, match="straddle"):
        Parallelism(tp=4, cp=2).check(model, six)


# -- the CLI ------------------------------------------------------------------------------------
def test_a_cp_group_whose_tp_groups_would_straddle_nodes_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    six = write_yaml(
        tmp_path / "six.yaml", {"base": "h100_sxm", "interconnect": {"gpus_per_node": 6}}
    )
    args = ("bench", "latency", "--model", "llama-3.1-8b", "--hardware", str(six), "-tp", "4")
    assert run_cli(capsys, *args, "--input-len", "64")[0] == 0  # one node: fine
    err = one_line_error(capsys, *args, "-cp", "2", "--input-len", "64")
    assert "context_parallel_size" in err and "straddle" in err


def test_a_prompt_too_long_for_one_replicas_kv_fits_with_cp(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Llama-3.1-8B on an L4 (24 GB): a 40K-token prompt needs 2,501 KV blocks of 16 tokens
    and one GPU holds fewer; two CP ranks hold twice as many and serve it."""
    args = ("bench", "throughput", "--model", "llama-3.1-8b", "--hardware", "l4")
    args += ("--input-len", "40000", "--output-len", "4", "--num-prompts", "1", "--json")
    err = one_line_error(capsys, *args)
    assert "KV blocks" in err
    code, out, err = run_cli(capsys, *args, "-cp", "2")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["num_requests"] == 1 and summary["total_num_tokens"] == 40004


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("-cp", "0"), "context_parallel_size"),
        (("--model", "deepseek-v3", "-tp", "8", "-cp", "2"), "GQA/MHA attention only"),
        (
            (
                "-cp",
                "2",
                "--speculative-config",
                '{"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.7}',
            ),
            "speculative decoding with context parallelism",
        ),
    ],
)
def test_bad_cp_layouts_exit_2(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], says: str
) -> None:
    args = ["bench", "latency", "--hardware", "h200_sxm", "--input-len", "64"]
    if "--model" not in flags:
        args += ["--model", "llama-3.1-8b"]
    err = one_line_error(capsys, *args, *flags)
    assert says in err


def test_a_scenario_takes_context_parallel_size(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = scenario_data(
        input_len=20000,
        output_len=8,
        num_prompts=2,
        group={"hardware": "h100_sxm", "tensor_parallel_size": 2, "context_parallel_size": 2},
    )
    path = write_yaml(tmp_path / "cp.yaml", data)
    code, out, err = run_cli(capsys, "run", str(path), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["completed"] == 2 and summary["num_gpus"] == 4  # tp 2 x cp 2
    bad = write_yaml(
        tmp_path / "bad.yaml",
        {**data, "replicas": [{"hardware": "h100_sxm", "context_parallel_size": 0}]},
    )
    err = one_line_error(capsys, "run", str(bad))
    assert "context_parallel_size" in err and "bad.yaml" in err


def test_meta_context_parallel_scaling_in_direction_and_magnitude() -> None:
    """Meta, arXiv 2411.01783v3: Llama-3-405B (FP8, TP8 per H100 node) prefills 128K tokens in
    about 60 s on one node (section 1) and 3.8 s on 16 (CP16), 1M in 77 s on 16. llmsim's step
    cost scales as theirs (15.8x from 1 to 16 nodes) and stays within 2x of each time."""

    def prefill_s(tokens: int, cp: int) -> float:
        dep = deployment(
            model="llama-3.1-405b",
            hardware="h100_sxm",
            tensor_parallel_size=8,
            context_parallel_size=cp,
            quantization="fp8",
        )
        batch = BatchShape.prefill(batch_size=1, prompt_len=tokens)
        return step_cost(
            dep.model, dep.hardware, dep.layout, dep.precision, batch, engine=dep.engine
        ).seconds

    one, sixteen, million = prefill_s(PROMPT, 1), prefill_s(PROMPT, 16), prefill_s(1_000_000, 16)
    assert 14.0 < one / sixteen < 17.0
    for predicted, paper in ((one, 60.0), (sixteen, 3.8), (million, 77.0)):
        assert paper / 2 < predicted < paper * 2


def test_plan_candidates_list_cp_values() -> None:
    """A plan's `context_parallel_size` list makes layouts of tp x pp x cp GPUs, each run as a
    replica group with that CP size."""
    data = plan_data(candidates={"hardware": ["h100_sxm"], "context_parallel_size": [1, 2]})
    layouts = enumerate_layouts(PlanSpec.model_validate(data))
    assert [(layout.cp, layout.gpus) for layout in layouts] == [(1, 1), (2, 2)]
    assert layouts[1].key.endswith("/cp2")
    spec = PlanSpec.model_validate(data)
    assert layouts[1].replica_group(spec).context_parallel_size == 2


def test_reports_label_cp_groups() -> None:
    group = {"hardware": "h100_sxm", "tensor_parallel_size": 8, "context_parallel_size": 2}
    assert replica_label(group) == "1 x h100_sxm TP8 CP2"
