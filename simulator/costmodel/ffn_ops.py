"""The feed-forward ops of a step on one device: a dense (gated) MLP, and a MoE layer (router,
top-k, the routing bookkeeping around the experts, routed experts on the busiest
expert-parallel rank, shared experts, and wide EP's all-to-alls).
`costmodel.ops.step_ops` puts them in the step."""

from __future__ import annotations

import numpy as np

from simulator.costmodel.batch import BatchShape, Num
from simulator.costmodel.elementwise_kernels import gated_act
from simulator.costmodel.op import Op, ScalesWith, collective, elementwise, gemm, safe_div
from simulator.specs.deployment import Parallelism, Precision
from simulator.specs.model import DTYPE_BYTES, MLP, ModelSpec
from simulator.specs.weights import LinearName


def mlp_ops(
    prefix: str,
    mlp: MLP,
    *,
    h: int,
    shards: int,
    tokens: Num,
    count: float,
    prec: Precision,
    layers: tuple[int, int] = (0, 0),
    groups: Num = 1.0,
    scales_with: ScalesWith = "tokens",
    fused_moe: tuple[int, int] | None = None,
    moe_tokens: Num = 0.0,
) -> list[Op]:
    """An MLP on `tokens` tokens, its intermediate dimension split over `shards` devices: the
    up projection (gate and up fused when gated), the activation and the down projection;
    `groups` independent MLPs fused in each launch (a MoE layer's experts, whose GEMMs run in
    the fused MoE kernel where `fused_moe` gives its shape: local experts, intermediate size
    per shard; `moe_tokens`, the tokens of its call). `layers`: the layers [start, stop) it stands
    for (their weight formats)."""
    inter = mlp.intermediate_size / shards
    up_n = (2 if mlp.gated else 1) * inter
    a = DTYPE_BYTES[prec.activations]
    g = np.asarray(groups, dtype=float)
    up: dict[LinearName, float] = {"gate": 0.5, "up": 0.5} if mlp.gated else {"up": 1.0}
    return [
        gemm(
            f"{prefix}up_proj",
            m=tokens,
            n=up_n,
            k=h,
            count=count,
            prec=prec,
            linears=up,
            layers=layers,
            groups=groups,
            scales_with=scales_with,
            fused_moe=fused_moe,
            moe_tokens=moe_tokens,
        ),
        gated_act(
            f"{prefix}act", g * tokens, inter, act_bytes=a, count=count, scales_with=scales_with
        )
        if mlp.gated
        else elementwise(
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
            linears={"down": 1.0},
            layers=layers,
            groups=groups,
            scales_with=scales_with,
            fused_moe=fused_moe,
            moe_tokens=moe_tokens,
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
    model: ModelSpec,
    layout: Parallelism,
    prec: Precision,
    *,
    group_tokens: Num,
    hit: Num | None = None,
) -> list[Op]:
    """The routed experts' FFNs on the busiest device of the EP group, for `group_tokens`
    tokens routed by the whole group (the TP group's tokens; under DP attention, every
    attention rank's). Experts are split over `ep` ranks, each expert's FFN over the devices
    left over (tp / ep, or tp * dp / ep with DP attention). The busiest rank gets
    `expert_load_imbalance` times the mean share of the group's top_k * tokens assignments;
    they are spread over the experts of that rank the group's tokens hit: `hit` of the
    group's (default: uniform routing's expectation, `experts_hit`)."""
    moe = model.moe
    assert moe is not None
    wide = layout.ep > layout.tp
    expert_tp = (layout.tp * (layout.dp if wide else 1)) // layout.ep
    imbalance = layout.expert_load_imbalance if layout.ep > 1 else 1.0
    if hit is None:
        hit = experts_hit(moe.num_experts, moe.top_k, group_tokens)
    hit = np.asarray(hit, dtype=float) / layout.ep
    rank_tokens = imbalance * np.asarray(group_tokens, dtype=float) * moe.top_k / layout.ep
    return mlp_ops(
        "expert_",
        moe.expert,
        h=model.hidden_size,
        shards=expert_tp,
        tokens=safe_div(rank_tokens, hit),
        count=float(model.num_moe_layers),
        prec=prec,
        layers=(model.num_dense_layers, model.num_layers),
        groups=hit,
        scales_with="ep_group" if wide else "tokens",
        fused_moe=(moe.num_experts // layout.ep, moe.expert.intermediate_size // expert_tp),
        moe_tokens=group_tokens,
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


def routing_ops(model: ModelSpec, prec: Precision, *, tokens: Num) -> list[Op]:
    """The bookkeeping every engine's MoE layer runs around the expert GEMMs, for this device's
    `tokens`: sorting the token -> expert assignments into per-expert blocks (vLLM and SGLang
    `moe_align_block_size`; TensorRT-LLM builds its expert maps and first-token offsets), a
    small kernel priced by its int32 ids; and summing each token's top_k weighted expert
    outputs into one hidden vector (vLLM `ops.moe_sum` after the Triton fused_moe's second
    GEMM writes [tokens, top_k, hidden]; TensorRT-LLM's `finalizeMoeRoutingKernel`): top_k
    rows read and one written per token, priced by its bytes. Not modelled: TensorRT-LLM's
    (and FlashInfer's CUTLASS MoE's) permute of the inputs into expert order
    (`expandInputRowsKernel`, which also quantises them), which the Triton kernel does inside
    its GEMM by reading the rows through the sorted ids; several kernels where an engine sorts
    in more than one."""
    moe = model.moe
    assert moe is not None
    count, a = float(model.num_moe_layers), DTYPE_BYTES[prec.activations]
    t = np.asarray(tokens, dtype=float)
    return [
        elementwise("moe_align", bytes_=t * moe.top_k * 4.0 * 2, count=count),
        elementwise("moe_sum", bytes_=t * (moe.top_k + 1) * model.hidden_size * a, count=count),
    ]


def moe_ops(
    model: ModelSpec,
    layout: Parallelism,
    prec: Precision,
    b: BatchShape,
    *,
    experts_hit_by: Num | None = None,
) -> list[Op]:
    """A MoE layer on one device: router, top-k, routed experts, shared experts, and with DP
    attention (ep > tp: experts spread over tp * dp devices) the all-to-alls. Here every
    attention rank of the group holds this step's batch; `serving.dp_group` prices ranks with
    different batches. `experts_hit_by`: the distinct experts the group's tokens select (a
    benchmark's routing; default: uniform routing's expectation)."""
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
        *routing_ops(model, prec, tokens=t),
        *expert_ffn_ops(model, layout, prec, group_tokens=group_tokens, hit=experts_hit_by),
    ]
    if moe.shared_expert is not None:
        shared = MLP(
            intermediate_size=moe.shared_expert.intermediate_size * moe.num_shared_experts,
            gated=moe.shared_expert.gated,
        )
        ops += mlp_ops(
            "shared_",
            shared,
            h=h,
            shards=layout.tp,
            tokens=t,
            count=count,
            prec=prec,
            layers=(model.num_dense_layers, model.num_layers),
        )
    if wide_ep:
        # Each device sends its 1/tp share of the rank's tokens, not all of them: they are
        # replicated over the rank's tp devices, and sending every copy would move each tp times.
        moved = dispatch_tokens(layout, group_tokens=group_tokens, sender_tokens=t)
        ops += dispatch_ops(model, layout, prec, tokens=moved)
    return ops
