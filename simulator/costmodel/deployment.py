"""The resolved object every layer above the cost model passes around: a model on a device type
under a parallel layout, a precision and an engine (`Deployment`), and `deployment(...)`, which
resolves ids and flags into one and refuses what cannot run."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast, get_args

from pydantic import ValidationError

from simulator.costmodel.memory import MemoryPlan, plan_memory
from simulator.errors import SpecError
from simulator.specs import (
    EngineSpec,
    HardwareSpec,
    ModelSpec,
    load_engine,
    load_hardware,
    load_model,
)
from simulator.specs.deployment import (
    KvEviction,
    KvEvictionPolicy,
    Parallelism,
    Precision,
    ShadowKV,
    SwiftKV,
    kernel_format,
    resolve_precision,
)
from simulator.specs.engine import Entrypoint
from simulator.specs.host_cpu import engine_on_host, with_host_cpu
from simulator.specs.model import CCAttention, GQAttention
from simulator.specs.offload import ExpertOffloadSpec, OffloadLike, OffloadSpec, resolve_offload


@dataclass(frozen=True)
class Deployment:
    """A model on a device type under a layout, precision and engine: everything resolved.
    `offload`: weights kept in host memory or on NVMe (None: all on the GPU). A KV token
    budget is part of the precision (`Precision.kv_eviction`): what the KV cache holds."""

    model: ModelSpec
    hardware: HardwareSpec
    engine: EngineSpec
    layout: Parallelism
    precision: Precision
    offload: OffloadSpec | None = None

    @property
    def label(self) -> str:
        """ "llama-3.1-8b on h100_sxm (tp=1, pp=1, bf16)": what a does-not-fit error names."""
        layout = self.layout
        cp = f", cp={layout.cp}" if layout.cp > 1 else ""
        return (
            f"{self.model.id} on {self.hardware.id} (tp={layout.tp}, pp={layout.pp}{cp}, "
            f"{self.precision.weights})"
        )

    def memory(
        self,
        *,
        gpu_memory_utilization: float | None = None,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
        host_reserved_bytes: float = 0.0,
    ) -> MemoryPlan:
        """Per-device memory budget and KV-cache capacity (engine defaults where None;
        `host_reserved_bytes`: host memory the offload may not use, such as swap space)."""
        return plan_memory(
            self.model,
            self.hardware,
            self.layout,
            self.precision,
            self.engine,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            offload=self.offload,
            host_reserved_bytes=host_reserved_bytes,
        )


def deployment(
    *,
    model: str | ModelSpec,
    hardware: str | HardwareSpec,
    engine: str | EngineSpec = "vllm",
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    context_parallel_size: int = 1,
    data_parallel_size: int = 1,
    expert_parallel_size: int = 1,
    expert_load_imbalance: float = 1.0,
    dtype: str = "auto",
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    cpu_offload_gb: float = 0.0,
    offload: OffloadLike = None,
    expert_offload: ExpertOffloadSpec | None = None,
    entrypoint: Entrypoint = "server",
    async_scheduling: bool = False,
    host_cpu: str | None = None,
    kv_budget: int | None = None,
    kv_eviction: str = "snapkv",
    overlap_tp_comm: bool = False,
    nano_batches: int | None = None,
    shadowkv: ShadowKV | Mapping[str, Any] | None = None,
    swiftkv: SwiftKV | Mapping[str, Any] | None = None,
) -> Deployment:
    """Resolve ids into a checked Deployment; raises SpecError for anything impossible.
    `entrypoint`: the engine runs as an API server or offline (vLLM's LLM class), which with
    the device picks its batch defaults (`EngineSpec.on_device`). `async_scheduling`: vLLM's
    --async-scheduling (`EngineSpec.with_async_scheduling`; SpecError on an engine without).
    `overlap_tp_comm`: tensor-parallel all-reduces fused with their producer GEMMs
    (`EngineSpec.with_tp_comm_overlap` at `roofline.tp_overlap_fraction`).
    `nano_batches`: each step split into that many nano-batches whose compute, memory and
    network kernels overlap (NanoFlow; `EngineSpec.with_nano_batches`, `costmodel.nanobatch`);
    None: the profile's own (1 in every profile but `nanoflow`).
    `cpu_offload_gb` (vLLM's flag), `offload` (an OffloadSpec, mapping or JSON text) and
    `expert_offload` keep weights off the GPU (`simulator.specs.offload`).
    `context_parallel_size`: cp ranks of tp x pp devices share every sequence's tokens and KV
    (ring-attention prefill, KV-sharded decode; `costmodel.ops.context_parallel_ops`);
    `expert_parallel_size` = tp x dp > tp is DP attention (`Parallelism`);
    `expert_load_imbalance` is the busiest EP rank's tokens over the mean (1: balanced).
    `host_cpu`: the node's CPU where it is not the hardware spec's (`with_host_cpu`); the
    engine's CPU costs scale from the CPU they were fitted on to it (`engine_on_host`).
    `kv_budget`: tokens of KV each sequence keeps once its prompt is in, chosen by
    `kv_eviction` (snapkv, h2o or streaming: `specs.deployment.KvEviction`).
    `shadowkv` (`specs.deployment.ShadowKV` or its fields) keeps low-rank keys on the GPU and
    values in host memory; `swiftkv` (`specs.deployment.SwiftKV`) lets prompt tokens skip the
    last layers and AcrossKV share their KV (docs/long-context.md)."""
    m = model if isinstance(model, ModelSpec) else load_model(model)
    hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
    if host_cpu is not None:
        hw = with_host_cpu(hw, host_cpu)
    eng = engine if isinstance(engine, EngineSpec) else load_engine(engine)
    eng = engine_on_host(eng, hw)
    eng = eng.on_device(
        hardware_id=hw.id,
        memory_bytes=hw.memory.capacity_bytes,
        entrypoint=entrypoint,
        tensor_parallel=tensor_parallel_size,
        pipeline_parallel=pipeline_parallel_size,
    )
    if async_scheduling:
        eng = eng.with_async_scheduling()
    if overlap_tp_comm:
        from simulator.costmodel.roofline import tp_overlap_fraction

        eng = eng.with_tp_comm_overlap(tp_overlap_fraction())
    if nano_batches is not None:
        from simulator.costmodel.nanobatch import interference

        eng = eng.with_nano_batches(nano_batches, interference())
    for name, value in (
        ("tensor_parallel_size", tensor_parallel_size),
        ("pipeline_parallel_size", pipeline_parallel_size),
        ("context_parallel_size", context_parallel_size),
        ("data_parallel_size", data_parallel_size),
        ("expert_parallel_size", expert_parallel_size),
    ):
        if value < 1:
            raise SpecError(f"must be at least 1, got {value}", field=name)
    if not expert_load_imbalance >= 1.0:
        raise SpecError(
            f"must be at least 1 (max/mean), got {expert_load_imbalance}",
            field="expert_load_imbalance",
        )
    layout = Parallelism(
        tp=tensor_parallel_size,
        pp=pipeline_parallel_size,
        cp=context_parallel_size,
        dp=data_parallel_size,
        ep=expert_parallel_size,
        expert_load_imbalance=expert_load_imbalance,
    )
    layout.check(m, hw)
    eng.check_runs_on(hw)
    if quantization is not None and kernel_format(quantization) not in eng.quantized_kernels:
        raise SpecError(
            f"{eng.name} has no {kernel_format(quantization)} kernels "
            f"(it has: {', '.join(eng.quantized_kernels)})",
            field="quantization",
        )
    prec = resolve_precision(
        m, hw, dtype=dtype, quantization=quantization, kv_cache_dtype=kv_cache_dtype
    )
    off = resolve_offload(
        cpu_offload_gb=cpu_offload_gb, offload=offload, expert_offload=expert_offload
    )
    eviction = resolve_eviction(kv_budget, kv_eviction)
    if eviction is not None:
        prec = prec.model_copy(update={"kv_eviction": eviction})
    techniques = resolve_kv_techniques(m, layout, prec, shadowkv=shadowkv, swiftkv=swiftkv)
    if techniques:
        prec = prec.model_copy(update=techniques)
    return Deployment(m, hw, eng, layout, prec, off)


def resolve_kv_techniques(
    model: ModelSpec,
    layout: Parallelism,
    prec: Precision,
    *,
    shadowkv: ShadowKV | Mapping[str, Any] | None,
    swiftkv: SwiftKV | Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The Precision fields of ShadowKV and SwiftKV, checked against the model and layout:
    both need GQA/MHA attention without sliding windows and no context parallelism; ShadowKV
    keeps 16-bit KV and no token budget. SpecError naming the field otherwise."""
    out: dict[str, Any] = {}
    for field, value, cls in (("shadowkv", shadowkv, ShadowKV), ("swiftkv", swiftkv, SwiftKV)):
        if value is None:
            continue
        try:
            spec = value if isinstance(value, cls) else cls.model_validate(value)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise SpecError(
                f"{where}: {err['msg']}" if where else err["msg"], field=field
            ) from None
        attn = model.attention
        if not isinstance(attn, GQAttention) or isinstance(attn, CCAttention):
            raise SpecError(f"needs GQA/MHA attention ({model.id} has another)", field=field)
        if attn.sliding_window is not None:
            raise SpecError("with sliding-window layers is not modelled", field=field)
        if layout.cp > 1:
            raise SpecError("with context parallelism is not modelled", field=field)
        out[field] = spec
    sk, sw = out.get("shadowkv"), out.get("swiftkv")
    if sk is not None:
        if prec.kv_cache not in ("bf16", "fp16", "fp32"):
            raise SpecError(
                f"keeps 16-bit KV; --kv-cache-dtype {prec.kv_cache} with it is not modelled",
                field="shadowkv",
            )
        if prec.kv_eviction is not None:
            raise SpecError("with a KV token budget is not modelled", field="shadowkv")
        attn = cast(GQAttention, model.attention)
        width = attn.num_kv_heads * attn.head_dim
        if sk.rank >= width:
            raise SpecError(
                f"rank {sk.rank} is no smaller than the keys' width ({width})", field="shadowkv"
            )
    if sw is not None and sw.across > 1 and sw.skipped_layers(model.num_layers) < 2:
        raise SpecError("AcrossKV shares KV among skipped layers: needs two", field="swiftkv")
    return out


def resolve_eviction(budget: int | None, policy: str) -> KvEviction | None:
    """The KvEviction of `--kv-budget` and `--kv-eviction` (None without a budget)."""
    if policy not in get_args(KvEvictionPolicy):
        raise SpecError(
            f"unknown KV eviction policy {policy!r} ({', '.join(get_args(KvEvictionPolicy))})",
            field="kv_eviction",
        )
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise SpecError(f"must be a whole number of tokens >= 1, got {budget!r}", field="kv_budget")
    return KvEviction(budget_tokens=budget, policy=cast(KvEvictionPolicy, policy))


def fitting_layouts(
    dep: Deployment,
    *,
    gpu_memory_utilization: float | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    host_reserved_bytes: float = 0.0,
) -> str:
    """Where `dep` does not fit its GPUs: the fewest GPUs of the same hardware that hold it at
    its precision, and with fp8 weights where that takes fewer and the engine has the kernels,
    as flags and scenario fields: "fits with -tp 8 (tensor_parallel_size: 8), or -tp 4 with
    --quantization fp8 (quantization: fp8)". Tensor parallelism fills a node before pipeline
    stages are added (up to 16); "" when nothing up to that fits, and for expert-parallel
    layouts (their memory depends on the EP split)."""
    if dep.layout.ep > 1:
        return ""
    precisions = [("", dep.precision)]
    if dep.precision.weights in ("bf16", "fp16") and "fp8" in dep.engine.quantized_kernels:
        fp8 = "fp8" if dep.hardware.supports("fp8") else dep.precision.activations
        precisions.append(
            (
                " with --quantization fp8",
                dep.precision.model_copy(
                    update={"weights": "fp8", "compute": fp8, "formats": None}
                ),
            )
        )
    found: list[tuple[int, str]] = []
    for flag, prec in precisions:
        for tp, pp in _layouts_by_size(dep.hardware.interconnect.gpus_per_node):
            layout = Parallelism(tp=tp, pp=pp, cp=dep.layout.cp)
            if tp * pp < dep.layout.tp * dep.layout.pp or (layout, prec) == (
                dep.layout,
                dep.precision,
            ):
                continue
            try:
                layout.check(dep.model, dep.hardware)
            except SpecError:
                continue
            other = dataclasses.replace(dep, layout=layout, precision=prec, offload=None)
            plan = other.memory(
                gpu_memory_utilization=gpu_memory_utilization,
                max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs,
                host_reserved_bytes=host_reserved_bytes,
            )
            if plan.fits:
                if not found or tp * pp < found[0][0]:
                    found.append((tp * pp, _layout_flags(tp, pp, dep.layout.cp) + flag))
                break
    if not found:
        return ""
    hints = ", or ".join(text for _, text in found)
    return f"fits with {hints} on {dep.hardware.id}"


def _layouts_by_size(gpus_per_node: int) -> list[tuple[int, int]]:
    """(tp, pp) by total GPUs, then fewer stages: powers of two, tp within a node, pp <= 16."""
    powers = [2**i for i in range(5)]
    layouts = [(tp, pp) for tp in powers if tp <= gpus_per_node for pp in powers]
    return sorted(layouts, key=lambda lp: (lp[0] * lp[1], lp[1]))


def _layout_flags(tp: int, pp: int, cp: int = 1) -> str:
    flags = [f"-tp {tp} (tensor_parallel_size: {tp})"] if tp > 1 else []
    flags += [f"-pp {pp} (pipeline_parallel_size: {pp})"] if pp > 1 else []
    flags += [f"-cp {cp} (context_parallel_size: {cp})"] if cp > 1 else []
    return " ".join(flags) or "one GPU"
