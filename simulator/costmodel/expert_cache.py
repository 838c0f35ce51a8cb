"""MoE experts in host memory behind a GPU expert cache: hit rate, misses, and their cost.

Routing. A token picks `top_k` of `E` experts. Expert popularity follows a Zipf law over its
rank r (1 = most popular): a token chooses expert r with probability

    q_r = min(1, c * r^-s),   with c such that sum_r q_r = top_k

(the cap at 1 because a token picks an expert at most once; capped mass is spread over the
others in proportion, "water-filling"). s = 0 is uniform routing, q_r = top_k / E. The cache
holds the C = round(cache_fraction * E) most popular experts, so the share of routings it serves
(the hit rate) is

    h = sum_{r <= C} q_r / top_k      (uniform: h = C / E; below the cap: H(C, s) / H(E, s),
                                        H the generalised harmonic number)

Given a hit rate instead, the uncached experts share the missed routings evenly:
q = (1 - h) * top_k / (E - C) each.

Misses of one step. T tokens (a step's tokens, as the MoE operators count them) miss on
uncached expert r with probability 1 - (1 - q_r)^T, so the step touches

    M(T) = sum_{r > C} (1 - (1 - q_r)^T)

distinct uncached experts per MoE layer (spread evenly over the `ep` expert-parallel groups).

Cost per MoE layer and device. Fetch: the M experts' weights cross the host link after the
router has chosen them, while the GPU computes the cached experts and shared experts:
exposed = max(0, fetch - cached - shared). CPU compute: the host CPU runs the missed routings
(roofline: max(FLOPs / cpu_flops_per_s, expert bytes / host memory bandwidth), plus the hidden
states' round trip over the link) alongside the GPU's cached and shared experts; the layer then
takes max(GPU part, CPU part) instead of the GPU doing all experts. With `cpu_compute` a step
takes whichever of the two is faster, as engines switch to fetching for large batches
(llama.cpp copies host-resident weights to the GPU for batches of 32 tokens or more). The
missed experts' share of the GPU expert time is M / D, D the distinct experts the operators
cost (uniform routing).

Not modelled: cache replacement (LRU and similar: give `hit_rate`), expert prefetch by
predicting the next layer's routing, imbalance of hot experts across expert-parallel devices,
CPU matrix units (AMX) and CPU efficiency below the node spec's peaks, pinned-memory limits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.costmodel.batch import Num
from simulator.costmodel.ops import experts_hit
from simulator.errors import SpecError
from simulator.specs.deployment import Parallelism, Precision
from simulator.specs.hardware import HardwareSpec
from simulator.specs.model import DTYPE_BYTES, ModelSpec
from simulator.specs.offload import ExpertOffloadSpec
from simulator.specs.weights import LinearName


def routing_probabilities(*, num_experts: int, top_k: int, skew: float) -> np.ndarray:
    """Probability that one token picks each expert, most popular first (sums to top_k)."""
    weights = np.arange(1, num_experts + 1, dtype=float) ** -skew
    capped = np.zeros(num_experts, dtype=bool)
    while True:
        free = ~capped
        scale = (top_k - capped.sum()) / weights[free].sum()
        q = np.where(capped, 1.0, weights * scale)
        over = free & (q > 1.0)
        if not over.any():
            return q
        capped |= over


def zipf_hit_rate(*, num_experts: int, top_k: int, skew: float, cached: int) -> float:
    """Share of routings served by a cache of the `cached` most popular experts."""
    q = routing_probabilities(num_experts=num_experts, top_k=top_k, skew=skew)
    return float(q[:cached].sum() / top_k)


def expected_misses(uncached_q: np.ndarray, tokens: Num) -> np.ndarray:
    """Expected distinct uncached experts `tokens` tokens touch (per MoE layer)."""
    t = np.asarray(tokens, dtype=float)
    miss = 1.0 - (1.0 - uncached_q.reshape(-1, *([1] * t.ndim))) ** t
    return np.asarray(miss.sum(axis=0))


@dataclass(frozen=True)
class ExpertCache:
    """One device's expert cache. Sizes are per device: `expert_bytes` and `expert_params` of
    its shard of one expert; `uncached_q` the per-token probabilities of the uncached experts
    (model-wide); `ep` the groups experts are spread over; link and host rates in bytes/s,
    FLOP/s."""

    num_experts: int
    top_k: int
    cached: int
    hit_rate: float
    uncached_q: np.ndarray
    ep: int
    expert_bytes: float
    expert_params: float
    hidden_bytes: float  # one token's hidden state
    num_layers: int
    link_bytes_per_s: float
    cpu_flops_per_s: float
    host_bw_bytes_per_s: float
    cpu_compute: bool

    @property
    def offloaded_bytes_per_layer(self) -> float:
        return (self.num_experts - self.cached) / self.ep * self.expert_bytes

    def misses(self, tokens: Num) -> np.ndarray:
        """Distinct uncached experts this device needs per MoE layer in a step of `tokens`."""
        return expected_misses(self.uncached_q, tokens) / self.ep

    def staging_bytes(self, *, max_tokens: int) -> float:
        """GPU buffer for one layer's fetched experts at the largest step."""
        most = min(np.ceil(float(self.misses(max_tokens))), (self.num_experts - self.cached))
        return float(most) * self.expert_bytes

    def layer_extra_s(
        self, tokens: Num, *, expert_gpu_s: Num, shared_gpu_s: Num
    ) -> tuple[np.ndarray, np.ndarray]:
        """Time the offload adds to one MoE layer (negative where the CPU takes GPU work), and
        where the CPU computes the misses (with `cpu_compute`, whichever is faster)."""
        t = np.asarray(tokens, dtype=float)
        missed = self.misses(t)
        hit = experts_hit(self.num_experts, self.top_k, t) / self.ep
        share = np.minimum(1.0, np.divide(missed, hit, out=np.zeros_like(missed), where=hit > 0))
        gpu_cached = (1.0 - share) * expert_gpu_s + shared_gpu_s
        fetch = missed * self.expert_bytes / self.link_bytes_per_s
        fetched = np.asarray(np.maximum(0.0, fetch - gpu_cached))
        if not self.cpu_compute:
            return fetched, np.zeros(fetched.shape, dtype=bool)
        cpu = np.maximum(gpu_cached, self.cpu_s(t, missed)) - (
            np.asarray(expert_gpu_s) + np.asarray(shared_gpu_s)
        )
        on_cpu = cpu < fetched
        return np.where(on_cpu, cpu, fetched), on_cpu

    def cpu_s(self, tokens: np.ndarray, missed: np.ndarray) -> np.ndarray:
        """Host CPU time of one layer's missed routings (roofline on the node spec's CPU
        FLOP/s and DRAM bandwidth) plus the hidden states' round trip over the link."""
        routings = tokens * self.top_k * (1.0 - self.hit_rate) / self.ep
        flops = 2.0 * self.expert_params * routings
        host_bytes = missed * self.expert_bytes + 2.0 * routings * self.hidden_bytes
        cpu = np.maximum(flops / self.cpu_flops_per_s, host_bytes / self.host_bw_bytes_per_s)
        cpu = cpu + 2.0 * tokens * self.hidden_bytes / self.link_bytes_per_s
        return np.asarray(np.where(missed > 0, cpu, 0.0))


