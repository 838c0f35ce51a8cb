"""How a replica group serves, as a scenario states it: the scheduler, the router, speculative
decoding, the KV transfer of disaggregated serving, and KV tiers below HBM. Pure data; what each
setting does is documented where it is simulated (`simulator.serving`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from simulator.errors import SpecError
from simulator.specs._base import MAX_TOKENS, BytesPerS, Frozen, Seconds
from simulator.specs.engine import NewTokenRatio
from simulator.specs.loader import validate


class SchedulerSpec(Frozen):
    kind: Literal["continuous", "prefill_first", "static"] = "continuous"
    policy: Literal["fcfs", "priority"] = "fcfs"
    preemption_mode: Literal["recompute", "swap"] = "recompute"
    max_num_seqs: int = Field(gt=0)
    max_num_batched_tokens: int = Field(gt=0)
    chunked_prefill: bool = True
    watermark: float = Field(default=0.01, ge=0, lt=1)
    # Speculative decoding: a decoding request also verifies this many proposed tokens per
    # step, and holds KV slots for them (vLLM's lookahead slots; serving/speculative.py).
    num_speculative_tokens: int = Field(default=0, ge=0)
    # Multi-step scheduling (vLLM V0's --num-scheduler-steps): decode batches run in blocks of
    # this many steps per scheduler call; see serving/replica.py.
    num_scheduler_steps: int = Field(default=1, ge=1)
    # With multi-step scheduling, each step's tokens are returned as the step ends (vLLM's
    # --multi-step-stream-outputs, on by default from 0.6.2); False: a block's tokens come at
    # its end and a request that finishes inside it computes to it (vLLM 0.6.0-0.6.1).
    multi_step_stream_outputs: bool = True
    # The next batch is formed while a step runs (SGLang's overlap scheduler): an arrival
    # during step N joins step N+2 at the earliest (serving/replica.py).
    schedule_ahead: bool = False
    # SGLang's admission by new_token_ratio (prefill_first only); None: a request joins when
    # its prompt's KV blocks fit (vLLM).
    admission: NewTokenRatio | None = None


RouterKind = Literal[
    "round_robin", "least_outstanding", "least_kv", "power_of_two", "prefix_affinity", "length"
]


class RouterSpec(Frozen):
    """The router's policy (`kind`) and the parameters of the two that take any.

    prefix_affinity: SGLang router's cache-aware policy; its defaults are sgl-router's
    (sgl-project/sglang, sgl-router/py_src/sglang_router/router_args.py: cache_threshold 0.3,
    balance_abs_threshold 64, balance_rel_threshold 1.5). length: requests whose prompt +
    output exceed `length_threshold` tokens go to replica group `long_group`, the others to
    the remaining groups (Melange, arXiv 2404.14527: each request size to the GPU type that
    serves it cheapest)."""

    kind: RouterKind = "round_robin"
    cache_threshold: float = Field(
        default=0.3,
        ge=0,
        le=1,
        description="prefix_affinity: the cached share of a prompt above which it goes to the "
        "replica holding it (below: to the replica with the most free KV)",
    )
    balance_abs_threshold: int = Field(
        default=64,
        ge=0,
        description="prefix_affinity: outstanding requests, busiest - idlest, above which "
        "(and above balance_rel_threshold) it routes to the least outstanding replica",
    )
    balance_rel_threshold: float = Field(
        default=1.5,
        ge=1,
        description="prefix_affinity: busiest / idlest outstanding above which (and above "
        "balance_abs_threshold) it routes to the least outstanding replica",
    )
    length_threshold: int | None = Field(
        default=None,
        gt=0,
        le=MAX_TOKENS,
        description="length: prompt + output tokens above which a request is long",
    )
    long_group: int = Field(
        default=0, ge=0, description="length: the replica group (index) long requests go to"
    )

    @model_validator(mode="after")
    def _length_fields(self) -> RouterSpec:
        if self.kind == "length" and self.length_threshold is None:
            raise ValueError("the length router needs length_threshold (tokens)")
        if self.kind != "length" and self.length_threshold is not None:
            raise ValueError("length_threshold applies to the length router only")
        return self


Method = Literal["ngram", "eagle", "eagle3", "draft_model", "mtp", "deepseek_mtp", "medusa"]


FIELD = "speculative_config"


Rate = Annotated[float, Field(ge=0, le=1)]


class SpeculativeSpec(Frozen):
    """vLLM's speculative config plus the acceptance: `acceptance_rate` (every position, each
    conditional on the previous one being accepted) or `acceptance_rates` (one per position)."""

    method: Method
    num_speculative_tokens: int = Field(ge=1)
    model: str | None = Field(default=None, description="draft model (draft_model)")
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    acceptance_rate: Rate | None = None
    acceptance_rates: tuple[Rate, ...] | None = None

    @model_validator(mode="before")
    @classmethod
    def _infer_method(cls, data: Any) -> Any:
        """As vLLM: without a method, a model "ngram" means ngram, any other a draft model."""
        if isinstance(data, dict) and data.get("method") is None and data.get("model"):
            ngram = data["model"] in ("ngram", "[ngram]")
            data = {**data, "method": "ngram" if ngram else "draft_model"}
            if ngram:
                data.pop("model")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> SpeculativeSpec:
        k = self.num_speculative_tokens
        if (self.acceptance_rate is None) == (self.acceptance_rates is None):
            raise ValueError(
                "give acceptance_rate (per position, given the previous accepted) or "
                "acceptance_rates (one per position), not both: it depends on the data"
            )
        if self.acceptance_rates is not None and len(self.acceptance_rates) != k:
            raise ValueError(
                f"acceptance_rates has {len(self.acceptance_rates)} values for "
                f"num_speculative_tokens {k}"
            )
        if self.kind == "draft_model" and not self.model:
            raise ValueError("method draft_model needs model (the draft model's id or config)")
        if self.kind != "ngram" and (self.prompt_lookup_min or self.prompt_lookup_max):
            raise ValueError("prompt_lookup_min/max apply to method ngram only")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"prompt_lookup_min {lo} exceeds prompt_lookup_max {hi}")
        if self.kind in ("ngram", "medusa") and self.draft_tensor_parallel_size is not None:
            raise ValueError(f"method {self.method} has no draft model to parallelise")
        return self

    @property
    def kind(self) -> Literal["ngram", "eagle", "eagle3", "draft_model", "mtp", "medusa"]:
        return "mtp" if self.method == "deepseek_mtp" else self.method

    @property
    def rates(self) -> tuple[float, ...]:
        """P(position i accepted | position i - 1 accepted), one per proposal."""
        if self.acceptance_rates is not None:
            return self.acceptance_rates
        return (self.acceptance_rate or 0.0,) * self.num_speculative_tokens

    @property
    def expected_tokens(self) -> float:
        """Tokens a verification yields on average: 1 + sum over i of prod(rates[:i + 1])."""
        return 1.0 + float(np.cumprod(self.rates).sum())


def parse_speculative_config(
    value: SpeculativeSpec | Mapping[str, Any] | str | None, *, source: str = FIELD
) -> SpeculativeSpec | None:
    """A SpeculativeSpec from vLLM's JSON text, a mapping or a spec (None stays None)."""
    if value is None or isinstance(value, SpeculativeSpec):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SpecError(f"not valid JSON ({exc.msg})", source=source, field=FIELD) from None
        except RecursionError:
            raise SpecError("not valid JSON (nested too deeply)", source=source) from None
    return validate(
        SpeculativeSpec, dict(value) if isinstance(value, Mapping) else value, source=source
    )


