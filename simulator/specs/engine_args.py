"""The engine flags `llmsim bench throughput|serve` share, as one typed object, and the scenario
replica group they describe.

The names and defaults are vLLM's (`vllm serve`'s engine arguments, vLLM's `EngineArgs`), plus
`engine`, `offload_config` and `pipeline_micro_batching`, which vLLM has no flag for. The CLI
builds one `EngineArgs` from the parsed flags; `runner.bench_scenario` and
`runner.bench_throughput` take it, so the flags are passed on in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simulator.errors import SpecError
from simulator.specs.engine import Entrypoint
from simulator.specs.offload import OffloadLike, parse_offload
from simulator.specs.serving import SpeculativeSpec, parse_speculative_config


@dataclass(frozen=True, kw_only=True)
class EngineArgs:
    """One replica's engine and deployment flags, spelled as vLLM spells them.

    `data_parallel_size`: independent replicas; with `enable_expert_parallel`, one replica of
    that many DP-attention ranks (EP = tp x dp, as vLLM runs a MoE model). `swap_space`: host
    swap space per GPU, GiB. `speculative_config`: vLLM's --speculative-config (JSON text, a
    mapping or a SpeculativeSpec) with the acceptance added. `cpu_offload_gb` (GiB of weights
    per GPU kept in host memory) and `offload_config` (the rest of
    `simulator.specs.offload.OffloadSpec`, as JSON text or a mapping) keep weights off the GPU.
    `kv_offloading_size` (GiB of host memory per replica) and `kv_offloading_backend`: vLLM's
    KV offloading flags, a CPU tier below HBM (`serving.kv_tiers`; needs prefix caching).
    None: the engine profile's default (prefix caching: on in vLLM V1, SGLang, TensorRT-LLM).
    `async_scheduling`: vLLM's --async-scheduling (the next step's CPU work overlaps the GPU).
    `overlap_tp_comm`: tensor-parallel all-reduces fused with their producer GEMMs.
    `nano_batches`: each step split into that many overlapped nano-batches (NanoFlow; None:
    the engine profile's).
    `pd_partition`: intra-GPU prefill/decode partitioning (Nexus): "static:<prefill SM
    share>" or "dynamic:<decode TBT target ms>" (`specs.serving.PdPartition`).
    `max_model_len`: vLLM's --max-model-len (None: the model's context length).
    `host_cpu`: the node's CPU where it is not the hardware's (`--host-cpu`; an id of
    simulator/specs/host_cpus.yaml): the engine's CPU costs scale to it.
    `kv_budget`: tokens of KV each sequence keeps after its prompt, chosen by `kv_eviction`
    (snapkv, h2o, streaming; `specs.deployment.KvEviction`); no vLLM flag.
    `enable_lora`, `max_loras`, `max_lora_rank`, `max_cpu_loras`: vLLM's multi-LoRA flags
    (`specs.lora.LoraSpec`; None: vLLM's defaults, 1, 16 and max_loras); the three sizes
    need `enable_lora`.
    `shadowkv` and `swiftkv`: the fields of `specs.deployment.ShadowKV` / `SwiftKV` (an empty
    mapping takes the papers' settings); no vLLM flags.
    `kv_pool`: `distributed` pools the data_parallel_size replicas' KV caches (the
    scenario's `kv_pool: {mode: distributed}`, `serving.kv_pool`); no vLLM flag.
    Values are checked when the scenario is validated.
    """

    engine: str = "vllm"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    context_parallel_size: int = 1
    data_parallel_size: int = 1
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    kv_budget: int | None = None
    kv_eviction: str = "snapkv"
    shadowkv: Mapping[str, Any] | None = None
    swiftkv: Mapping[str, Any] | None = None
    enforce_eager: bool = False
    max_model_len: int | None = None
    async_scheduling: bool = False
    overlap_tp_comm: bool = False
    nano_batches: int | None = None
    pd_partition: str | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    scheduling_policy: str | None = None
    preemption_mode: str | None = None
    num_scheduler_steps: int | None = None
    multi_step_stream_outputs: bool | None = None
    swap_space: float = 4.0
    enable_prefix_caching: bool | None = None
    kv_offloading_size: float | None = None
    kv_offloading_backend: str | None = None
    speculative_config: SpeculativeSpec | Mapping[str, Any] | str | None = None
    cpu_offload_gb: float = 0.0
    offload_config: OffloadLike = None
    enable_expert_parallel: bool = False
    pipeline_micro_batching: bool = False
    host_cpu: str | None = None
    enable_lora: bool = False
    max_loras: int | None = None
    max_lora_rank: int | None = None
    max_cpu_loras: int | None = None
    kv_pool: str = "off"

    def replica_group(self, *, hardware: str, entrypoint: Entrypoint = "server") -> dict[str, Any]:
        """The fields of the scenario's one replica group (`scenario.ReplicaGroupSpec`) on
        `hardware`, run as an API server or `offline` (vLLM's LLM class); raises SpecError
        for KV offloading without its size or prefix caching, and for bad speculative or
        offload JSON."""
        kv_offload = self._kv_offload()  # its errors come before the JSON flags' errors
        dp_attention = self.enable_expert_parallel and self.data_parallel_size > 1
        speculative = parse_speculative_config(
            self.speculative_config, source="--speculative-config"
        )
        offload = parse_offload(self.offload_config, source="--offload-config")
        return {
            "hardware": hardware,
            "engine": self.engine,
            "entrypoint": entrypoint,
            "count": 1 if dp_attention else self.data_parallel_size,
            "data_parallel_size": self.data_parallel_size if dp_attention else 1,
            "enable_expert_parallel": self.enable_expert_parallel,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "context_parallel_size": self.context_parallel_size,
            "pipeline_micro_batching": self.pipeline_micro_batching,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "kv_cache_dtype": self.kv_cache_dtype,
            "kv_budget": self.kv_budget,
            "kv_eviction": self.kv_eviction,
            "shadowkv": None if self.shadowkv is None else dict(self.shadowkv),
            "swiftkv": None if self.swiftkv is None else dict(self.swiftkv),
            "enforce_eager": self.enforce_eager,
            "max_model_len": self.max_model_len,
            "async_scheduling": self.async_scheduling,
            "host_cpu": self.host_cpu,
            "overlap_tp_comm": self.overlap_tp_comm,
            "nano_batches": self.nano_batches,
            "pd_partition": self.pd_partition,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "swap_space_gib": self.swap_space,
            "enable_prefix_caching": self.enable_prefix_caching,
            "scheduler": {
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "chunked_prefill": self.enable_chunked_prefill,
                "policy": self.scheduling_policy,
                "preemption_mode": self.preemption_mode,
                "num_scheduler_steps": self.num_scheduler_steps,
                "multi_step_stream_outputs": self.multi_step_stream_outputs,
            },
            "speculative": speculative.model_dump(exclude_none=True) if speculative else None,
            "cpu_offload_gb": self.cpu_offload_gb,
            "offload": offload.model_dump(exclude_defaults=True) or None,
            "kv_offload": kv_offload,
            "lora": self._lora(),
        }

    def _lora(self) -> dict[str, Any] | None:
        """The replica group's `lora` field from vLLM's LoRA flags."""
        sizes = {
            "max_loras": self.max_loras,
            "max_lora_rank": self.max_lora_rank,
            "max_cpu_loras": self.max_cpu_loras,
        }
        if not self.enable_lora:
            for name, value in sizes.items():
                if value is not None:
                    raise SpecError("needs --enable-lora", field=name)
            return None
        return {name: value for name, value in sizes.items() if value is not None}

    def _kv_offload(self) -> dict[str, Any] | None:
        """The replica group's `kv_offload` field from vLLM's two KV offloading flags."""
        if self.kv_offloading_backend is not None and self.kv_offloading_size is None:
            raise SpecError("needs --kv-offloading-size", field="kv_offloading_backend")
        if self.kv_offloading_size is None:
            return None
        if self.enable_prefix_caching is False:
            raise SpecError(
                "needs prefix caching, not --no-enable-prefix-caching (offloaded blocks are "
                "found by their prefix-cache keys)",
                field="kv_offloading_size",
            )
        return {
            "cpu_gib": self.kv_offloading_size,
            "backend": self.kv_offloading_backend or "native",
        }
