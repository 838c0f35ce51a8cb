"""Serving-engine profiles: what differs between frameworks on the same hardware.

One YAML per engine in `simulator/specs/engines/` (file name = id): per-step CPU overhead,
kernel-launch cost with and without CUDA/HIP graphs, an attention-kernel factor, the memory the
engine keeps outside the KV cache, default scheduler knobs, and which quantized kernels exist.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field, model_validator

from simulator.errors import SpecError
from simulator.specs._base import Bytes, Frozen, Seconds
from simulator.specs.deployment import KernelFormat
from simulator.specs.hardware import DecodeSplit, HardwareSpec, RowKernel
from simulator.specs.model import MLAttention, ModelSpec


class EngineOverhead(Frozen):
    step_s: Seconds = Field(ge=0, description="CPU scheduling and input preparation per step")
    per_seq_s: Seconds = Field(ge=0, description="extra CPU time per running sequence per step")
    launch_eager_s: Seconds = Field(ge=0, description="CPU cost of launching one kernel eagerly")
    graph_launch_s: Seconds = Field(ge=0, description="CPU cost of replaying one captured graph")
    async_residual_s: Seconds | None = Field(
        default=None,
        ge=0,
        description="with async scheduling (vLLM's --async-scheduling), the CPU time a step "
        "still exposes while the next step's scheduling, input preparation and launches run "
        "behind the GPU; None: the engine has no async scheduling",
    )


KvBudget = Literal["total", "static", "free"]
Entrypoint = Literal["server", "offline"]


class FrontEndCost(Frozen):
    """What a request costs outside the engine's steps at one entrypoint (`EngineSpec.frontend`):
    `request_s` from the client's send to the request reaching the scheduler, per request and
    concurrent across requests (HTTP and JSON handling, the engine client's input processing,
    the hop to the engine process); `tokenize_s_per_token` per prompt token on the
    front-end's one tokenizer thread, where requests are tokenized one after another (so it
    queues under load); `first_token_s` from the end of the step that samples a token to the
    client reading it (the hop back, detokenization, the streamed chunk): every token is
    delayed alike, so it adds to TTFT and E2EL, not to TPOT or ITL."""

    request_s: Seconds = Field(default=0.0, ge=0)
    tokenize_s_per_token: Seconds = Field(default=0.0, ge=0)
    first_token_s: Seconds = Field(default=0.0, ge=0)


class FrontEnd(Frozen):
    """The front-end at each entrypoint: `server` (the OpenAI-compatible API server that
    `bench serve` and scenarios model), `offline` (vLLM's LLM class, `bench latency|throughput`);
    None: nothing is added there."""

    server: FrontEndCost | None = None
    offline: FrontEndCost | None = None


class BatchLimits(Frozen):
    max_num_seqs: int | None = Field(default=None, gt=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0)


class DeviceBatchDefaults(Frozen):
    """Batch limits an engine picks for itself by device (vLLM's
    `EngineArgs.get_batch_defaults`, SGLang's memory heuristics): the first entry whose
    device test passes gives them; what it leaves out is the profile's."""

    min_memory: Bytes = Field(default=0, ge=0, description="device memory at least this")
    excluding: tuple[str, ...] = Field(
        default=(), description="not on a device whose id contains one of these (vLLM: a100)"
    )
    min_tensor_parallel: int = Field(
        default=1, ge=1, description="only at this tensor parallelism or more (SGLang's graphs)"
    )
    max_num_seqs: int | None = Field(default=None, gt=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    cuda_graph_max_tokens: int | None = Field(
        default=None, ge=0, description="largest captured decode batch on such a device"
    )
    offline: BatchLimits = Field(
        default_factory=BatchLimits,
        description="what differs when the engine runs offline (vLLM's LLM class: `bench "
        "latency|throughput`) rather than as an API server (`bench serve`, scenarios)",
    )

    def matches(self, *, hardware_id: str, memory_bytes: float, tensor_parallel: int) -> bool:
        return (
            memory_bytes >= self.min_memory
            and tensor_parallel >= self.min_tensor_parallel
            and not any(name in hardware_id for name in self.excluding)
        )

    def limits(self, entrypoint: Entrypoint) -> dict[str, int]:
        given = {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
        }
        if entrypoint == "offline":
            given |= self.offline.model_dump(exclude_none=True)
        return {k: v for k, v in given.items() if v is not None}


class StaticReserve(Frozen):
    """SGLang's default --mem-fraction-static (server_args): the memory left outside weights
    and the KV pool for activations and graphs, in MiB of a device of M MiB,
    base + per_chunk_token x max(chunk, min_chunk_tokens) + per_graph_seq x largest graph
    batch + per_gpu x tp x pp, at least `floor_mib` on a device above `floor_above`; the
    fraction is round((M - reserve) / M, 3)."""

    base_mib: float = Field(ge=0)
    per_chunk_token_mib: float = Field(ge=0)
    min_chunk_tokens: int = Field(ge=0)
    per_graph_seq_mib: float = Field(ge=0)
    per_gpu_mib: float = Field(ge=0)
    floor_mib: float = Field(ge=0)
    floor_above: Bytes = Field(ge=0)

    def fraction(self, *, memory_bytes: float, chunk: int, graph_batch: int, gpus: int) -> float:
        mib = memory_bytes / 2**20
        reserve = (
            self.base_mib
            + self.per_chunk_token_mib * max(chunk, self.min_chunk_tokens)
            + self.per_graph_seq_mib * graph_batch
            + self.per_gpu_mib * gpus
        )
        if memory_bytes > self.floor_above:
            reserve = max(reserve, self.floor_mib)
        return round((mib - reserve) / mib, 3)


class LogitsPass(Frozen):
    """Kernels a sampler runs over every sampling sequence's logits each step, priced as
    memory-bound: `bytes_per_logit` bytes per sequence and vocabulary entry streamed at the
    device's rate (an effective figure where the kernels are timed: a sort's or a top-k's
    passes, a reduction's lower rate), in `kernels` launches."""

    bytes_per_logit: float = Field(gt=0)
    kernels: int = Field(ge=1)


class PenaltyCost(LogitsPass):
    """What an engine's repetition, frequency and presence penalties cost in a step where a
    sampling request carries one. On the GPU, a LogitsPass (count tensors of the prompt and
    output tokens, their masks, the penalised logits). On the host, once the step's forward
    pass is launched (so hidden under it unless longer): `host_s_per_token` per output token
    of the sampling sequences and `host_s_per_padded` per element of their padded array
    (sequences x longest output), the output token ids rebuilt as a tensor every step."""

    host_s_per_token: Seconds = Field(ge=0)
    host_s_per_padded: Seconds = Field(ge=0)


class NewTokenRatio(Frozen):
    """SGLang's admission by new_token_ratio (serving/scheduler.py): a waiting request joins
    only if the KV pool holds its prompt and its (clipped) max_new_tokens on top of the running
    requests' remaining outputs scaled by the ratio; the ratio falls by `decay` each decode step
    to `min_ratio`, is `init_ratio` again when the server idles, and is re-estimated when a
    decode step finds no room and requests are retracted (preempted by recompute)."""

    init_ratio: float = Field(gt=0, le=1)
    min_ratio: float = Field(ge=0, le=1)
    decay: float = Field(ge=0, le=1)  # per decode step
    retract_decode_steps: int = Field(ge=1)  # decode steps of room a retraction leaves
    clip_max_new_tokens: int = Field(ge=1)  # max_new_tokens counted at most this
    # how far a retraction goes: False, until retract_decode_steps tokens per request left are
    # free (0.3, 0.4); True, at least one request, then until the next decode step fits (0.5)
    retract_until_next_step: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> NewTokenRatio:
        if self.min_ratio > self.init_ratio:
            raise ValueError("min_ratio must not exceed init_ratio")
        return self


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
    unchunked_mixed: bool = Field(
        default=False,
        description="with chunked prefill off, whole waiting prompts still share a step with the "
        "running decodes: the decodes are scheduled first, then prompts are admitted whole while "
        "they fit the step's remaining token budget (vLLM V1's scheduler, TensorRT-LLM's "
        "in-flight batching); false: without chunking a step is all prefill or all decode, "
        "prefill first (vLLM V0, SGLang)",
    )
    schedule_ahead: bool = Field(
        default=False,
        description="the scheduler forms the next batch while a step runs (SGLang's overlap "
        "scheduler, on by default from 0.4): a request that arrives during step N can join "
        "step N+2 at the earliest; false: it can join step N+1 (serving.replica)",
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
    by_device: tuple[DeviceBatchDefaults, ...] = Field(
        default=(),
        description="batch limits the engine picks by device and entrypoint, first match "
        "wins (`EngineSpec.on_device`); none matching: max_num_seqs, max_num_batched_tokens",
    )
    chunked_prefill_above: int | None = Field(
        default=None,
        gt=0,
        description="chunked prefill turns on by default where the served context length "
        "(max_model_len) exceeds this many tokens, whatever `chunked_prefill` says (vLLM V0's "
        "EngineArgs: 32768 on CUDA); None: `chunked_prefill` alone",
    )
    mla_chunked_prefill: bool = Field(
        default=True,
        description="models with multi-head latent attention (DeepSeek-V2/V3/R1) take the "
        "chunked-prefill default as any other; false: chunked prefill is off for them unless "
        "asked for, whatever `chunked_prefill` and `chunked_prefill_above` say (vLLM V0 "
        "0.7-0.8, whose MLA backend had no chunked prefill)",
    )
    unchunked_holds_max_model_len: bool = Field(
        default=False,
        description="without chunked prefill and with max_num_batched_tokens left to the "
        "engine, a step holds at least the model's context length (vLLM's EngineArgs)",
    )
    prefix_caching: bool = Field(
        default=False, description="automatic prefix caching on unless turned off"
    )
    new_token_ratio: NewTokenRatio | None = Field(
        default=None,
        description="SGLang's admission: the KV pool must hold the running requests' remaining "
        "outputs x a ratio that decays per decode step, and decode steps that find no room "
        "retract requests; None: a request joins when its prompt fits (vLLM, TensorRT-LLM)",
    )
    static_reserve: StaticReserve | None = Field(
        default=None,
        description="gpu_memory_utilization from the device's memory, the step budget, the "
        "graph batch and the GPUs (SGLang's mem_fraction_static); None: the value given",
    )
    watermark: float = Field(
        default=0.01,
        ge=0,
        lt=1,
        description="fraction of KV blocks kept free when admitting a request (vLLM V0's "
        "watermark; V1 keeps none)",
    )


class OverlapSpec(Frozen):
    """Intra-device overlap (NanoFlow, arXiv 2408.12757): each step's batch runs as
    `nano_batches` nano-batches whose compute-bound (GEMM, prefill attention), memory-bound
    (decode attention, elementwise) and network-bound (collectives) kernels run concurrently
    on partitioned SMs (`costmodel.nanobatch`). 1: off, today's sequential step."""

    nano_batches: int = Field(
        default=1, ge=1, le=16, description="nano-batches a step's batch is split into"
    )
    compute_memory: bool = Field(
        default=True, description="compute-bound and memory-bound kernels overlap"
    )
    compute_network: bool = Field(
        default=True, description="collectives overlap the compute and memory kernels"
    )
    interference: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="slowdown of kernels that share the device's SMs while overlapped (0.1: "
        "each runs 10% longer than alone); a profile sets it with its source",
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
    decode_kv_per_query_head: bool = Field(
        default=False,
        description="the decode kernel gives each query head a thread block of its own that "
        "streams its KV head's cache, so a grouped-query layer reads the KV cache once per "
        "query head (TensorRT-LLM's masked multi-head attention before XQA); default: once "
        "per KV head, a group's query heads sharing each read",
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
    comm_memory_bytes: dict[int, Bytes] = Field(
        default_factory=dict,
        description="per-GPU memory of the engine's communicators (NCCL's buffers, NVLink "
        "SHARP's on an NVSwitch, all-reduce buffers) by tensor-parallel size, on NVIDIA GPUs "
        "behind an NVSwitch, beyond memory_reserve_bytes; a size not listed takes the next "
        "larger listed one's (the largest's beyond them); none listed: none",
    )
    mla_kv_align_bytes: int | None = Field(
        default=None,
        gt=0,
        description="on NVIDIA GPUs the engine pads each layer's MLA latent KV row (the latent "
        "and the rotary key) to a multiple of this many bytes (vLLM 0.7: 256, 576 bf16 "
        "elements taking 640); None: unpadded",
    )
    mla_absorbed_weights: bool = Field(
        default=False,
        description="the MLA backend keeps absorbed projection matrices beside the weights "
        "(vLLM 0.7: W_Q_UK and W_UV_O in fp8 where the checkpoint is fp8, W_QR and a copy of "
        "kv_b_proj in 16-bit)",
    )
    scheduler: SchedulerDefaults
    quantized_kernels: tuple[KernelFormat, ...] = ("fp8", "int8", "int4")
    greedy_pick: LogitsPass | None = Field(
        default=None,
        description="cost of the engine's pick of each sampled token beyond the forward "
        "pass's generic `sampler` op (vLLM: the logits cast to fp32, the argmax and the int32 "
        "cast), whatever the sampling; None: the generic op alone",
    )
    random_sample: LogitsPass | None = Field(
        default=None,
        description="cost of sampling at a positive temperature over the greedy pick (vLLM's "
        "temperature, softmax, exponential draw and argmax); None: not priced",
    )
    top_p: LogitsPass | None = Field(
        default=None,
        description="cost of the top-p filter, with or without a top-k (vLLM's PyTorch sort "
        "of every row); None: not priced",
    )
    top_k: LogitsPass | None = Field(
        default=None,
        description="cost of a top-k filter without a top-p (vLLM's torch.topk); None: not priced",
    )
    fused_moe_fraction: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict,
        description="compute efficiency of the engine's fused MoE kernel (routed experts' "
        "GEMMs) against its GEMM library's, by dtype; a dtype not named: 1",
    )
    fused_moe_configs: str | None = Field(
        default=None,
        description="the vLLM release (simulator/specs/fused_moe_configs.yaml, or 'none') whose "
        "shipped fused-MoE kernel configurations the routed experts run with: a shape without "
        "one runs the default configuration, at fused_moe_default_fraction for calls of more "
        "tokens than local experts (on NVIDIA GPUs, where that was measured); None: every "
        "shape as with a tuned configuration",
    )
    fused_moe_default_fraction: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=dict,
        description="compute efficiency of the fused MoE kernel's default configuration for "
        "calls of more tokens than local experts against a tuned one's, by dtype (with "
        "fused_moe_configs); a dtype not named: 1",
    )
    min_p: LogitsPass | None = Field(
        default=None,
        description="cost of the min-p filter of randomly sampled requests (vLLM's softmax, "
        "max and mask over the logits); None: not priced",
    )
    logprobs: LogitsPass | None = Field(
        default=None,
        description="cost of returning logprobs (vLLM's log-softmax and top-k over the "
        "logits); None: not priced",
    )
    penalties: PenaltyCost | None = Field(
        default=None,
        description="cost of repetition / frequency / presence penalties (vLLM's sampler); "
        "None: not priced",
    )
    async_scheduling: bool = Field(
        default=False,
        description="steps overlap the next step's CPU work with the GPU (vLLM's "
        "--async-scheduling; set by `with_async_scheduling`, not in a profile)",
    )
    tp_comm_overlap: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="share of each tensor-parallel all-reduce's producer GEMM (o_proj, "
        "down_proj) the all-reduce runs under when the engine fuses them (T3-style fused GEMM "
        "+ all-reduce); 0: off (every bundled profile); set by `with_tp_comm_overlap`",
    )
    overlap: OverlapSpec = Field(
        default_factory=OverlapSpec,
        description="nano-batched overlap of compute, memory and network kernels (NanoFlow); "
        "default: none (1 nano-batch), set by a profile or `with_nano_batches`",
    )
    frontend: FrontEnd = Field(
        default_factory=FrontEnd,
        description="what a request costs outside the engine's steps, by entrypoint (API "
        "server, offline): request handling, tokenization, the first token's way back",
    )
    entrypoint: Entrypoint = Field(
        default="server",
        description="how the engine runs (set by `on_device`, not in a profile): `server` "
        "or `offline`; picks the batch defaults and the front-end",
    )
    host_cpu: str | None = Field(
        default=None,
        description="the host CPU (an id of simulator/specs/host_cpus.yaml) the CPU costs in "
        "`overhead` were fitted on; on a host with another CPU they scale by the ratio of "
        "single-thread scores (`specs.host_cpu.engine_on_host`); None: the same on any host",
    )

    def front_end(self) -> FrontEndCost | None:
        """The front-end costs at the profile's entrypoint (None: none modelled)."""
        return self.frontend.server if self.entrypoint == "server" else self.frontend.offline

    def check_runs_on(self, hw: HardwareSpec) -> None:
        """SpecError (field `engine`) unless the engine runs on `hw`'s vendor's GPUs."""
        if self.vendors is not None and hw.vendor not in self.vendors:
            raise SpecError(
                f"{self.name} runs on {' or '.join(self.vendors)} GPUs, not on {hw.name} "
                f"({hw.vendor})",
                field="engine",
            )

    def on_device(
        self,
        *,
        hardware_id: str,
        memory_bytes: float,
        entrypoint: Entrypoint = "server",
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
    ) -> EngineSpec:
        """The profile as it runs on a device: the batch limits (and largest captured batch)
        of its first `by_device` entry that matches the device and tensor parallelism, for
        `entrypoint` (an API server, or offline), which also picks its front-end
        (`front_end`); then the memory fraction its `static_reserve` gives."""
        if entrypoint not in get_args(Entrypoint):
            raise SpecError(
                f"unknown entrypoint {entrypoint!r} ({', '.join(get_args(Entrypoint))})",
                field="entrypoint",
            )
        sched, graphs = self.scheduler, self.cuda_graph_max_tokens
        for rule in sched.by_device:
            if rule.matches(
                hardware_id=hardware_id, memory_bytes=memory_bytes, tensor_parallel=tensor_parallel
            ):
                sched = sched.model_copy(update=rule.limits(entrypoint))
                if rule.cuda_graph_max_tokens is not None:
                    graphs = rule.cuda_graph_max_tokens
                break
        if sched.static_reserve is not None:
            fraction = sched.static_reserve.fraction(
                memory_bytes=memory_bytes,
                chunk=sched.max_num_batched_tokens,
                graph_batch=graphs,
                gpus=tensor_parallel * pipeline_parallel,
            )
            sched = sched.model_copy(update={"gpu_memory_utilization": fraction})
        if (
            sched is self.scheduler
            and graphs == self.cuda_graph_max_tokens
            and entrypoint == self.entrypoint
        ):
            return self
        return self.model_copy(
            update={"scheduler": sched, "cuda_graph_max_tokens": graphs, "entrypoint": entrypoint}
        )

    def with_cpu_speed(self, factor: float, host_cpu: str) -> EngineSpec:
        """The profile on another host: every CPU cost in `overhead` (per step, per sequence,
        per kernel launch, per graph replay, the async residual) times `factor` (this host's
        time for the same work over the fitted host's), and `host_cpu` naming that host. GPU
        kernel times are not the profile's and do not change."""
        ov = self.overhead
        residual = ov.async_residual_s
        overhead = ov.model_copy(
            update={
                "step_s": ov.step_s * factor,
                "per_seq_s": ov.per_seq_s * factor,
                "launch_eager_s": ov.launch_eager_s * factor,
                "graph_launch_s": ov.graph_launch_s * factor,
                "async_residual_s": None if residual is None else residual * factor,
            }
        )
        return self.model_copy(update={"overhead": overhead, "host_cpu": host_cpu})

    def with_async_scheduling(self) -> EngineSpec:
        """The profile with async scheduling on (vLLM's --async-scheduling): a step takes
        max(GPU + `overhead.async_residual_s`, launches + CPU) instead of max(GPU, launches) +
        CPU (`costmodel.step.engine_time`), and its scheduler forms the next batch while a step
        runs (`SchedulerDefaults.schedule_ahead`: vLLM V1's engine core keeps a queue of
        `max_concurrent_batches` and schedules the next batch while the queue has room,
        vllm-project/vllm@00080ee1 vllm/v1/engine/core.py `step_with_batch_queue`); SpecError
        if the engine has none."""
        if self.overhead.async_residual_s is None:
            raise SpecError(
                f"engine {self.id or self.name} has no async scheduling (vLLM V1's "
                "--async-scheduling; try --engine vllm)",
                field="async_scheduling",
            )
        ahead = self.scheduler.model_copy(update={"schedule_ahead": True})
        return self.model_copy(update={"async_scheduling": True, "scheduler": ahead})

    def with_tp_comm_overlap(self, fraction: float) -> EngineSpec:
        """The profile with its tensor-parallel all-reduces overlapped with their producer
        GEMMs: a step hides min(all-reduce, `fraction` x those GEMMs' time)
        (`costmodel.roofline`); a profile that sets its own `tp_comm_overlap` keeps it."""
        if self.tp_comm_overlap > 0:
            return self
        return self.model_copy(update={"tp_comm_overlap": fraction})

    def with_nano_batches(self, nano_batches: int, interference: float) -> EngineSpec:
        """The profile with each step split into `nano_batches` nano-batches whose kernels
        overlap as its `overlap` says (`costmodel.nanobatch`); a profile without interference
        of its own takes `interference` (the sourced `costmodel/nanobatch.yaml`). SpecError
        outside 1..16."""
        if not 1 <= nano_batches <= 16:
            raise SpecError(
                f"nano_batches must be between 1 and 16, got {nano_batches}", field="nano_batches"
            )
        update: dict[str, object] = {"nano_batches": nano_batches}
        if self.overlap.interference == 0.0 and nano_batches > 1:
            update["interference"] = interference
        return self.model_copy(update={"overlap": self.overlap.model_copy(update=update)})

    def chunked_by_default(self, max_model_len: int | None, model: ModelSpec | None = None) -> bool:
        """Whether the engine runs chunked prefill for `model` when not told: the profile's
        `chunked_prefill`, or on for a served context longer than `chunked_prefill_above`
        (vLLM V0 turns it on above 32K tokens); off for an MLA model where the profile's
        `mla_chunked_prefill` says so (vLLM V0 0.7-0.8)."""
        sched = self.scheduler
        mla = model is not None and isinstance(model.attention, MLAttention)
        if mla and not sched.mla_chunked_prefill:
            return False
        above = sched.chunked_prefill_above
        long_context = above is not None and max_model_len is not None and max_model_len > above
        return sched.chunked_prefill or long_context

    def step_tokens(self, *, chunked: bool, max_model_len: int | None) -> int:
        """The default max_num_batched_tokens: the profile's, raised to the model's context
        length without chunked prefill where the engine does so (vLLM's EngineArgs:
        `max(max_model_len, default)`)."""
        sched = self.scheduler
        if chunked or max_model_len is None or not sched.unchunked_holds_max_model_len:
            return sched.max_num_batched_tokens
        return max(sched.max_num_batched_tokens, max_model_len)