LinkKind = Literal["auto", "nvlink", "infiniband", "roce", "pcie"]


class KVTransferSpec(Frozen):
    """How the KV cache travels from the prefill pool to the decode pool."""

    kind: LinkKind = "auto"
    bandwidth_bytes_per_s: BytesPerS | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="achieved, per GPU and direction (default: the specs)",
    )
    latency_s: Seconds | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="per transfer"
    )
    layerwise: bool = Field(
        default=False, description="send each layer's KV as the prefill computes it"
    )


class KvPoolSpec(Frozen):
    """A cluster's KV cache pooled across its replicas (a scenario's `kv_pool:`), after
    Infinite-LLM (arXiv 2401.02669): with `mode: distributed` a replica whose KV cache is full
    borrows free blocks of other replicas instead of queueing or preempting, and attention
    over the borrowed blocks runs where they lie (DistAttention); see serving/kv_pool.py.

    `max_lend_fraction`: the most of a replica's blocks lent out at once (1: all it has free
    above its watermark). `link`: what joins the replicas (`KVTransferSpec.kind`; auto: the
    GPU fabric when every replica fits one node, else the scale-out network)."""

    mode: Literal["off", "distributed"] = "off"
    max_lend_fraction: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    link: LinkKind = "auto"


Backend = Literal["native", "lmcache"]


class KVOffloadSpec(Frozen):
    """KV-cache tiers of one replica group (a scenario's `kv_offload:`)."""

    backend: Backend = Field(
        default="native",
        description="vLLM's --kv-offloading-backend: native (loads between steps, the request "
        "waits) or lmcache (loads before the step, the batch waits; CPU and NVMe tiers)",
    )
    cpu_gib: float | None = Field(
        default=None,
        gt=0,
        description="host memory for KV blocks per replica, over its tp x pp GPUs (vLLM's "
        "--kv-offloading-size); None: host memory per GPU less swap space and offloaded weights",
    )
    nvme_gib: float = Field(
        default=0.0, ge=0, description="NVMe tier per replica, over its GPUs (lmcache); 0: none"
    )
    cpu_bw_bytes_per_s: BytesPerS | None = Field(
        default=None,
        gt=0,
        description="GPU <-> host copy bandwidth per GPU (None: min(PCIe x host_link_fraction, "
        "host DRAM bandwidth) from the hardware spec)",
    )
    nvme_bw_bytes_per_s: BytesPerS | None = Field(
        default=None, gt=0, description="NVMe read bandwidth per GPU (None: the hardware spec's)"
    )

    @model_validator(mode="after")
    def _native_has_no_disk(self) -> KVOffloadSpec:
        if self.backend == "native" and self.nvme_gib > 0:
            raise ValueError("the native backend offloads to CPU memory only; use lmcache for NVMe")
        return self


