"""Serving-engine profiles: what differs between frameworks on the same hardware.

One YAML per engine in `simulator/specs/engines/` (file name = id): per-step CPU overhead,
kernel-launch cost with and without CUDA/HIP graphs, an attention-kernel factor, the memory the
engine keeps outside the KV cache, default scheduler knobs, and which quantized kernels exist.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from simulator.specs._base import Bytes, Frozen, Seconds
from simulator.specs.deployment import Quantization
from simulator.specs.hardware import DecodeSplit, RowKernel


class EngineOverhead(Frozen):
    step_s: Seconds = Field(ge=0, description="CPU scheduling and input preparation per step")
    per_seq_s: Seconds = Field(ge=0, description="extra CPU time per running sequence per step")
    launch_eager_s: Seconds = Field(ge=0, description="CPU cost of launching one kernel eagerly")
    graph_launch_s: Seconds = Field(ge=0, description="CPU cost of replaying one captured graph")


KvBudget = Literal["total", "static", "free"]


class SchedulerDefaults(Frozen):
    max_num_seqs: int = Field(gt=0)
    max_num_batched_tokens: int = Field(gt=0)
    chunked_prefill: bool
    mixed_prefill: bool = Field(
        default=True,
        description="prefill chunks share a step with the running decodes (vLLM V1, TensorRT-LLM "
        "in-flight batching); false: a step is all prefill or all decode, prefill first (SGLang "
        "without --enable-mixed-chunk)",
    )
    block_size: int = Field(gt=0)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    kv_budget: KvBudget = Field(
        default="total",
        description="what gpu_memory_utilization is a fraction of when the KV pool is sized: "
        "`total`: of the device's memory, which holds weights, activations, the engine's "
        "reserve and the KV pool (vLLM's --gpu-memory-utilization); `static`: of the device's "
        "memory, which holds weights, the reserve and the KV pool, activations living outside "
        "it (SGLang's --mem-fraction-static); `free`: of the memory left once weights, "
        "activations and the reserve are allocated (TensorRT-LLM's "
        "--kv_cache_free_gpu_mem_fraction)",
    )


class EngineSpec(Frozen):
    id: str = Field(default="", description="set from the file name by the loader")
    name: str
    version: str
    overhead: EngineOverhead
    cuda_graphs: bool = Field(description="captures decode steps in CUDA/HIP graphs by default")
    cuda_graph_max_tokens: int = Field(ge=0, description="largest step (tokens) that is captured")
    attention_factor: float = Field(
        default=1.0, gt=0, le=2, description="multiplies the device's attention efficiency"
    )
    decode_split: DecodeSplit | None = Field(
        default=None,
        description="the split-KV rule of the engine's decode kernel where it is not the "
        "device's (`attention.decode_split`)",
    )
    gemm_library: str | None = Field(
        default=None,
        description="the GEMM library the engine's release ships (e.g. cublas-12.1) where it is "
        "not the one the device's GEMM factors were fitted to; used on devices with "
        "measurements of it (`efficiency.gemm_libraries`), else the device's own",
    )
    attention_kernel: str | None = Field(
        default=None,
        description="the attention kernel the engine's release runs (e.g. fa2) where it is not "
        "the one the device's attention factors were fitted to; used on devices with a "
        "comparison of the two (`efficiency.attention_kernels`), else the device's own",
    )
    vendors: list[Literal["nvidia", "amd", "intel"]] | None = Field(
        default=None, description="the GPU vendors the engine runs on (None: any)"
    )
    multi_step_scheduling: bool = Field(
        default=False,
        description="has vLLM V0's multi-step scheduling (--num-scheduler-steps)",
    )
    scalar_row_kernels: list[RowKernel] = Field(
        default_factory=list,
        description="elementwise kernels it runs one thread block per token with one element "
        "per load (norm, rotary, act), priced by their launch (`costmodel.elementwise_kernels`)"
        "; the others are vectorised or fused and priced by their bytes",
    )
    fused_activation_quant: bool = Field(
        default=True,
        description="quantises a W8A8 GEMM's activations inside the kernel before it (norm, "
        "activation) rather than in a separate kernel",
    )
    memory_reserve_bytes: Bytes = Field(
        ge=0,
        description="non-KV memory outside weights and activations: CUDA context, "
        "library workspaces, communication buffers, graph pool",
    )
    scheduler: SchedulerDefaults
    quantized_kernels: tuple[Quantization, ...] = ("fp8", "int8", "int4")
