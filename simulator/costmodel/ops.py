"""The declarative operator list of one engine step on one device.

`step_ops(model, layout, precision, batch)` returns every kernel of the step with its FLOPs and
DRAM bytes per instance and a repeat count (layers). No device or time appears here: that is
`roofline.evaluate`'s job. Sizes are per device after tensor/expert parallel sharding; the
counts walk every layer of the model once (all pipeline stages in sequence), so the sum is the
latency of one step through the pipeline.

Not modelled: bias adds and residual adds as separate kernels (fused into the GEMM/norm
epilogues, as vLLM does), rotary/ALiBi arithmetic beyond its memory traffic, kernel fusion
across operators, the KV-cache block-table indirection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from simulator.costmodel.batch import BatchShape, Num
from simulator.specs.deployment import Parallelism, Precision
from simulator.specs.model import DTYPE_BYTES, MLP, GQAttention, MLAttention, ModelSpec

OpKind = Literal["gemm", "attention_prefill", "attention_decode", "memory", "collective"]
Collective = Literal["", "all_reduce", "all_gather", "all_to_all", "send_recv"]
# What an op's cost depends on: the step's token count alone, the number of sequences sampled
# alone, or the batch's full shape (attention). The serving simulator tabulates the first two.
# `ep_group`: the tokens of the whole expert-parallel group under DP attention (the expert FFNs
# and the all-to-alls of wide EP), which `serving.dp_group` prices once for all its ranks.
ScalesWith = Literal["tokens", "sampled", "batch", "ep_group"]

INT4_GROUP_SIZE = 128  # AWQ/GPTQ: one fp16 scale per 128 weights


def weight_bytes_per_param(dtype: str) -> float:
    """Storage bytes per weight including quantisation scales."""
    if dtype == "int4":
        return 0.5 + 2.0 / INT4_GROUP_SIZE
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel, `count` times per step. flops/bytes are per instance; for GEMMs m, n, k are
    the shape and `groups` the number of independent GEMMs fused in one launch (MoE experts,
    per-head batched GEMMs). For attention, `seq_len` is the mean query (prefill) or KV
    (decode) length, `batch` the sequences, `heads` / `kv_heads` the query and KV heads per
    device, `kv_dtype` the KV cache's dtype and `kv_bytes` the part of `bytes` that reads the
    KV cache. `pre_bytes` is the traffic of a memory-bound kernel that must run first
    (activation quantisation of a W8A8 GEMM). Collectives move `msg_bytes` among
    `group_size` devices. `scales_with` says which batch quantities the cost depends on."""

    name: str
    kind: OpKind
    count: float
    flops: Num
    bytes: Num
    dtype: str = "bf16"
    m: Num = 0.0
    n: Num = 0.0
    k: Num = 0.0
    groups: Num = 1.0
    seq_len: Num = 0.0
    batch: Num = 0.0
    heads: float = 0.0
    kv_heads: float = 0.0
    kv_dtype: str = ""
    kv_bytes: Num = 0.0
    pre_bytes: Num = 0.0
    collective: Collective = ""
    group_size: int = 1
    msg_bytes: Num = 0.0
    scale_out: bool = False
    scales_with: ScalesWith = "tokens"


def _safe_div(a: Num, b: Num) -> Num:
    return np.divide(a, b, out=np.zeros_like(np.asarray(a, dtype=float)), where=np.asarray(b) > 0)


def gemm(
    name: str,
    *,
    m: Num,
    n: Num,
    k: Num,
    count: float,
    prec: Precision,
    weight_dtype: str | None = None,
    groups: Num = 1.0,
    scales_with: ScalesWith = "tokens",
) -> Op:
    """A (groups x) m-by-k times k-by-n GEMM whose k-by-n operand is a stored weight. A W8A8
    GEMM (8-bit compute, 16-bit activations) reads activations quantised by a kernel before it
    (`pre_bytes`: read 16-bit, write 8-bit)."""
    a = DTYPE_BYTES[prec.activations]
    wb = weight_bytes_per_param(weight_dtype or prec.weights)
    dtype = prec.compute if (weight_dtype or prec.weights) == prec.weights else prec.activations
    quantised = dtype in ("fp8", "int8") and a > 1
    a_in = DTYPE_BYTES[dtype] if quantised else a
    g = np.asarray(groups, dtype=float)
    flops = 2.0 * m * n * k * g
    bytes_ = g * (n * k * wb + m * k * a_in + m * n * a)
    pre = g * m * k * (a + a_in) if quantised else 0.0
    active = np.asarray(m, dtype=float) > 0
    return Op(
        name,
        "gemm",
        count,
        np.where(active, flops, 0.0),
        np.where(active, bytes_, 0.0),
        dtype=dtype,
        m=m,
        n=n,
        k=k,
        groups=g,
        pre_bytes=np.where(active, pre, 0.0),
        scales_with=scales_with,
    )


