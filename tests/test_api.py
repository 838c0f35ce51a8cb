"""The flat Python API (`simulator.*`): what it returns for good input and the SpecError it
raises for bad input, never another exception type."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import simulator
from simulator import SpecError
from simulator.costmodel.roofline import OpCost
from simulator.costmodel.single_ops import op_json

OP_KEYS = {"latency_s", "bound", "flops", "bytes"}


# Runs one API call in a child process that ends itself (os._exit) once the call has executed
# `budget` Python lines: the only safe way to test a code path that may never return, and one
# that counts work, not seconds, so a busy machine cannot fail it (a 0.5 s timer did). An
# exception raised in this process would not do: one raised while a finalizer runs is swallowed.
OUT_OF_STEPS = 75  # the child's exit status when the call used up its budget
BUDGETED_CHILD = """
import os
import sys
import simulator

simulator.deployment(model="llama-3.1-8b", hardware="h100_sxm")  # load the specs first
steps = 0


def call():
    {call}


def count(frame, event, arg):
    global steps
    steps += 1
    if steps > {budget}:
        os._exit({status})
    return count


sys.settrace(count)
try:
    call()
except simulator.SpecError as exc:
    sys.settrace(None)
    print(exc)
sys.settrace(None)
"""


def run_with_step_budget(call: str, *, budget: int = 2_000_000) -> subprocess.CompletedProcess[str]:
    """Run `call` (one line of Python) in a child; returncode OUT_OF_STEPS means it executed more
    than `budget` traced events (lines, calls, returns), as a call that never returns would
    (one that loops without calling a Python function or starting a line is not seen; the
    simulator's loops do both)."""
    code = BUDGETED_CHILD.format(budget=budget, status=OUT_OF_STEPS, call=call)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


def decode_attention(**overrides: Any) -> OpCost:
    args: dict[str, Any] = dict(
        hardware="h100_sxm",
        phase="decode",
        batch_size=8,
        seq_len=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
    )
    return simulator.attention_cost(**{**args, **overrides})


# -- good input -----------------------------------------------------------------------------------
def test_public_names_are_exported() -> None:
    for name in simulator.__all__:
        assert hasattr(simulator, name), name


def test_the_contract_names_of_the_flat_api_are_functions() -> None:
    # INTERFACE.md: "load_hardware, load_model, load_scenario, estimate, run, sweep, ..."; a
    # submodule of the same name would shadow one (`simulator.sweep` was the sweep module)
    for name in ("load_hardware", "load_model", "load_scenario", "estimate", "run", "sweep"):
        assert callable(getattr(simulator, name)), name


def test_the_package_lists_the_facade() -> None:
    assert simulator.__all__ == simulator.api.__all__
    assert len(set(simulator.__all__)) == len(simulator.__all__)  # one name a thing


def test_estimate_returns_a_latency_result() -> None:
    r = simulator.estimate(
        model="llama-3.1-8b", hardware="h100_sxm", batch_size=4, input_len=256, output_len=16
    )
    assert isinstance(r, simulator.LatencyResult)
    assert 0 < r.ttft_s < r.latency_s
    assert r.tpot_s > 0
    assert r.memory.fits
    assert r.config["model"] == "llama-3.1-8b"
    assert {"prefill", "decode"} == set(r.breakdown()["phase"])


def test_estimate_takes_spec_objects_as_well_as_ids() -> None:
    by_id = simulator.estimate(model="llama-3.1-8b", hardware="h100_sxm", output_len=4)
    by_spec = simulator.estimate(
        model=simulator.load_model("llama-3.1-8b"),
        hardware=simulator.load_hardware("h100_sxm"),
        engine=simulator.load_engine("vllm"),
        output_len=4,
    )
    assert by_spec.latency_s == by_id.latency_s


def test_deployment_resolves_precision() -> None:
    dep = simulator.deployment(model="llama-3.1-70b", hardware="h100_sxm", quantization="fp8")
    assert (dep.precision.weights, dep.precision.compute) == ("fp8", "fp8")  # W8A8
    dep = simulator.deployment(model="llama-3.1-70b", hardware="a100_sxm_80gb", quantization="fp8")
    assert (dep.precision.weights, dep.precision.compute) == ("fp8", "bf16")  # weight-only
    assert dep.precision.weight_only
    dep = simulator.deployment(model="llama-2-7b", hardware="h100_sxm", kv_cache_dtype="fp8")
    assert (dep.precision.activations, dep.precision.kv_cache) == ("fp16", "fp8")


def test_nvfp4_runs_w4a4_on_blackwell_and_weight_only_elsewhere() -> None:
    b200 = simulator.deployment(
        model="llama-3.1-70b", hardware="b200", engine="trtllm", quantization="fp4"
    )
    assert (b200.precision.weights, b200.precision.compute) == ("fp4", "fp4")
    assert not b200.precision.weight_only
    h100 = simulator.deployment(model="llama-3.1-70b", hardware="h100_sxm", quantization="fp4")
    assert (h100.precision.weights, h100.precision.compute) == ("fp4", "bf16")  # Marlin FP4
    assert h100.precision.weight_only
    # an engine of the era before NVFP4 says so
    with pytest.raises(SpecError, match="no fp4 kernels"):
        simulator.deployment(
            model="llama-3.1-70b", hardware="b200", engine="vllm-0.6", quantization="fp4"
        )


def test_expert_parallel_on_a_moe_model() -> None:
    dep = simulator.deployment(
        model="mixtral-8x7b", hardware="h100_sxm", tensor_parallel_size=8, expert_parallel_size=8
    )
    assert dep.layout.ep == 8


@pytest.mark.parametrize(
    "cost",
    [
        lambda: simulator.gemm_cost(hardware="h100_sxm", m=128, n=4096, k=4096),
        lambda: decode_attention(),
        lambda: simulator.allreduce_cost(hardware="h100_sxm", num_devices=8, size_bytes=1 << 20),
    ],
    ids=["gemm", "attention", "allreduce"],
)
def test_op_json_has_the_contract_keys(cost: Callable[[], OpCost]) -> None:
    data = op_json(cost())
    assert set(data) >= OP_KEYS
    assert data["bound"] in ("compute", "memory", "latency", "network")
    assert all(isinstance(data[k], float) for k in ("latency_s", "flops", "bytes"))
    assert data["latency_s"] > 0


def test_allreduce_bytes_are_the_message_size() -> None:
    data = op_json(simulator.allreduce_cost(hardware="h100_sxm", num_devices=4, size_bytes=4096))
    assert data["bytes"] == 4096.0
    assert data["flops"] == 0.0


def test_int8_gemm_on_a100_uses_its_int8_unit() -> None:
    bf16 = simulator.gemm_cost(hardware="a100_sxm_80gb", m=8192, n=8192, k=8192)
    int8 = simulator.gemm_cost(hardware="a100_sxm_80gb", m=8192, n=8192, k=8192, dtype="int8")
    assert float(np.ravel(int8.time_s)[0]) < float(np.ravel(bf16.time_s)[0])


# -- bad input: always SpecError ------------------------------------------------------------------
NAN, INF = float("nan"), float("inf")
ATTENTION = {"phase": "decode", "batch_size": 4, "seq_len": 100, "num_heads": 32}
ATTENTION |= {"num_kv_heads": 8, "head_dim": 128}

BAD_CALLS: dict[str, tuple[Callable[[], object], str]] = {
    # NaN passes every `< 1` check: it once priced a GEMM at 0 s and an all-reduce at 0 s
    "gemm-nan": (
        lambda: simulator.gemm_cost(hardware="h100_sxm", m=NAN, n=16, k=16),
        "m: must be a finite number, got nan",
    ),
    "gemm-fraction": (
        lambda: simulator.gemm_cost(hardware="h100_sxm", m=1.5, n=16, k=16),
        "m: must be a whole number, got 1.5",
    ),
    "gemm-bool": (
        lambda: simulator.gemm_cost(hardware="h100_sxm", m=True, n=16, k=16),
        "m: expected a number, got True",
    ),
    "allreduce-nan": (
        lambda: simulator.allreduce_cost(hardware="h100_sxm", num_devices=8, size_bytes=NAN),
        "size_bytes: must be a finite number",
    ),
    "allreduce-inf": (
        lambda: simulator.allreduce_cost(hardware="h100_sxm", num_devices=8, size_bytes=INF),
        "size_bytes: must be a finite number",
    ),
    "attention-nan": (
        lambda: simulator.attention_cost(hardware="h100_sxm", **(ATTENTION | {"seq_len": NAN})),
        "seq_len: must be a finite number",
    ),
    "attention-bad-dtype": (  # named the KV cache dtype 'auto' before
        lambda: simulator.attention_cost(hardware="h100_sxm", **ATTENTION, dtype="xx"),
        "dtype: unknown dtype 'xx'",
    ),
    "attention-int8-kv": (  # a ValidationError before
        lambda: simulator.attention_cost(hardware="h100_sxm", **ATTENTION, kv_cache_dtype="int8"),
        "kv_cache_dtype: unknown KV cache dtype 'int8'",
    ),
    "rotary-more-kv-heads": (
        lambda: simulator.elementwise_cost(
            hardware="h100_sxm",
            kernel="rotary",
            tokens=4,
            num_heads=8,
            num_kv_heads=16,
            head_dim=64,
        ),
        "num_heads 8 is not a multiple of num_kv_heads 16",
    ),
    "op-engine-not-on-device": (
        lambda: simulator.gemm_cost(hardware="mi300x", m=16, n=16, k=16, engine="trtllm"),
        "TensorRT-LLM runs on nvidia GPUs",
    ),
    "estimate-input-len-nan": (  # ran out of memory before
        lambda: simulator.estimate(model="llama-3.1-8b", hardware="h100_sxm", input_len=NAN),
        "input_len: must be a finite number",
    ),
    "estimate-fractional-batch": (
        lambda: simulator.estimate(model="llama-3.1-8b", hardware="h100_sxm", batch_size=1.5),
        "batch_size: must be a whole number",
    ),
    "estimate-nan-step-budget": (  # 'does not fit: activations nan GiB' before
        lambda: simulator.estimate(
            model="llama-3.1-8b", hardware="h100_sxm", max_num_batched_tokens=NAN
        ),
        "max_num_batched_tokens: must be a finite number",
    ),
    "deployment-entrypoint": (
        lambda: simulator.deployment(model="llama-3.1-8b", hardware="h100_sxm", entrypoint="x"),  # type: ignore[arg-type]
        "unknown entrypoint 'x'",
    ),
    "hardware-none": (
        lambda: simulator.load_hardware(None),  # type: ignore[arg-type]
        "hardware: expected an id or a path, got None",
    ),
    "model-number": (
        lambda: simulator.deployment(model=123, hardware="h100_sxm"),  # type: ignore[arg-type]
        "model: expected an id or a path, got 123",
    ),
    "imbalance-beyond-ep": (  # inf failed every request silently, energy NaN
        lambda: simulator.deployment(
            model="mixtral-8x7b",
            hardware="h100_sxm",
            tensor_parallel_size=2,
            expert_parallel_size=2,
            expert_load_imbalance=INF,
        ),
        "busiest of 2 EP ranks",
    ),
    # llama-3.1-8b has 32 attention heads: tp 3 does not divide them
    "tp-not-dividing-heads": (
        lambda: simulator.estimate(
            model="llama-3.1-8b", hardware="h100_sxm", tensor_parallel_size=3
        ),
        "tensor_parallel_size",
    ),
    "tp-not-dividing-heads-deployment": (
        lambda: simulator.deployment(
            model="llama-3.1-8b", hardware="h100_sxm", tensor_parallel_size=3
        ),
        "does not divide",
    ),
    "tp-beyond-a-node": (
        lambda: simulator.deployment(
            model="llama-3.1-8b", hardware="l40s", tensor_parallel_size=16
        ),
        "tensor_parallel_size",
    ),
    "unknown-model": (
        lambda: simulator.estimate(model="llama-9-1t", hardware="h100_sxm"),
        "unknown model id",
    ),
    "unknown-hardware": (
        lambda: simulator.estimate(model="llama-3.1-8b", hardware="h999"),
        "unknown hardware id",
    ),
    "unknown-hardware-gemm": (
        lambda: simulator.gemm_cost(hardware="tpu_v9", m=1, n=1, k=1),
        "unknown hardware id",
    ),
    "unknown-engine": (
        lambda: simulator.estimate(model="llama-3.1-8b", hardware="h100_sxm", engine="nope"),
        "unknown engine",
    ),
    "zero-batch": (
        lambda: simulator.estimate(model="llama-3.1-8b", hardware="h100_sxm", batch_size=0),
        "batch_size",
    ),
    "negative-input-len": (
        lambda: simulator.estimate(model="llama-3.1-8b", hardware="h100_sxm", input_len=-1),
        "input_len",
    ),
    "zero-output-len": (
        lambda: simulator.estimate(model="llama-3.1-8b", hardware="h100_sxm", output_len=0),
        "output_len",
    ),
    "zero-tp": (
        lambda: simulator.deployment(
            model="llama-3.1-8b", hardware="h100_sxm", tensor_parallel_size=0
        ),
        "tensor_parallel_size",
    ),
    "gemm-zero-m": (
        lambda: simulator.gemm_cost(hardware="h100_sxm", m=0, n=1, k=1),
        "m: must be at least 1",
    ),
    "gemm-negative-k": (
        lambda: simulator.gemm_cost(hardware="h100_sxm", m=1, n=1, k=-8),
        "k: must be at least 1",
    ),
    "gemm-unknown-dtype": (
        lambda: simulator.gemm_cost(hardware="h100_sxm", m=1, n=1, k=1, dtype="fp6"),
        "dtype",
    ),
    # Ampere has no fp8 matrix unit
    "fp8-gemm-on-a100": (
        lambda: simulator.gemm_cost(hardware="a100_sxm_80gb", m=64, n=64, k=64, dtype="fp8"),
        "no fp8 matrix unit",
    ),
    "attention-negative-seq-len": (lambda: decode_attention(seq_len=-4), "seq_len"),
    "attention-zero-batch": (lambda: decode_attention(batch_size=0), "batch_size"),
    "attention-heads-not-multiple-of-kv": (
        lambda: decode_attention(num_heads=32, num_kv_heads=5),
        "num_kv_heads",
    ),
    "attention-unknown-phase": (lambda: decode_attention(phase="verify"), "phase"),
    "attention-unknown-kv-dtype": (lambda: decode_attention(kv_cache_dtype="int3"), "kv_cache"),
    "allreduce-zero-bytes": (
        lambda: simulator.allreduce_cost(hardware="h100_sxm", num_devices=8, size_bytes=0),
        "size_bytes",
    ),
    "allreduce-zero-devices": (
        lambda: simulator.allreduce_cost(hardware="h100_sxm", num_devices=0, size_bytes=1),
        "num_devices",
    ),
    "allreduce-beyond-a-node": (
        lambda: simulator.allreduce_cost(hardware="h100_sxm", num_devices=12, size_bytes=1),
        "num_devices",
    ),
    "ep-on-a-dense-model": (
        lambda: simulator.deployment(
            model="llama-3.1-8b",
            hardware="h100_sxm",
            tensor_parallel_size=2,
            expert_parallel_size=2,
        ),
        "expert parallelism needs a MoE model",
    ),
    "ep-not-dividing-tp": (
        lambda: simulator.deployment(
            model="mixtral-8x7b",
            hardware="h100_sxm",
            tensor_parallel_size=2,
            expert_parallel_size=4,
        ),
        "ep",
    ),
    "pp-beyond-layers": (
        lambda: simulator.deployment(
            model="llama-3.1-8b", hardware="h100_sxm", pipeline_parallel_size=64
        ),
        "pipeline_parallel_size",
    ),
    "unknown-dtype": (
        lambda: simulator.deployment(model="llama-3.1-8b", hardware="h100_sxm", dtype="float64"),
        "dtype",
    ),
    "unknown-kv-cache-dtype": (
        lambda: simulator.deployment(
            model="llama-3.1-8b", hardware="h100_sxm", kv_cache_dtype="int3"
        ),
        "kv_cache_dtype",
    ),
    "does-not-fit": (
        lambda: simulator.estimate(model="llama-3.1-405b", hardware="rtx_4090"),
        "does not fit",
    ),
    "gpu-memory-utilization": (
        lambda: simulator.estimate(
            model="llama-3.1-8b", hardware="h100_sxm", gpu_memory_utilization=1.5
        ),
        "gpu_memory_utilization",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_raises_spec_error(case: str) -> None:
    call, fragment = BAD_CALLS[case]
    with pytest.raises(SpecError) as info:
        call()
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)  # one line for the CLI


def test_spec_error_is_a_value_error_with_parts() -> None:
    with pytest.raises(ValueError) as info:
        simulator.gemm_cost(hardware="h100_sxm", m=0, n=1, k=1)
    err = info.value
    assert isinstance(err, SpecError)
    assert err.field == "m"
    assert str(err) == err.line()


# -- bad knobs that must be rejected --------------------------------------------------------
def test_negative_max_num_seqs_is_rejected() -> None:
    with pytest.raises(SpecError, match="max_num_seqs"):
        simulator.estimate(model="llama-3.1-8b", hardware="h100_sxm", max_num_seqs=-1)


def test_negative_max_num_batched_tokens_is_rejected() -> None:
    proc = run_with_step_budget(
        "simulator.estimate(model='llama-3.1-8b', hardware='h100_sxm', max_num_batched_tokens=-1)"
    )
    assert proc.returncode == 0, f"exit {proc.returncode} ({OUT_OF_STEPS}: out of steps)"
    assert "max_num_batched_tokens" in proc.stdout


def test_the_step_budget_ends_a_call_that_never_returns() -> None:
    proc = run_with_step_budget("while True: (lambda: 0)()", budget=10_000)
    assert proc.returncode == OUT_OF_STEPS


def test_spec_loaders_take_path_objects() -> None:
    root = Path(__file__).resolve().parents[1]
    assert simulator.load_hardware(root / "hardware_specs" / "h100_sxm.yaml").id == "h100_sxm"
    assert (
        simulator.load_engine(root / "simulator" / "specs" / "engines" / "vllm.yaml").id == "vllm"
    )
    assert (
        simulator.load_model(root / "simulator" / "specs" / "models" / "llama-2-7b.json").num_layers
        == 32
    )


@pytest.mark.parametrize("engine", [None, "vllm"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp8", "int8"])
def test_gemm_cost_times_are_arrays_of_one_for_every_dtype(dtype: str, engine: str | None) -> None:
    # fp8 and int8 gave numpy scalars where bf16 gave arrays of one (the docs index time_s[0])
    cost = simulator.gemm_cost(
        hardware="h100_sxm", m=128, n=4096, k=4096, dtype=dtype, engine=engine
    )
    kernel = cost.kernel if isinstance(cost, simulator.EngineOpCost) else cost
    for field in ("time_s", "compute_s", "memory_s", "network_s", "latency_s"):
        value = getattr(kernel, field)
        assert isinstance(value, np.ndarray) and value.shape == (1,), (field, np.shape(value))
    assert kernel.time_s[0] > 0


@pytest.mark.parametrize(
    "cost",
    [
        lambda: simulator.attention_cost(
            hardware="h100_sxm", phase="decode", batch_size=8, seq_len=1024, num_heads=32,
            num_kv_heads=8, head_dim=128, kv_cache_dtype="fp8",
        ),
        lambda: simulator.allreduce_cost(hardware="h100_sxm", num_devices=4, size_bytes=1 << 20),
    ],
    ids=["attention-fp8-kv", "allreduce"],
)  # fmt: skip
def test_other_op_costs_are_arrays_of_one(cost: Callable[[], OpCost]) -> None:
    assert np.shape(cost().time_s) == (1,)