def _hit_rate_and_q(
    spec: ExpertOffloadSpec, *, num_experts: int, top_k: int, cached: int
) -> tuple[float, np.ndarray]:
    """The cache's hit rate and the per-token probabilities of the uncached experts."""
    q = routing_probabilities(num_experts=num_experts, top_k=top_k, skew=spec.zipf_skew)
    if spec.hit_rate is None:
        return float(q[:cached].sum() / top_k), q[cached:]
    rest = num_experts - cached
    each = (1.0 - spec.hit_rate) * top_k / rest if rest else 0.0
    if each > 1.0:
        raise SpecError(
            f"hit rate {spec.hit_rate} leaves each of the {rest} uncached experts more than "
            "one pick per token; raise hit_rate or lower cache_fraction",
            field="expert_offload.hit_rate",
        )
    return spec.hit_rate, np.full(rest, each)


def _expert_bytes_per_param(model: ModelSpec, prec: Precision) -> float:
    """Bytes per weight of a routed expert: its gate, up and down projections' formats,
    averaged over the MoE layers (`Precision.gemm_weights`)."""
    moe = model.moe
    assert moe is not None
    parts: dict[LinearName, float] = (
        {"gate": 1 / 3, "up": 1 / 3, "down": 1 / 3}
        if moe.expert.gated
        else {"up": 0.5, "down": 0.5}
    )
    return prec.gemm_weights(parts, (model.num_dense_layers, model.num_layers))[0]


def build_expert_cache(
    model: ModelSpec,
    hw: HardwareSpec,
    layout: Parallelism,
    prec: Precision,
    spec: ExpertOffloadSpec,
    *,
    link_bytes_per_s: float,
) -> ExpertCache:
    """The expert cache of one device of `layout`; SpecError for a dense model."""
    moe = model.moe
    if moe is None:
        raise SpecError(f"{model.id or model.name} has no experts", field="expert_offload")
    if layout.ep > layout.tp:
        raise SpecError(
            "expert offload with DP attention (wide expert parallelism) is not modelled",
            field="expert_offload",
        )
    expert_tp = layout.tp // layout.ep  # as the MoE operators shard experts
    per_device = moe.num_experts // layout.ep
    cached = round(spec.cache_fraction * per_device) * layout.ep
    hit_rate, uncached_q = _hit_rate_and_q(
        spec, num_experts=moe.num_experts, top_k=moe.top_k, cached=cached
    )
    params = moe.expert.params(model.hidden_size) / expert_tp
    return ExpertCache(
        num_experts=moe.num_experts,
        top_k=moe.top_k,
        cached=cached,
        hit_rate=hit_rate,
        uncached_q=uncached_q,
        ep=layout.ep,
        expert_bytes=params * _expert_bytes_per_param(model, prec),
        expert_params=params,
        hidden_bytes=model.hidden_size * DTYPE_BYTES[prec.activations],
        num_layers=model.num_moe_layers,
        link_bytes_per_s=link_bytes_per_s,
        cpu_flops_per_s=hw.host.cpu_flops_per_s,
        host_bw_bytes_per_s=hw.host.memory_bw_bytes_per_s,
        cpu_compute=spec.cpu_compute,
    )
