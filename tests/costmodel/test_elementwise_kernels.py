"""One-block-per-token elementwise kernels: vLLM's launch rules, the time their launch costs,
and which engines and models run them (`costmodel.elementwise_kernels`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clitools import run_cli
from hypothesis import given
from hypothesis import strategies as st

from simulator.api import elementwise_cost
from simulator.costmodel.batch import BatchShape, Num
from simulator.costmodel.deployment import deployment
from simulator.costmodel.elementwise_kernels import (
    act_launch,
    norm_launch,
    resident_blocks,
    rotary_launch,
    row_time_s,
)
from simulator.costmodel.op import Op, RowLaunch
from simulator.costmodel.ops import elementwise, step_ops
from simulator.costmodel.roofline import evaluate
from simulator.costmodel.step import step_cost
from simulator.errors import SpecError
from simulator.specs import load_engine, load_hardware

H100 = load_hardware("h100_sxm")  # calibrated: has the fitted row factors


def _launch(launch: RowLaunch) -> tuple[float, float]:
    return float(np.asarray(launch.threads)), float(np.asarray(launch.trips))


def test_launch_rules_follow_vllms_kernels() -> None:
    # RMSNorm, hidden 4096: 1024 threads, 4 elements each, two passes over them
    assert _launch(norm_launch(8.0, 4096.0)) == (1024.0, 8.0)
    # rotary, Llama-2-7B TP1 (32 query and 32 KV heads of 128): 2048 pairs over 512 threads
    assert _launch(rotary_launch(8.0, 32.0, 32.0, 128.0)) == (512.0, 8.0)
    # Llama-3-8B TP8 (4 query heads, 1 KV head): 256 threads, one trip for each
    assert _launch(rotary_launch(8.0, 4.0, 1.0, 128.0)) == (256.0, 2.0)
    # SiLU-and-mul, d = 11008 / 8 = 1376: 1024 threads, the slowest loops twice
    assert _launch(act_launch(8.0, 1376.0)) == (1024.0, 2.0)
    assert _launch(act_launch(8.0, 512.0)) == (512.0, 1.0)


def test_resident_blocks_by_threads_per_sm() -> None:
    units = H100.compute.units
    assert float(resident_blocks(H100, 1024.0)) == 2 * units  # 2048 threads per SM
    assert float(resident_blocks(H100, 256.0)) == 8 * units
    assert float(resident_blocks(H100, 32.0)) == 32 * units  # at most 32 blocks per SM


def _act(tokens: Num, d: float = 11008.0) -> Op:
    return elementwise("act", bytes_=3 * tokens * d * 2.0, count=1, launch=act_launch(tokens, d))


def test_a_lone_block_costs_its_trips_of_idle_latency() -> None:
    mem = H100.efficiency.memory
    assert float(row_time_s(H100, _act(1.0))) == pytest.approx(11 * mem.row_latency_s)
    assert float(row_time_s(H100, _act(0.0))) == 0.0


@given(st.lists(st.floats(1.0, 1e5), min_size=2, max_size=20))
def test_row_time_never_falls_as_the_tokens_grow(tokens: list[float]) -> None:
    t = np.sort(np.asarray(tokens))
    times = row_time_s(H100, _act(t))
    assert np.all(np.diff(times) >= -1e-18)


def test_engines_choose_which_kernels_pay_their_launch() -> None:
    op = _act(4096.0)
    v1 = float(evaluate([op], H100, load_engine("vllm"))[0].time_s[0])
    v06 = float(evaluate([op], H100, load_engine("vllm-0.6"))[0].time_s[0])
    alone = float(evaluate([op], H100)[0].time_s[0])
    fixed = H100.efficiency.memory.row_fixed_s
    assert fixed is not None
    assert v06 == pytest.approx(alone)  # no engine: the kernels as Vidur timed them
    assert v06 == pytest.approx(float(row_time_s(H100, op)) + fixed)
    assert v06 > 1.2 * v1  # V1's Inductor kernel streams its bytes
    # a norm's launch only under engines that run vLLM 0.2's scalar RMSNorm
    norm = elementwise(
        "norm", bytes_=4096 * 4096 * 6.0, count=1, launch=norm_launch(4096.0, 4096.0)
    )
    costs = {
        e: evaluate([norm], H100, load_engine(e))[0].time_s[0] for e in ("vllm-0.2", "vllm-0.6")
    }
    assert costs["vllm-0.2"] > 1.2 * costs["vllm-0.6"]


def test_a_device_without_row_factors_prices_bytes_only() -> None:
    h200 = load_hardware("h200_sxm")
    assert not h200.efficiency.memory.row_wave_s
    op = _act(4096.0)
    plain = elementwise("act", bytes_=op.bytes, count=1)
    engine = load_engine("vllm-0.6")
    assert float(evaluate([op], h200, engine)[0].time_s[0]) == pytest.approx(
        float(evaluate([plain], h200, engine)[0].time_s[0])
    )


def test_alibi_and_layernorm_models_have_no_rotary_kernel_nor_norm_launch() -> None:
    batch = BatchShape.prefill(batch_size=1, prompt_len=512)
    bloom = deployment(model="bloom-176b", hardware="a100_sxm_80gb", tensor_parallel_size=8)
    ops = {op.name: op for op in step_ops(bloom.model, bloom.layout, bloom.precision, batch)}
    assert "rotary" not in ops and ops["norm"].launch is None
    llama = deployment(model="llama-2-70b", hardware="a100_sxm_80gb", tensor_parallel_size=8)
    ops = {op.name: op for op in step_ops(llama.model, llama.layout, llama.precision, batch)}
    assert ops["rotary"].launch is not None and ops["norm"].launch is not None


def test_without_an_engine_a_decode_step_pays_the_launches() -> None:
    dep = deployment(model="llama-2-7b", hardware="h100_sxm")
    batch = BatchShape.decode(batch_size=1, context_len=1024)
    args = (dep.model, dep.hardware, dep.layout, dep.precision, batch)
    alone = step_cost(*args).seconds
    v1 = step_cost(*args, engine=load_engine("vllm")).seconds
    assert alone > v1


ACT = ["op", "elementwise", "--hardware", "h100_sxm", "--kernel", "act", "--tokens", "4000"]


def test_op_elementwise_prices_the_launch_under_engines_that_run_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = {}
    for engine in ([], ["--engine", "vllm"], ["--engine", "vllm-0.6"]):
        code, out, _ = run_cli(capsys, *ACT, "--intermediate-size", "11008", *engine, "--json")
        assert code == 0
        results[" ".join(engine)] = json.loads(out)
    alone, v1, v06 = results[""], results["--engine vllm"], results["--engine vllm-0.6"]
    # SiLU-and-mul of 4000 x 11008: reads 2 and writes 1 half of 11008 per token
    assert alone["bytes"] == 3 * 4000 * 11008 * 2
    assert alone["latency_s"] == pytest.approx(
        float(evaluate([_act(4000.0)], H100)[0].time_s[0]), rel=1e-9
    )
    assert v06["kernel_s"] == pytest.approx(alone["latency_s"], rel=1e-9)
    assert v1["kernel_s"] < 0.8 * v06["kernel_s"]  # V1's vectorised kernel: bytes only
    api = elementwise_cost(hardware="h100_sxm", kernel="act", tokens=4000, intermediate_size=11008)
    assert float(np.ravel(api.time_s)[0]) == pytest.approx(alone["latency_s"])  # type: ignore[union-attr]


def test_op_elementwise_names_the_missing_dimension(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, *ACT[:-3], "rotary", "--tokens", "8", "--num-heads", "32")
    assert code == 2 and out == "" and "num_kv_heads" in err
    with pytest.raises(SpecError, match="unknown elementwise kernel"):
        elementwise_cost(hardware="h100_sxm", kernel="gelu", tokens=8)
