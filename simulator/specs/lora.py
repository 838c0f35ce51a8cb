"""Multi-LoRA serving as a scenario states it: the engine's adapter slots (`LoraSpec`, vLLM's
--enable-lora flags) and which adapter each request names (`AdapterMix`, the workload's).

vLLM's flags (vllm/config/lora.py, `LoRAConfig`, v0.11:
https://docs.vllm.ai/en/v0.11.0/api/vllm/config/lora.html): `max_loras` (default 1) adapters
in one batch, each of rank at most `max_lora_rank` (default 16; vLLM accepts 1, 8, 16, 32,
64, 128, 256, 320, 512); `max_cpu_loras` (default: max_loras, must be >= it) adapters cached in
host memory. vLLM preallocates max_loras GPU slots of max_lora_rank for every LoRA-wrapped
layer when the engine starts, so they come out of the KV cache (`costmodel.lora`).
`lora_extra_vocab_size` (default 256) is deprecated in v0.11 and removed in v0.12; llmsim
does not model extra vocabulary.

Adapter popularity: S-LoRA (arXiv 2311.03285, section 7) draws each request's adapter from a
power law of exponent alpha over n adapters, and Punica (arXiv 2310.18547, section 7) from
its "Distinct", "Uniform", "Skewed" (Zipf, alpha 1.5) and "Identical" mixes; `uniform` and
`zipf` cover both (Identical is n = 1).
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, ValidationInfo, field_validator

from simulator.specs._base import Frozen

# vLLM's accepted --max-lora-rank values (vllm/config/lora.py, LoRAConfig.max_lora_rank)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The linear layers vLLM wraps with LoRA in a Llama-style decoder (its packed qkv_proj and
# gate_up_proj carry one adapter slice per part).
TargetModule = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TARGET_MODULES: tuple[TargetModule, ...] = get_args(TargetModule)


class LoraSpec(Frozen):
    """vLLM's --enable-lora with --max-loras, --max-lora-rank and --max-cpu-loras.
    `target_modules`: the layers adapters touch (vLLM's slots cover every LoRA-capable layer:
    the default is all of them)."""

    max_loras: int = Field(1, ge=1, le=4096)
    max_lora_rank: int = 16
    max_cpu_loras: int | None = Field(None, ge=1)
    target_modules: tuple[TargetModule, ...] = TARGET_MODULES

    @field_validator("max_lora_rank")
    @classmethod
    def _known_rank(cls, rank: int) -> int:
        if rank not in LORA_RANKS:
            raise ValueError(
                f"must be one of {', '.join(map(str, LORA_RANKS))} (vLLM's), got {rank}"
            )
        return rank

    @field_validator("max_cpu_loras")
    @classmethod
    def _holds_the_slots(cls, value: int | None, info: ValidationInfo) -> int | None:
        slots = info.data.get("max_loras")
        if value is not None and slots is not None and value < slots:
            raise ValueError(f"must be >= max_loras ({slots}), got {value}")
        return value

    @field_validator("target_modules")
    @classmethod
    def _each_once(cls, modules: tuple[str, ...]) -> tuple[str, ...]:
        if not modules or len(set(modules)) != len(modules):
            raise ValueError("must name each module once, at least one")
        return modules

    @property
    def cpu_slots(self) -> int:
        """Adapters host memory caches (vLLM: max_cpu_loras, else max_loras)."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras


class AdapterMix(Frozen):
    """Each request names one of `num_adapters` adapters (ids 0..n-1), drawn `uniform`ly or
    from a Zipf law (`zipf`: adapter i with weight 1 / (i + 1) ** `alpha`)."""

    num_adapters: int = Field(ge=1, le=1_000_000)
    distribution: Literal["uniform", "zipf"] = "uniform"
    alpha: float = Field(1.0, gt=0, le=10, allow_inf_nan=False)