def elementwise(name: str, *, bytes_: Num, count: float, scales_with: ScalesWith = "tokens") -> Op:
    return Op(name, "memory", count, 0.0, bytes_, scales_with=scales_with)


def collective(
    name: str,
    kind: Collective,
    *,
    msg_bytes: Num,
    group: int,
    count: float,
    scale_out: bool = False,
    scales_with: ScalesWith = "tokens",
) -> Op:
    return Op(
        name,
        "collective",
        count,
        0.0,
        0.0,
        collective=kind,
        group_size=group,
        msg_bytes=msg_bytes,
        scale_out=scale_out,
        scales_with=scales_with,
    )


# -- attention ----------------------------------------------------------------------------------
def attention_ops(
    *, heads: int, kv_heads: int, head_dim: int, prec: Precision, batch: BatchShape, count: float
) -> list[Op]:
    """Flash-style attention of a mixed batch, per device: one varlen prefill kernel over all
    chunks (causal, each chunk reading its cached prefix) and one paged decode kernel."""
    a, kvb = DTYPE_BYTES[prec.activations], DTYPE_BYTES[prec.kv_cache]
    kv_elems = 2 * kv_heads * head_dim  # K and V per token
    b = batch
    return [
        Op(
            "attention_prefill",
            "attention_prefill",
            count,
            flops=4.0 * heads * head_dim * b.prefill_pairs,
            bytes=b.prefill_tokens * (2 * heads * head_dim * a + kv_elems * kvb)
            + b.prefill_kv_tokens * kv_elems * kvb,
            dtype=prec.activations,
            seq_len=_safe_div(b.prefill_tokens, b.prefill_seqs),
            batch=b.prefill_seqs,
            heads=heads,
            kv_heads=kv_heads,
            kv_dtype=prec.kv_cache,
            scales_with="batch",
        ),
        Op(
            "attention_decode",
            "attention_decode",
            count,
            flops=4.0 * heads * head_dim * b.decode_kv_tokens,
            bytes=b.decode_kv_tokens * kv_elems * kvb
            + b.decode_seqs * (2 * heads * head_dim * a + kv_elems * kvb),
            dtype=prec.activations,
            seq_len=_safe_div(b.decode_kv_tokens, b.decode_seqs),
            batch=b.decode_seqs,
            heads=heads,
            kv_heads=kv_heads,
            kv_dtype=prec.kv_cache,
            kv_bytes=b.decode_kv_tokens * kv_elems * kvb,
            scales_with="batch",
        ),
    ]


