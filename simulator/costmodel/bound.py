"""The hardware-limit bound: the throughput a deployment could reach on a workload if every
step ran at its tightest resource's peak, with nothing else in the way.

After NanoFlow (Zhu et al., "NanoFlow: Towards Optimal Large Language Model Serving
Throughput", arXiv 2408.12757, section 3): a serving step's time is at least the largest of
its compute time (FLOPs over the peak), its memory time (weights read once per step plus the
decoding tokens' KV reads, over the DRAM bandwidth) and its network time (the tensor-parallel
collectives over the link bandwidth), and the batch is as large as the KV cache's room allows.
The optimal throughput is the tokens of the steady-state step over that time (NanoFlow's
equations for T_Compute, T_Mem, T_Net and the optimal throughput, its Eq. 5).

The bound reads only the datasheet peaks of the hardware spec (`peak_flops_per_s`,
`memory.bandwidth_bytes_per_s`, the interconnect's link bandwidth), never the efficiency curves
the step times use, and it counts only work no step can skip, so every simulated throughput of
the same setup is at most the bound: `bound_share` (simulated / bound) is in (0, 1].

Counted: 2 x (active parameters outside the embeddings) FLOPs per processed token (prompt and
decode), the LM head per output token and attention's score and value products (GQA/MHA:
4 x heads x head_dim per attended pair, causal prompts at P^2 / 2 pairs); MLA's attention
FLOPs are left out (a lower count keeps the bound an upper bound). Memory: the weights
once per decode step (MoE: the experts that step's tokens hit under uniform routing,
`ffn_ops.experts_hit`), and each decode token's KV at the mean context P + (O - 1) / 2.
Network: two all-reduces of the hidden state per layer and token within a stage.
Not counted: prefill steps' weight reads, activations, the sampler, CPU overheads,
pipeline bubbles. The bound assumes one token per sequence per decode step (no speculative
decoding) and that every prompt token is computed (no prefix-cache hits); a run that skips
work those ways can exceed it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from simulator.costmodel.deployment import Deployment
from simulator.costmodel.ffn_ops import experts_hit
from simulator.costmodel.roofline import collective_bandwidth
from simulator.specs.model import DTYPE_BYTES, GQAttention

Resource = Literal["compute", "memory", "network"]


@dataclass(frozen=True, slots=True)
class HardwareBound:
    """The bound of one replica: `tokens_per_s` (prompt and output tokens) and
    `output_tokens_per_s`, the resource that binds, the decode batch KV room allows
    (`batch`), and the seconds each resource of one replica needs per request at that batch
    (`scaled` and `plus` add replicas' throughputs and keep the larger part's other fields)."""

    tokens_per_s: float
    output_tokens_per_s: float
    resource: Resource
    batch: int
    compute_s: float
    memory_s: float
    network_s: float

    def scaled(self, replicas: int) -> HardwareBound:
        """The bound of `replicas` independent replicas (throughputs times `replicas`)."""
        return dataclasses.replace(
            self,
            tokens_per_s=self.tokens_per_s * replicas,
            output_tokens_per_s=self.output_tokens_per_s * replicas,
        )

    def plus(self, other: HardwareBound) -> HardwareBound:
        """The bound of two sets of replicas serving side by side: throughputs add; the
        resource and per-request times are those of the faster set."""
        big = self if self.tokens_per_s >= other.tokens_per_s else other
        return dataclasses.replace(
            big,
            tokens_per_s=self.tokens_per_s + other.tokens_per_s,
            output_tokens_per_s=self.output_tokens_per_s + other.output_tokens_per_s,
        )


def _peak_flops(dep: Deployment) -> float:
    """The matrix units' dense peak at the deployment's compute dtype (16-bit where the device
    has no unit for it, as the roofline falls back)."""
    hw = dep.hardware
    peak = hw.peak_flops(dep.precision.compute)
    return peak if peak > 0 else max(hw.peak_flops("bf16"), hw.peak_flops("fp16"))


def _weight_read_fraction(dep: Deployment, batch: int) -> float:
    """Share of the weights a decode step of `batch` tokens must read: all for a dense model;
    for MoE the experts its tokens hit (expected, uniform top-k routing)."""
    model, moe = dep.model, dep.model.moe
    if moe is None:
        return 1.0
    e, k = moe.num_experts, moe.top_k
    idle = model.num_params - model.num_active_params  # (E - k) experts' parameters
    experts = idle * e / (e - k) if e > k else 0.0
    share = experts / model.num_params
    hit = float(experts_hit(e, k, batch)) / e
    return 1.0 - share + share * hit


def hardware_bound(
    dep: Deployment,
    *,
    prompt_len: float,
    output_len: float,
    weight_bytes: float | None = None,
    kv_capacity_tokens: int | None = None,
) -> HardwareBound:
    """The bound of one replica of `dep` serving requests of `prompt_len` prompt and
    `output_len` output tokens (means). `weight_bytes`: the weights of one device (its memory
    plan's, offloaded ones included); `kv_capacity_tokens`: the tokens one replica's KV cache
    holds (memory plan); either None: from the engine's default memory plan (`dep.memory()`).
    Raises ValueError for lengths below 1."""
    if prompt_len < 1 or output_len < 1:
        raise ValueError(f"lengths must be at least 1, got {prompt_len} and {output_len}")
    if weight_bytes is None or kv_capacity_tokens is None:
        plan = dep.memory()
        weight_bytes = plan.weights_bytes + plan.offloaded_bytes
        kv_capacity_tokens = plan.kv_capacity_tokens
    model, hw, layout, prec = dep.model, dep.hardware, dep.layout, dep.precision
    gpus = layout.tp * layout.pp * layout.cp
    p, o = float(prompt_len), float(output_len)
    decodes = o - 1.0  # the first output token comes from the prefill
    context = p + decodes / 2.0  # mean KV length a decoding token attends to
    batch = max(1, int(kv_capacity_tokens * layout.cp // max(1.0, p + o)))
    # compute: FLOPs of one request over the replica's peak
    body = model.num_active_params - model.embedding_params
    flops = 2.0 * body * (p + decodes) + 2.0 * model.vocab_size * model.hidden_size * o
    attn = model.attention
    if isinstance(attn, GQAttention):
        per_pair = 4.0 * attn.num_heads * attn.head_dim * model.num_layers
        flops += per_pair * (p * p / 2.0 + decodes * context)
    compute_s = flops / (gpus * _peak_flops(dep))
    # memory: the weights once per decode step (shared by the batch), then the KV reads
    weights = weight_bytes * gpus * _weight_read_fraction(dep, batch)
    kv = model.kv_bytes_per_token(prec.kv_cache) * decodes * context
    memory_s = (weights * decodes / batch + kv) / (gpus * hw.memory.bandwidth_bytes_per_s)
    # network: two all-reduces of the hidden state per layer and token, stages in parallel
    network_s = 0.0
    if layout.tp > 1:
        tp = layout.tp
        msg = model.hidden_size * DTYPE_BYTES[prec.activations]
        per_token = 2.0 * model.num_layers / layout.pp * (p + decodes)
        g = hw.interconnect.gpus_per_node
        if tp > g and tp % g == 0:  # hierarchical, as `roofline._hierarchical` runs it
            k = tp // g
            intra = 2.0 * (g - 1) / g * msg / collective_bandwidth(hw, g, scale_out=False)
            inter = 2.0 * (k - 1) / k * msg / g / hw.interconnect.scale_out_bw_bytes_per_s
            network_s = (intra + inter) * per_token / layout.cp
        else:
            wire = 2.0 * (tp - 1) / tp * msg * per_token
            network_s = wire / collective_bandwidth(hw, tp, scale_out=False) / layout.cp
    times: dict[Resource, float] = {
        "compute": compute_s,
        "memory": memory_s,
        "network": network_s,
    }
    resource = max(times, key=lambda r: times[r])
    per_request = times[resource]
    return HardwareBound(
        (p + o) / per_request,
        o / per_request,
        resource,
        batch,
        compute_s,
        memory_s,
        network_s,
    )