def kv_offload_problem(
    *,
    prefix_caching: bool,
    role: str,
    data_parallel_size: int,
    micro_batching: bool,
    preemption_mode: str | None,
) -> str | None:
    """Why a replica group cannot have KV tiers, or None."""
    if not prefix_caching:
        return "kv_offload needs enable_prefix_caching: offloaded blocks are found by their keys"
    if role != "both":
        return "kv_offload in disaggregated pools is not modelled"
    if data_parallel_size > 1 or micro_batching:
        return "kv_offload with DP attention or pipeline micro-batching is not modelled"
    if preemption_mode == "swap":
        return "kv_offload with swap preemption is not modelled (vLLM V1 reloads from the tier)"
    return None


PD_PARTITION_FORMS = (
    "static:<prefill SM share in (0, 1)> or dynamic:<decode TBT target in ms>, then optionally "
    ",prefill=fcfs|spf and (dynamic) ,hysteresis=<fraction of the target in [0, 1)>"
)


class PdPartition(Frozen):
    """Intra-GPU prefill/decode partitioning (Nexus, arXiv 2507.06608; serving.pd_partition):
    a prefill and a decode stream run at once on one replica's GPUs, each on its share
    of the SMs. `static`: the prefill stream always has `prefill_share` of them, the decode
    stream the rest. `dynamic`: before each step the decode stream takes the smallest share
    whose step meets `tbt_target_s`, the prefill stream the rest; a stream alone has the
    whole GPU. `hysteresis` (dynamic; a fraction h of the target): the decode share rises as
    soon as its step would miss the target, and falls only to a share whose step is within
    (1 - h) x the target. `prefill_order`: the prefill stream's queue, `fcfs` (the engine's)
    or `spf` (shortest prompt first: fewest prompt tokens left)."""

    mode: Literal["static", "dynamic"]
    prefill_share: float | None = Field(default=None, gt=0, lt=1)
    tbt_target_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    hysteresis: float = Field(default=0.0, ge=0, lt=1)
    prefill_order: Literal["fcfs", "spf"] = "fcfs"

    @property
    def text(self) -> str:
        """How the flag spells it: "static:0.6", "dynamic:50,prefill=spf,hysteresis=0.2"."""
        if self.mode == "static":
            text = f"static:{self.prefill_share:g}"
        else:
            text = f"dynamic:{(self.tbt_target_s or 0.0) * 1e3:g}"
        if self.prefill_order != "fcfs":
            text += f",prefill={self.prefill_order}"
        if self.hysteresis:
            text += f",hysteresis={self.hysteresis:g}"
        return text


def parse_pd_partition(text: str) -> PdPartition:
    """`static:<share>` or `dynamic:<TBT ms>`, then `,prefill=fcfs|spf` and (dynamic only)
    `,hysteresis=<fraction>` in any order, as a PdPartition; SpecError (field pd_partition)
    for anything else, a share outside (0, 1), a target that is not a positive number of
    milliseconds, an unknown or repeated option or a hysteresis outside [0, 1)."""
    head, *options = text.strip().split(",")
    mode, _, value = head.strip().partition(":")
    number = _number(value)
    if mode == "static":
        if not 0.0 < number < 1.0:
            raise SpecError(
                f"{text!r}: the prefill SM share must be a number strictly between 0 and 1 "
                f"(expected {PD_PARTITION_FORMS})",
                field="pd_partition",
            )
        fields: dict[str, Any] = {"mode": "static", "prefill_share": number}
    elif mode == "dynamic":
        if not (0.0 < number < float("inf")):
            raise SpecError(
                f"{text!r}: the decode TBT target must be a positive number of milliseconds "
                f"(expected {PD_PARTITION_FORMS})",
                field="pd_partition",
            )
        fields = {"mode": "dynamic", "tbt_target_s": number / 1e3}
    else:
        raise SpecError(f"{text!r}: expected {PD_PARTITION_FORMS}", field="pd_partition")
    for option in options:
        key, _, value = option.strip().partition("=")
        if key == "prefill" and value in ("fcfs", "spf") and "prefill_order" not in fields:
            fields["prefill_order"] = value
        elif key == "hysteresis" and mode == "dynamic" and "hysteresis" not in fields:
            band = _number(value)
            if not 0.0 <= band < 1.0:
                raise SpecError(
                    f"{text!r}: the hysteresis is a fraction of the TBT target in [0, 1)",
                    field="pd_partition",
                )
            fields["hysteresis"] = band
        else:
            raise SpecError(
                f"{text!r}: {option.strip()!r} is not an option here (expected "
                f"{PD_PARTITION_FORMS})",
                field="pd_partition",
            )
    return PdPartition(**fields)


def _number(text: str) -> float:
    """`text` as a float; NaN (which every range check refuses) when it is not a number."""
    try:
        return float(text)
    except ValueError:
        return float("nan")