def _gqa_ops(
    attn: GQAttention, model: ModelSpec, tp: int, prec: Precision, b: BatchShape
) -> list[Op]:
    h, d, n_layers = model.hidden_size, attn.head_dim, model.num_layers
    heads = attn.num_heads // tp
    kv_heads = max(1, attn.num_kv_heads // tp)  # replicated when fewer KV heads than ranks
    a = DTYPE_BYTES[prec.activations]
    t = b.num_tokens
    return [
        gemm("qkv_proj", m=t, n=(heads + 2 * kv_heads) * d, k=h, count=n_layers, prec=prec),
        elementwise("rotary", bytes_=t * (heads + kv_heads) * d * a * 2, count=n_layers),
        *attention_ops(
            heads=heads, kv_heads=kv_heads, head_dim=d, prec=prec, batch=b, count=n_layers
        ),
        gemm("o_proj", m=t, n=h, k=heads * d, count=n_layers, prec=prec),
    ]


def _mla_ops(
    attn: MLAttention, model: ModelSpec, tp: int, prec: Precision, b: BatchShape
) -> list[Op]:
    """DeepSeek MLA as vLLM runs it: prefill up-projects the latent to per-head K/V (MHA with
    qk dim nope+rope, v dim v_head_dim); decode absorbs W_UK/W_UV into the query/output and
    attends in the latent space (MQA over kv_lora_rank + rope dims)."""
    h, n_layers = model.hidden_size, model.num_layers
    heads = attn.num_heads // tp
    qk, v, lat = attn.head_dim, attn.v_head_dim, attn.kv_elems_per_token
    a, kvb = DTYPE_BYTES[prec.activations], DTYPE_BYTES[prec.kv_cache]
    t = b.num_tokens
    ops: list[Op] = []
    if attn.q_lora_rank:
        ops.append(gemm("q_a_proj", m=t, n=attn.q_lora_rank, k=h, count=n_layers, prec=prec))
        ops.append(
            gemm("q_b_proj", m=t, n=heads * qk, k=attn.q_lora_rank, count=n_layers, prec=prec)
        )
    else:
        ops.append(gemm("q_proj", m=t, n=heads * qk, k=h, count=n_layers, prec=prec))
    ops.append(gemm("kv_a_proj", m=t, n=lat, k=h, count=n_layers, prec=prec))
    nope = attn.qk_nope_head_dim
    ops += [
        gemm(
            "kv_b_proj",
            m=b.prefill_kv_tokens,
            n=heads * (nope + v),
            k=attn.kv_lora_rank,
            count=n_layers,
            prec=prec,
            scales_with="batch",
        ),
        Op(
            "attention_prefill",
            "attention_prefill",
            n_layers,
            flops=2.0 * heads * (qk + v) * b.prefill_pairs,
            bytes=b.prefill_tokens * (heads * (qk + v) * a + lat * kvb)
            + b.prefill_kv_tokens * heads * (qk + v) * a,
            dtype=prec.activations,
            seq_len=_safe_div(b.prefill_tokens, b.prefill_seqs),
            batch=b.prefill_seqs,
            heads=heads,
            kv_heads=heads,  # K/V up-projected per head: MHA
            kv_dtype=prec.kv_cache,
            scales_with="batch",
        ),
        gemm(
            "w_uk_absorb",
            m=b.decode_seqs,
            n=attn.kv_lora_rank,
            k=nope,
            groups=heads,
            count=n_layers,
            prec=prec,
            scales_with="batch",
        ),
        Op(
            "attention_decode",
            "attention_decode",
            n_layers,
            flops=2.0 * heads * (lat + attn.kv_lora_rank) * b.decode_kv_tokens,
            bytes=b.decode_kv_tokens * lat * kvb
            + b.decode_seqs * heads * (lat + attn.kv_lora_rank) * a,
            dtype=prec.activations,
            seq_len=_safe_div(b.decode_kv_tokens, b.decode_seqs),
            batch=b.decode_seqs,
            heads=heads,
            kv_bytes=b.decode_kv_tokens * lat * kvb,
            kv_heads=1.0,  # one latent shared by all query heads
            kv_dtype=prec.kv_cache,
            scales_with="batch",
        ),
        gemm(
            "w_uv_absorb",
            m=b.decode_seqs,
            n=v,
            k=attn.kv_lora_rank,
            groups=heads,
            count=n_layers,
            prec=prec,
            scales_with="batch",
        ),
        gemm("o_proj", m=t, n=h, k=heads * v, count=n_layers, prec=prec),
    ]
    return ops


# -- feed-forward ---------------------------------------------------------------------------------
def _mlp_ops(
    prefix: str,
    mlp: MLP,
    *,
    h: int,
    shards: int,
    tokens: Num,
    count: float,
    prec: Precision,
    groups: Num = 1.0,
    scales_with: ScalesWith = "tokens",
) -> list[Op]:
    inter = mlp.intermediate_size / shards
    up_n = (2 if mlp.gated else 1) * inter
    a = DTYPE_BYTES[prec.activations]
    g = np.asarray(groups, dtype=float)
    return [
        gemm(
            f"{prefix}up_proj",
            m=tokens,
            n=up_n,
            k=h,
            count=count,
            prec=prec,
            groups=groups,
            scales_with=scales_with,
        ),
        elementwise(
            f"{prefix}act",
            bytes_=g * tokens * (up_n + inter) * a,
            count=count,
            scales_with=scales_with,
        ),
        gemm(
            f"{prefix}down_proj",
            m=tokens,
            n=h,
            k=inter,
            count=count,
            prec=prec,
            groups=groups,
            scales_with=scales_with,
        ),
    ]


def experts_hit(num_experts: int, top_k: int, tokens: Num) -> Num:
    """Expected distinct experts selected by `tokens` tokens under uniform top-k routing."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** np.asarray(tokens, dtype=float))


def expert_imbalance_from_skew(*, num_experts: int, ep: int, skew: float) -> float:
    """Max/mean tokens per EP rank when expert popularity follows Zipf's law with exponent
    `skew` (the j-th most popular expert draws a share p_j = j^-skew / sum_i i^-skew of the
    routed tokens) and the experts sit on the `ep` ranks round-robin in popularity order (rank r
    holds popularity ranks r+1, r+1+ep, ...: the hottest experts on distinct ranks, as a static
    balancer such as DeepSeek's EPLB places them before replicating any). Rank 0 is the
    busiest: imbalance = ep * sum_{m=0}^{E/ep-1} p_{1+m*ep}. Skew 0 gives 1 (balanced).
    Not modelled: redundant expert copies, popularity that drifts over time."""
    if skew < 0:
        raise ValueError(f"expert skew must be at least 0, got {skew}")
    p = np.arange(1, num_experts + 1, dtype=float) ** -skew
    p /= p.sum()
    return float(ep * p[::ep].sum())


def expert_ffn_ops(
    model: ModelSpec, layout: Parallelism, prec: Precision, *, group_tokens: Num
) -> list[Op]:
    """The routed experts' FFNs on the busiest device of the EP group, for `group_tokens`
    tokens routed by the whole group (the TP group's tokens; under DP attention, every
    attention rank's). Experts are split over `ep` ranks, each expert's FFN over the devices
    left over (tp / ep, or tp * dp / ep with DP attention). The busiest rank gets
    `expert_load_imbalance` times the mean share of the group's top_k * tokens assignments;
    they are spread over the experts of that rank the group's tokens hit (uniform routing)."""
    moe = model.moe
    assert moe is not None
    wide = layout.ep > layout.tp
    expert_tp = (layout.tp * (layout.dp if wide else 1)) // layout.ep
    imbalance = layout.expert_load_imbalance if layout.ep > 1 else 1.0
    hit = experts_hit(moe.num_experts, moe.top_k, group_tokens) / layout.ep
    rank_tokens = imbalance * np.asarray(group_tokens, dtype=float) * moe.top_k / layout.ep
    return _mlp_ops(
        "expert_",
        moe.expert,
        h=model.hidden_size,
        shards=expert_tp,
        tokens=_safe_div(rank_tokens, hit),
        count=float(model.num_moe_layers),
        prec=prec,
        groups=hit,
        scales_with="ep_group" if wide else "tokens",
    )


def dispatch_tokens(layout: Parallelism, *, group_tokens: Num, sender_tokens: Num) -> Num:
    """Token copies (each top_k of them a hidden vector) the busiest device of a wide-EP group
    moves in one all-to-all, per top-k slot: the larger of what it sends and what it receives.
    Each attention rank's tokens are replicated over its tp devices, so each device sends its
    1/tp share of them (`sender_tokens`: the largest attention rank's tokens); it receives the
    tokens routed to its experts, `expert_load_imbalance` times the mean group_tokens / ep."""
    send = np.asarray(sender_tokens, dtype=float) / layout.tp
    recv = layout.expert_load_imbalance * np.asarray(group_tokens, dtype=float) / layout.ep
    return np.maximum(send, recv)


def dispatch_ops(
    model: ModelSpec, layout: Parallelism, prec: Precision, *, tokens: Num
) -> list[Op]:
    """Wide EP's all-to-all dispatch (hidden states to the experts' ranks) and combine (expert
    outputs back) per MoE layer, each moving `tokens` x top_k x hidden x activation bytes per
    device (`dispatch_tokens`), (ep - 1) / ep of it over the wire. Not modelled: sending a token
    once per destination rank rather than once per expert (DeepEP does), fp8 dispatch."""
    moe = model.moe
    assert moe is not None
    msg = np.asarray(tokens, dtype=float) * moe.top_k * model.hidden_size
    msg = msg * DTYPE_BYTES[prec.activations]
    return [
        collective(
            f"moe_{stage}",
            "all_to_all",
            msg_bytes=msg,
            group=layout.ep,
            count=float(model.num_moe_layers),
            scales_with="ep_group",
        )
        for stage in ("dispatch", "combine")
    ]


def _moe_ops(model: ModelSpec, layout: Parallelism, prec: Precision, b: BatchShape) -> list[Op]:
    """A MoE layer on one device: router, top-k, routed experts, shared experts, and with DP
    attention (ep > tp: experts spread over tp * dp devices) the all-to-alls. Here every
    attention rank of the group holds this step's batch; `serving.dp_group` prices ranks with
    different batches."""
    moe = model.moe
    assert moe is not None
    h, count, t = model.hidden_size, float(model.num_moe_layers), b.num_tokens
    wide_ep = layout.ep > layout.tp
    group_tokens = t * layout.dp if wide_ep else t
    ops = [
        gemm(
            "router",
            m=t,
            n=moe.num_experts,
            k=h,
            count=count,
            prec=prec,
            weight_dtype=prec.activations,
        ),
        elementwise("topk_softmax", bytes_=t * moe.num_experts * 4.0 * 2, count=count),
        *expert_ffn_ops(model, layout, prec, group_tokens=group_tokens),
    ]
    if moe.shared_expert is not None:
        shared = MLP(
            intermediate_size=moe.shared_expert.intermediate_size * moe.num_shared_experts,
            gated=moe.shared_expert.gated,
        )
        ops += _mlp_ops("shared_", shared, h=h, shards=layout.tp, tokens=t, count=count, prec=prec)
    if wide_ep:
        # Each device sends its 1/tp share of the rank's tokens, not all of them: they are
        # replicated over the rank's tp devices, and sending every copy would move each tp times.
        moved = dispatch_tokens(layout, group_tokens=group_tokens, sender_tokens=t)
        ops += dispatch_ops(model, layout, prec, tokens=moved)
    return ops


# -- the step -----------------------------------------------------------------------------------
def stage_boundaries(layout: Parallelism, *, gpus_per_node: int) -> list[bool]:
    """For each pipeline boundary (after stage 0 .. pp - 2): does it cross a node? Stages of
    `tp` devices fill nodes of `gpus_per_node` in order."""
    return [(i * layout.tp) % gpus_per_node == 0 for i in range(1, layout.pp)]


def step_ops(
    model: ModelSpec,
    layout: Parallelism,
    prec: Precision,
    batch: BatchShape,
    *,
    gpus_per_node: int = 8,
) -> list[Op]:
    """Every kernel of one step on one device of the replica, with repeat counts. Pipeline
    stages of `tp` devices fill nodes of `gpus_per_node` in order; a stage boundary that
    crosses a node boundary sends over the scale-out network."""
    h, tp, n_layers = model.hidden_size, layout.tp, float(model.num_layers)
    a = DTYPE_BYTES[prec.activations]
    t = batch.num_tokens
    norm = elementwise("norm", bytes_=t * h * a * 3, count=2 * n_layers)  # fused add + norm
    attn = model.attention
    attn_ops = (
        _gqa_ops(attn, model, tp, prec, batch)
        if isinstance(attn, GQAttention)
        else _mla_ops(attn, model, tp, prec, batch)
    )
    ops = [elementwise("embedding", bytes_=t * h * a * 2, count=1), norm, *attn_ops]
    if model.num_dense_layers:
        ops += _mlp_ops(
            "", model.mlp, h=h, shards=tp, tokens=t, count=float(model.num_dense_layers), prec=prec
        )
    if model.moe is not None:
        ops += _moe_ops(model, layout, prec, batch)
    ops += [
        elementwise("final_norm", bytes_=t * h * a * 2, count=1),
        gemm(
            "lm_head",
            m=batch.sampled,
            n=model.vocab_size / tp,
            k=h,
            count=1,
            prec=prec,
            weight_dtype=prec.activations,
            scales_with="sampled",
        ),
        elementwise(
            "sampler",
            bytes_=batch.sampled * model.vocab_size * 4.0 * 2,
            count=1,
            scales_with="sampled",
        ),
    ]
    if tp > 1:
        ops += [
            collective(
                "tp_all_reduce", "all_reduce", msg_bytes=t * h * a, group=tp, count=2 * n_layers + 1
            ),  # attention out, MLP out, vocab-parallel embedding
            collective(
                "logits_all_gather",
                "all_gather",
                msg_bytes=batch.sampled * model.vocab_size * a,
                group=tp,
                count=1,
                scales_with="sampled",
            ),
        ]
    if layout.pp > 1:
        crossing = sum(stage_boundaries(layout, gpus_per_node=gpus_per_node))
        for name, n, out in (
            ("pp_send_recv", layout.pp - 1 - crossing, False),
            ("pp_send_recv_internode", crossing, True),
        ):
            ops.append(
                collective(name, "send_recv", msg_bytes=t * h * a, group=2, count=n, scale_out=out)
            )
    return [op for op in ops if op.count > 0]
