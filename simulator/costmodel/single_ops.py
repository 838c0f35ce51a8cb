"""Single operators, as `llmsim op` costs them: one GEMM, attention call, elementwise kernel
or all-reduce on a device, alone (`OpCost`, the roofline's kernel) or as a serving engine issues it
(`EngineOpCost`: the kernel plus its launch, or its share of a CUDA-graph replay).
`simulator.api` re-exports them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, get_args, overload

import numpy as np

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.elementwise_kernels import gated_act, rms_norm, rotary
from simulator.costmodel.memory import positive
from simulator.costmodel.ops import Op, attention_ops, collective, gemm
from simulator.costmodel.roofline import OpCost, evaluate
from simulator.errors import SpecError
from simulator.specs import EngineSpec, HardwareSpec, load_engine, load_hardware
from simulator.specs.deployment import QUANTISED_COMPUTE, Precision
from simulator.specs.hardware import RowKernel
from simulator.specs.host_cpu import engine_on_host
from simulator.specs.model import DTYPE_BYTES, KV_QUANT_FORMATS

ACTIVATION_DTYPES = ("bf16", "fp16", "fp32")  # what activations may be held in


def _hw(hardware: str | HardwareSpec) -> HardwareSpec:
    return hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)


def _positive(**values: int | float) -> None:
    """Each a finite whole number of at least 1 (`size_bytes` any finite number >= 1)."""
    for name, value in values.items():
        positive(value, field=name, whole=name != "size_bytes")  # type: ignore[arg-type]


def _grouped(num_heads: int, num_kv_heads: int) -> None:
    """Query heads come in equal groups per KV head."""
    if num_heads % num_kv_heads:
        raise SpecError(
            f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}",
            field="num_kv_heads",
        )


def _scalar(x: object) -> float:
    return float(np.ravel(np.asarray(x, dtype=float))[0])


@dataclass(frozen=True)
class EngineOpCost:
    """One op as a serving engine runs it: the kernel (`kernel`, timed with the engine's
    attention factor) plus the CPU time to launch its `launches` kernels.

    Run eagerly, each kernel costs the engine's `launch_eager_s`. Inside a captured CUDA graph
    (`cuda_graph`: the engine captures graphs, no enforce_eager, and the op's tokens are at
    most the engine's `cuda_graph_max_tokens`) a kernel has no launch of its own: the replay
    (`graph_replay_s`, the engine's `graph_launch_s`) is paid once per step by all the kernels
    of the step. `time_s` adds launch and kernel, as for an op issued on its own; within a
    step, launches overlap earlier kernels (`bench latency`'s breakdown shows how much)."""

    kernel: OpCost
    engine: EngineSpec
    cuda_graph: bool
    launches: float

    @property
    def kernel_s(self) -> float:
        return _scalar(self.kernel.time_s)

    @property
    def launch_s(self) -> float:
        return 0.0 if self.cuda_graph else self.launches * self.engine.overhead.launch_eager_s

    @property
    def graph_replay_s(self) -> float:
        return self.engine.overhead.graph_launch_s if self.cuda_graph else 0.0

    @property
    def time_s(self) -> float:
        return self.kernel_s + self.launch_s

    @property
    def bound(self) -> str:
        """The kernel's bound, with the launch counted as a fixed ("latency") cost."""
        k = self.kernel
        parts = {
            "compute": _scalar(k.compute_s),
            "memory": _scalar(k.memory_s),
            "latency": _scalar(k.latency_s) + self.launch_s,
            "network": _scalar(k.network_s),
        }
        top = max(parts, key=lambda name: parts[name])
        return top if parts[top] > 0 else "latency"


def _engine(engine: str | EngineSpec | None, hw: HardwareSpec) -> EngineSpec | None:
    """The engine an op runs under (None: the bare kernel), which must run on `hw`, its CPU
    costs on `hw`'s host CPU (`engine_on_host`)."""
    eng = engine if engine is None or isinstance(engine, EngineSpec) else load_engine(engine)
    if eng is not None:
        eng.check_runs_on(hw)
        eng = engine_on_host(eng, hw)
    return eng


def _one_element(cost: OpCost) -> OpCost:
    """`cost` with every time an array of one float: the cost model leaves a quantised GEMM's
    times as numpy scalars (its activation quantiser is costed apart) where a 16-bit GEMM's are
    arrays, and a caller indexing `time_s[0]` must not care which dtype it asked for."""

    def one(x: np.ndarray) -> np.ndarray:
        return np.atleast_1d(np.asarray(x, dtype=float))

    return dataclasses.replace(
        cost,
        time_s=one(cost.time_s),
        compute_s=one(cost.compute_s),
        memory_s=one(cost.memory_s),
        network_s=one(cost.network_s),
        latency_s=one(cost.latency_s),
    )


def _under_engine(
    cost: OpCost,
    engine: EngineSpec | None,
    *,
    enforce_eager: bool,
    num_tokens: float | None,
) -> OpCost | EngineOpCost:
    """`cost` as `engine` runs it (unchanged without an engine), its times as arrays of one
    element whatever the dtype (`_one_element`). `num_tokens` decides whether the step holding
    the op is small enough to be graph-captured; None: no token limit applies (a collective,
    whose size says nothing about the step's tokens)."""
    cost = _one_element(cost)
    if engine is None:
        if enforce_eager:
            raise SpecError("needs an engine (add --engine NAME)", field="enforce_eager")
        return cost
    small = num_tokens is None or num_tokens <= engine.cuda_graph_max_tokens
    op = cost.op
    if op.kind == "collective":
        launches = float(_scalar(op.msg_bytes) > 0)
    else:
        launches = 1.0 + float(_scalar(op.pre_bytes) > 0)  # W8A8: the activation quantiser too
    graphed = engine.cuda_graphs and not enforce_eager and small
    return EngineOpCost(cost, engine, graphed, launches)


@overload
def gemm_cost(
    *,
    hardware: str | HardwareSpec,
    m: int,
    n: int,
    k: int,
    dtype: str = ...,
    engine: None = ...,
    enforce_eager: bool = ...,
    block_scaled: bool = ...,
) -> OpCost: ...
@overload
def gemm_cost(
    *,
    hardware: str | HardwareSpec,
    m: int,
    n: int,
    k: int,
    dtype: str = ...,
    engine: str | EngineSpec,
    enforce_eager: bool = ...,
    block_scaled: bool = ...,
) -> EngineOpCost: ...
def gemm_cost(
    *,
    hardware: str | HardwareSpec,
    m: int,
    n: int,
    k: int,
    dtype: str = "bf16",
    engine: str | EngineSpec | None = None,
    enforce_eager: bool = False,
    block_scaled: bool = False,
) -> OpCost | EngineOpCost:
    """One m x k by k x n GEMM. fp8/int8/fp4 (NVFP4) need the device's matrix unit for that
    dtype and quantise the bf16 activations in a kernel of their own first; `block_scaled`
    (fp8 only): weights scaled per 128 x 128 block, as DeepSeek-V3's checkpoints are, priced
    with the device's block-scaled fp8 factors where it has them. With an engine, an
    EngineOpCost: the kernel as the engine runs it (its quantisation fused away where it
    fuses it) plus its launch (`m` is the step's tokens)."""
    _positive(m=m, n=n, k=k)
    hw = _hw(hardware)
    dtypes = ("bf16", "fp16", *QUANTISED_COMPUTE)
    if dtype not in dtypes:
        raise SpecError(f"unknown dtype {dtype!r} ({', '.join(dtypes)})", field="dtype")
    if not hw.supports(dtype):
        raise SpecError(f"{hw.name} has no {dtype} matrix unit", source=hw.id, field="dtype")
    if block_scaled and dtype != "fp8":
        raise SpecError(f"block scales are fp8's, not {dtype}'s", field="block_scaled")
    act = dtype if dtype in ("bf16", "fp16") else "bf16"
    prec = Precision(
        weights=dtype, compute=dtype, kv_cache=act, activations=act, fp8_blocks=block_scaled
    )
    op = gemm("gemm", m=float(m), n=float(n), k=float(k), count=1, prec=prec)
    eng = _engine(engine, hw)
    cost = evaluate([op], hw, eng)[0]
    return _under_engine(cost, eng, enforce_eager=enforce_eager, num_tokens=m)


@overload
def attention_cost(
    *,
    hardware: str | HardwareSpec,
    phase: str,
    batch_size: int,
    seq_len: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    kv_cache_dtype: str = ...,
    dtype: str = ...,
    engine: None = ...,
    enforce_eager: bool = ...,
) -> OpCost: ...
@overload
def attention_cost(
    *,
    hardware: str | HardwareSpec,
    phase: str,
    batch_size: int,
    seq_len: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    kv_cache_dtype: str = ...,
    dtype: str = ...,
    engine: str | EngineSpec,
    enforce_eager: bool = ...,
) -> EngineOpCost: ...
def attention_cost(
    *,
    hardware: str | HardwareSpec,
    phase: str,
    batch_size: int,
    seq_len: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    kv_cache_dtype: str = "auto",
    dtype: str = "bf16",
    engine: str | EngineSpec | None = None,
    enforce_eager: bool = False,
) -> OpCost | EngineOpCost:
    """One attention layer call: prefill of `batch_size` causal prompts of `seq_len` tokens, or
    a decode step of `batch_size` sequences attending to `seq_len` KV tokens each. KV below 8
    bits (`int4`, `int2`: `specs.model.KV_QUANT_FORMATS`) is read packed with its scales, and a
    decode reads int2's 16-bit window of each sequence beside it; the `kv_quantize` kernel
    the new tokens pay is a kernel of its own, not counted here. With an
    engine, an EngineOpCost: the kernel at the engine's attention factor plus its launch."""
    _positive(
        batch_size=batch_size,
        seq_len=seq_len,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )
    _grouped(num_heads, num_kv_heads)
    if dtype not in ACTIVATION_DTYPES:
        raise SpecError(f"unknown dtype {dtype!r} ({', '.join(ACTIVATION_DTYPES)})", field="dtype")
    kv = dtype if kv_cache_dtype == "auto" else str(kv_cache_dtype)
    kv = "fp8" if kv.startswith("fp8") else kv  # fp8, fp8_e4m3, fp8_e5m2 (vLLM's spellings)
    if kv not in (*ACTIVATION_DTYPES, "fp8", *KV_QUANT_FORMATS):
        raise SpecError(
            f"unknown KV cache dtype {kv_cache_dtype!r} (auto, fp8, int4, int2, or the dtype's)",
            field="kv_cache_dtype",
        )
    prec = Precision(weights=dtype, compute=dtype, kv_cache=kv, activations=dtype)
    match phase:
        case "prefill":
            batch = BatchShape.prefill(batch_size=batch_size, prompt_len=seq_len)
            tokens = batch_size * seq_len
        case "decode":
            batch = BatchShape.decode(batch_size=batch_size, context_len=seq_len)
            tokens = batch_size
        case _:
            raise SpecError(f"unknown phase {phase!r} (prefill, decode)", field="phase")
    ops = attention_ops(
        heads=num_heads, kv_heads=num_kv_heads, head_dim=head_dim, prec=prec, batch=batch, count=1
    )
    op = next(o for o in ops if o.kind == f"attention_{phase}")
    hw = _hw(hardware)
    eng = _engine(engine, hw)
    cost = evaluate([op], hw, eng)[0]
    return _under_engine(cost, eng, enforce_eager=enforce_eager, num_tokens=tokens)


ELEMENTWISE_KERNELS: tuple[str, ...] = get_args(RowKernel)  # norm, rotary, act


def _needed(kernel: str, **values: int | None) -> dict[str, int]:
    """The dimensions `kernel` needs, each given and at least 1."""
    given = {name: value for name, value in values.items() if value is not None}
    for name in values:  # in the order the flags are listed, so the message is stable
        if name not in given:
            raise SpecError(f"the {kernel} kernel needs it", field=name)
    _positive(**given)
    return given


def elementwise_cost(
    *,
    hardware: str | HardwareSpec,
    kernel: str,
    tokens: int,
    hidden_size: int | None = None,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    intermediate_size: int | None = None,
    dtype: str = "bf16",
    engine: str | EngineSpec | None = None,
    enforce_eager: bool = False,
) -> OpCost | EngineOpCost:
    """One elementwise kernel of a layer over `tokens` tokens, as a step prices it: `norm`
    (fused residual add + RMSNorm over `hidden_size`), `rotary` (the query and key heads) or
    `act` (gated SiLU-and-mul of `intermediate_size`). Priced by its bytes, and by its
    one-block-per-token launch where the engine runs it so (`scalar_row_kernels`; without an
    engine, vLLM's kernels as measured alone: all three). With an engine, an EngineOpCost."""
    _positive(tokens=tokens)
    if dtype not in ACTIVATION_DTYPES:
        raise SpecError(f"unknown dtype {dtype!r} ({', '.join(ACTIVATION_DTYPES)})", field="dtype")
    a, t = DTYPE_BYTES[dtype], float(tokens)
    match kernel:
        case "norm":
            h = _needed(kernel, hidden_size=hidden_size)["hidden_size"]
            op = rms_norm("norm", t, h, act_bytes=a, count=1)
        case "rotary":
            v = _needed(kernel, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim)
            _grouped(v["num_heads"], v["num_kv_heads"])
            op = rotary(t, v["num_heads"], v["num_kv_heads"], v["head_dim"], act_bytes=a, count=1)
        case "act":
            d = _needed(kernel, intermediate_size=intermediate_size)["intermediate_size"]
            op = gated_act("act", t, d, act_bytes=a, count=1)
        case _:
            known = ", ".join(ELEMENTWISE_KERNELS)
            raise SpecError(f"unknown elementwise kernel {kernel!r} ({known})", field="kernel")
    hw = _hw(hardware)
    eng = _engine(engine, hw)
    cost = evaluate([op], hw, eng)[0]
    return _under_engine(cost, eng, enforce_eager=enforce_eager, num_tokens=tokens)


@overload
def allreduce_cost(
    *,
    hardware: str | HardwareSpec,
    num_devices: int,
    size_bytes: float,
    engine: None = ...,
    enforce_eager: bool = ...,
) -> OpCost: ...
@overload
def allreduce_cost(
    *,
    hardware: str | HardwareSpec,
    num_devices: int,
    size_bytes: float,
    engine: str | EngineSpec,
    enforce_eager: bool = ...,
) -> EngineOpCost: ...
def allreduce_cost(
    *,
    hardware: str | HardwareSpec,
    num_devices: int,
    size_bytes: float,
    engine: str | EngineSpec | None = None,
    enforce_eager: bool = False,
) -> OpCost | EngineOpCost:
    """One ring all-reduce of `size_bytes` among `num_devices` devices of one node, or of whole
    nodes (a multiple of gpus_per_node on a node with a GPU fabric: hierarchical, as
    `roofline._hierarchical` prices a TP group across nodes). With an engine, an
    EngineOpCost: graph-captured whenever the engine captures graphs (the message size does
    not tell the step's tokens)."""
    _positive(num_devices=num_devices, size_bytes=size_bytes)
    hw = _hw(hardware)
    g = hw.interconnect.gpus_per_node
    if num_devices > g and (num_devices % g or hw.interconnect.topology == "pcie"):
        raise SpecError(
            f"{num_devices} devices exceed the {g} GPUs of one {hw.id} node and are not whole "
            "nodes joined by a NIC per GPU (a multiple of them, on a node with a GPU fabric)",
            field="num_devices",
        )
    op: Op = collective(
        "all_reduce", "all_reduce", msg_bytes=float(size_bytes), group=num_devices, count=1
    )
    if num_devices == 1:
        op = collective("all_reduce", "all_reduce", msg_bytes=0.0, group=1, count=1)
    cost = evaluate([op], hw)[0]
    return _under_engine(cost, _engine(engine, hw), enforce_eager=enforce_eager, num_tokens=None)


def op_json(cost: OpCost | EngineOpCost) -> dict[str, Any]:
    """The contract's `llmsim op --json` object for one op. Under an engine, `latency_s` is
    kernel plus launch, and `kernel_s`, `launch_overhead_s`, `kernel_launches`, `cuda_graph`,
    `graph_replay_s` (per step, not in `latency_s`) and `engine` are added."""
    if isinstance(cost, EngineOpCost):
        return {
            **op_json(cost.kernel),
            "latency_s": cost.time_s,
            "bound": cost.bound,
            "kernel_s": cost.kernel_s,
            "launch_overhead_s": cost.launch_s,
            "kernel_launches": cost.launches,
            "cuda_graph": cost.cuda_graph,
            "graph_replay_s": cost.graph_replay_s,
            "engine": cost.engine.id,
        }
    op = cost.op
    moved = op.msg_bytes if op.kind == "collective" else op.bytes
    return {
        "latency_s": _scalar(cost.time_s),
        "bound": str(np.ravel(cost.bound)[0]),
        "flops": _scalar(op.flops),
        "bytes": _scalar(moved),
        "compute_s": _scalar(cost.compute_s),
        "memory_s": _scalar(cost.memory_s),
        "network_s": _scalar(cost.network_s),
        "fixed_latency_s": _scalar(cost.latency_s),
    }
