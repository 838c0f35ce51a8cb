"""Weights kept off the GPU: what a deployment offloads and how it brings it back. Pure data.

Two mechanisms, which combine:

- **Weight streaming** (`cpu_offload_gb`, vLLM's flag: GiB of each GPU's decoder-layer weights
  kept in host memory and brought over the host link in every forward pass; or
  `resident_layers`, llama.cpp's `-ngl` count: layers per GPU that stay resident, the rest
  streamed). `transfer` says how: `prefetch` (double-buffered copies on a side stream, ahead of
  the layer that needs them: vLLM's prefetch offloader, FlexGen, DeepSpeed ZeRO-Inference),
  `uva` (zero-copy: kernels read the weights from pinned host memory as they run, vLLM's default
  `--cpu-offload-gb` backend since V1), or `sync` (a blocking copy before each streamed layer,
  vLLM V0's implementation).
- **MoE expert offload** (`expert_offload`): each MoE layer keeps `cache_fraction` of its routed
  experts on the GPU, the rest in host memory. A token routed to an uncached expert either
  fetches that expert over the host link or, with `cpu_compute`, has it computed by the host
  CPU (ktransformers, Fiddler, llama.cpp's `--override-tensor exps=CPU`).

Embeddings and the LM head always stay on the GPU (vLLM offloads decoder layers only).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from simulator.errors import SpecError
from simulator.specs._base import Bytes, Frozen
from simulator.specs.loader import validate

OffloadSource = Literal["host", "nvme"]
Transfer = Literal["prefetch", "uva", "sync"]


class ExpertOffloadSpec(Frozen):
    """Routed experts in host memory with a GPU cache of `cache_fraction` of them per layer.

    The cache holds the most popular experts (a static placement by popularity). The share of
    token-to-expert routings it serves (`hit_rate`) is given, or follows from routing skew:
    expert popularity ~ rank^-zipf_skew (0: uniform routing, hit rate = cache_fraction)."""

    cache_fraction: float = Field(
        ge=0, le=1, description="share of each MoE layer's routed experts kept on the GPU"
    )
    hit_rate: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="share of token-expert routings served by the GPU cache (None: from "
        "zipf_skew and cache_fraction)",
    )
    zipf_skew: float = Field(
        default=0.0, ge=0, le=4, description="routing popularity ~ rank^-s; 0 = uniform"
    )
    cpu_compute: bool = Field(
        default=False,
        description="compute uncached experts on the host CPU instead of fetching them",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ExpertOffloadSpec:
        h, f = self.hit_rate, self.cache_fraction
        if h is not None and ((f == 0 and h > 0) or (f == 1 and h < 1)):
            raise ValueError(f"hit_rate {h} is impossible with cache_fraction {f}")
        return self


class OffloadSpec(Frozen):
    """What each GPU keeps off the device; see the module docstring."""

    cpu_offload_gb: float = Field(
        default=0.0, ge=0, description="GiB of decoder-layer weights per GPU streamed each step"
    )
    resident_layers: int | None = Field(
        default=None, ge=0, description="decoder layers per GPU kept resident; the rest stream"
    )
    source: OffloadSource = Field(
        default="host", description="where offloaded weights live: host DRAM or NVMe"
    )
    transfer: Transfer = Field(default="prefetch", description="prefetch | uva | sync")
    host_memory_bytes: Bytes | None = Field(
        default=None, gt=0, description="host DRAM per GPU (None: the hardware spec's host)"
    )
    expert_offload: ExpertOffloadSpec | None = None

    @model_validator(mode="after")
    def _one_knob(self) -> OffloadSpec:
        if self.cpu_offload_gb > 0 and self.resident_layers is not None:
            raise ValueError("give cpu_offload_gb or resident_layers, not both")
        if self.transfer == "uva" and self.source == "nvme":
            raise ValueError("uva reads pinned host memory; NVMe needs prefetch or sync")
        if self.source == "nvme" and self.expert_offload and self.expert_offload.cpu_compute:
            raise ValueError("CPU expert compute needs the experts in host memory, not NVMe")
        return self

    @property
    def streams_weights(self) -> bool:
        return self.cpu_offload_gb > 0 or self.resident_layers is not None

    @property
    def active(self) -> bool:
        return self.streams_weights or self.expert_offload is not None


OffloadLike = OffloadSpec | Mapping[str, Any] | str | None


def parse_offload(value: OffloadLike, *, source: str = "offload") -> OffloadSpec:
    """An OffloadSpec from a spec, a mapping or JSON text (`--offload-config`); None gives the
    default (nothing offloaded). Bad JSON or fields are a SpecError naming `source`."""
    if isinstance(value, OffloadSpec):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SpecError(f"not valid JSON ({exc.msg})", source=source) from None
        except RecursionError:
            raise SpecError("not valid JSON (nested too deeply)", source=source) from None
    if value is not None and not isinstance(value, Mapping):
        raise SpecError("expected a JSON object of offload settings", source=source)
    return validate(OffloadSpec, dict(value or {}), source=source)


def resolve_offload(
    *,
    cpu_offload_gb: float = 0.0,
    offload: OffloadLike = None,
    expert_offload: ExpertOffloadSpec | Mapping[str, Any] | None = None,
    source: str = "offload",
) -> OffloadSpec | None:
    """One OffloadSpec from vLLM's `cpu_offload_gb`, an `offload` spec (a spec, a mapping or
    JSON text such as `--offload-config`) and an `expert_offload` block; None when nothing is
    offloaded. Giving the same knob twice with different values is a SpecError."""
    data = parse_offload(offload, source=source).model_dump(exclude_defaults=True)
    if cpu_offload_gb < 0:
        raise SpecError(f"must be at least 0, got {cpu_offload_gb}", field="cpu_offload_gb")
    if cpu_offload_gb:
        given = data.get("cpu_offload_gb")
        if given not in (None, cpu_offload_gb):
            raise SpecError(
                f"cpu_offload_gb {cpu_offload_gb} disagrees with offload.cpu_offload_gb {given}",
                source=source,
                field="cpu_offload_gb",
            )
        data["cpu_offload_gb"] = cpu_offload_gb
    if expert_offload is not None:
        if data.get("expert_offload") is not None:
            raise SpecError(
                "expert_offload given twice (also inside offload)",
                source=source,
                field="expert_offload",
            )
        data["expert_offload"] = (
            expert_offload.model_dump()
            if isinstance(expert_offload, ExpertOffloadSpec)
            else dict(expert_offload)
        )
    spec = validate(OffloadSpec, data, source=source)
    return spec if spec.active else None
