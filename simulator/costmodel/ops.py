"""The declarative operator list of one engine step on one device.

`step_ops(model, layout, precision, batch)` returns every kernel of the step with its FLOPs and
DRAM bytes per instance and a repeat count (layers). No device or time appears here: that is
`roofline.evaluate`'s job. Sizes are per device after tensor/expert parallel sharding; the
counts walk every layer of the model once (all pipeline stages in sequence), so the sum is the
latency of one step through the pipeline.

The attention ops are here; the `Op` record and its constructors are in `costmodel.op`, the
dense MLP and MoE ops in `costmodel.ffn_ops` (all re-exported here).

Not modelled: bias adds and residual adds as separate kernels (fused into the GEMM/norm
epilogues, as vLLM does), rotary arithmetic beyond its memory traffic and launch (ALiBi is
inside the attention kernel), kernel fusion across operators, the KV-cache block-table
indirection.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from simulator.costmodel.batch import BatchShape, Num, windowed
from simulator.costmodel.elementwise_kernels import rms_norm, rotary
from simulator.costmodel.ffn_ops import (
    dispatch_ops,
    dispatch_tokens,
    expert_ffn_ops,
    expert_imbalance_from_skew,
    experts_hit,
    mlp_ops,
    moe_ops,
)
from simulator.costmodel.op import (
    INT4_GROUP_SIZE,
    Collective,
    Op,
    OpKind,
    ScalesWith,
    collective,
    elementwise,
    gemm,
    safe_div,
    weight_bytes_per_param,
)
from simulator.specs.deployment import Parallelism, Precision
from simulator.specs.engine import LogitsPass
from simulator.specs.model import (
    DTYPE_BYTES,
    KV_QUANT_FORMATS,
    CCAttention,
    GQAttention,
    MLAttention,
    ModelSpec,
    kv_bytes_per_elem,
    kv_residual_tokens,
)
from simulator.specs.weights import LinearName

__all__ = [
    "BATCH_PARTS",
    "INT4_GROUP_SIZE",
    "BatchPart",
    "Collective",
    "Op",
    "OpKind",
    "ScalesWith",
    "attention_ops",
    "batch_ops",
    "collective",
    "context_parallel_ops",
    "cp_rank_shape",
    "dispatch_ops",
    "dispatch_tokens",
    "elementwise",
    "expert_ffn_ops",
    "expert_imbalance_from_skew",
    "experts_hit",
    "gemm",
    "shadowkv_ops",
    "stage_boundaries",
    "step_ops",
    "swiftkv_ops",
    "weight_bytes_per_param",
]

BatchPart = Literal["prefill", "decode"]
BATCH_PARTS: tuple[BatchPart, ...] = ("prefill", "decode")


# -- attention ----------------------------------------------------------------------------------
def attention_ops(
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    prec: Precision,
    batch: BatchShape,
    count: float,
    parts: tuple[BatchPart, ...] = BATCH_PARTS,
) -> list[Op]:
    """Flash-style attention of a mixed batch, per device: one varlen prefill kernel over all
    chunks (causal, each chunk reading its cached prefix) and one paged decode kernel (those of
    `parts`: the prefill kernel reads only the batch's prefill fields, the decode kernel only
    its decode fields).

    A KV cache below 8 bits (`specs.model.KV_QUANT_FORMATS`) is dequantized inside the
    attention kernels, as KIVI's CUDA kernel fuses dequantization with the Q.K and P.V
    products (arXiv 2402.02750, sec. 4.3) and COMET's with its attention (arXiv 2410.12168):
    they read the packed KV with its scales and zero points, and decode reads each sequence's
    16-bit residual window beside it; new tokens pay a `kv_quantize` kernel (read 16-bit K/V,
    write them packed)."""
    a, kvb = DTYPE_BYTES[prec.activations], kv_bytes_per_elem(prec.kv_cache)
    kv_elems = 2 * kv_heads * head_dim  # K and V per token
    b = batch
    ops: list[Op] = []
    quantized = prec.kv_cache in KV_QUANT_FORMATS
    residual = kv_residual_tokens(prec.kv_cache) * kv_elems * (a - kvb)  # per sequence
    if "prefill" in parts:
        if quantized:
            ops.append(_kv_quantize(b.prefill_tokens, kv_elems * (a + kvb), count))
        ops.append(
            Op(
                "attention_prefill",
                "attention_prefill",
                count,
                flops=4.0 * heads * head_dim * b.prefill_pairs,
                bytes=b.prefill_tokens * (2 * heads * head_dim * a + kv_elems * kvb)
                + b.prefill_kv_tokens * kv_elems * kvb,
                dtype=prec.activations,
                seq_len=safe_div(b.prefill_tokens, b.prefill_seqs),
                batch=b.prefill_seqs,
                heads=heads,
                kv_heads=kv_heads,
                kv_dtype=prec.kv_cache,
                kv_row_elems=kv_heads * head_dim,
                scales_with="batch",
            )
        )
    if "decode" in parts:
        if quantized:
            ops.append(_kv_quantize(b.decode_seqs, kv_elems * (a + kvb), count))
        ops.append(
            Op(
                "attention_decode",
                "attention_decode",
                count,
                flops=4.0 * heads * head_dim * b.decode_kv_tokens,
                bytes=b.decode_kv_tokens * kv_elems * kvb
                + b.decode_seqs * (2 * heads * head_dim * a + kv_elems * kvb + residual),
                dtype=prec.activations,
                seq_len=safe_div(b.decode_kv_tokens, b.decode_seqs),
                batch=b.decode_seqs,
                heads=heads,
                kv_heads=kv_heads,
                kv_dtype=prec.kv_cache,
                kv_bytes=b.decode_kv_tokens * kv_elems * kvb + b.decode_seqs * residual,
                kv_row_elems=kv_heads * head_dim,
                scales_with="batch",
            )
        )
    return ops


def _kv_quantize(tokens: Num, bytes_per_token: float, count: float) -> Op:
    """New tokens' K and V read in 16 bits and written packed with their group scales (KIVI
    quantizes a residual group of them at a time, the same bytes per token)."""
    return elementwise(
        "kv_quantize", bytes_=tokens * bytes_per_token, count=count, scales_with="batch"
    )


def eviction_ops(
    model: ModelSpec, tp: int, prec: Precision, b: BatchShape, part: BatchPart
) -> list[Op]:
    """The kernels a KV token budget adds (`Precision.kv_eviction`), per device, of one part:

    - snapkv, at prefill: the observation window's queries against every prompt key
      (`snapkv_scores`, w x head_dim by head_dim x prompt per head) and the selection
      (`snapkv_select`: the scores' softmax, sum over the window, pooling and top-k read and
      written in fp32, then the kept K/V gathered: at most every prompt token read and written
      once). Priced per prompt token as the chunks are computed, which over a prompt sums to
      SnapKV's one pass at its end.
    - h2o, at decode: the step's attention weights written out (flash kernels keep them on
      chip) and added to each cached token's accumulated score, whose lowest is evicted
      (`h2o_scores`: per attended token and query head, fp32 written, read and written back,
      and read for the arg-min).
    - streaming: none (the sinks stay and the window is a ring buffer)."""
    ev = prec.kv_eviction
    if ev is None:
        return []
    attn = model.attention
    heads = attn.num_heads // tp
    if isinstance(attn, GQAttention):
        kv_heads = max(1, attn.num_kv_heads // tp)
        kv_elems, head_dim = 2 * kv_heads * attn.head_dim, attn.head_dim
    else:
        kv_elems, head_dim = attn.kv_elems_per_token, attn.kv_elems_per_token
    kvb, n = kv_bytes_per_elem(prec.kv_cache), float(model.num_layers)
    if ev.policy == "snapkv" and part == "prefill":
        window = float(ev.observation_window)
        return [
            Op(
                "snapkv_scores",
                "attention_prefill",
                n,
                flops=2.0 * heads * head_dim * window * b.prefill_tokens,
                bytes=b.prefill_tokens * (kv_elems / 2 * kvb + heads * 4.0),
                dtype=prec.activations,
                seq_len=window,
                batch=b.prefill_seqs,
                heads=heads,
                kv_heads=heads,
                kv_dtype=prec.kv_cache,
                kv_row_elems=kv_elems / 2,
                scales_with="batch",
            ),
            elementwise(
                "snapkv_select",
                bytes_=b.prefill_tokens * (heads * 4.0 * 3 + 2 * kv_elems * kvb),
                count=n,
                scales_with="batch",
            ),
        ]
    if ev.policy == "h2o" and part == "decode":
        return [
            elementwise(
                "h2o_scores",
                bytes_=b.decode_kv_tokens * heads * 4.0 * 4,
                count=n,
                scales_with="batch",
            )
        ]
    return []


def _gqa_ops(
    attn: GQAttention,
    model: ModelSpec,
    layout: Parallelism,
    prec: Precision,
    b: BatchShape,
    *,
    gpus_per_node: int,
) -> list[Op]:
    """GQA's ops: the projections of this device's tokens (1/cp of the step's), attention."""
    h, d, n_layers = model.hidden_size, attn.head_dim, model.num_layers
    heads, kv_heads = _gqa_heads(attn, layout.tp)
    a = DTYPE_BYTES[prec.activations]
    t = b.num_tokens / layout.cp
    rope = rotary(t, heads, kv_heads, d, act_bytes=a, count=n_layers)
    every = (0, n_layers)
    qkv = heads + 2 * kv_heads
    shares: dict[LinearName, float] = {"q": heads / qkv, "k": kv_heads / qkv, "v": kv_heads / qkv}
    conv = (
        _cca_conv_ops(attn, heads, kv_heads, t, prec, n_layers)
        if isinstance(attn, CCAttention)
        else []
    )
    return [
        gemm(
            "qkv_proj",
            m=t,
            n=qkv * d,
            k=h,
            count=n_layers,
            prec=prec,
            linears=shares,
            layers=every,
        ),
        *conv,
        *([rope] if model.position == "rope" else []),
        *_gqa_attention(attn, model, layout, prec, b, gpus_per_node=gpus_per_node),
        gemm(
            "o_proj",
            m=t,
            n=h,
            k=heads * d,
            count=n_layers,
            prec=prec,
            linears={"o": 1.0},
            layers=every,
        ),
    ]


def _sparse_decode(b: BatchShape, prec: Precision) -> BatchShape:
    """`b` with each decode attending to at most ShadowKV's sparse budget (from the batch's
    aggregates: exact when every sequence is past the budget or every one within it, an upper
    bound between); `b` itself without ShadowKV."""
    sk = prec.shadowkv
    if sk is None:
        return b
    return dataclasses.replace(
        b, decode_kv_tokens=np.minimum(b.decode_kv_tokens, np.asarray(b.decode_seqs) * sk.budget)
    )


def shadowkv_ops(
    attn: GQAttention, model: ModelSpec, tp: int, prec: Precision, b: BatchShape, part: BatchPart
) -> list[Op]:
    """The kernels ShadowKV (arXiv 2410.21465, sec. 4) adds, per device, of one part, per layer:

    - prefill: the new keys projected onto the rank-r basis (`shadowkv_key_factor`, a GEMM per
      token of K width x r; the basis's SVD itself, once per prompt, is not priced), their
      chunk means written (`shadowkv_landmarks_write`), and the new values copied to host
      memory over the host link (`shadowkv_value_offload`).
    - decode: the query against every landmark (`shadowkv_landmark_scores`: each landmark
      read, scores written in fp32 and read back for the top-k), the selected keys rebuilt
      from the factors (`shadowkv_key_rebuild`: budget x r by r x K width per sequence, with
      RoPE applied on write) and the selected values not kept on the GPU fetched over the
      host link (`shadowkv_value_fetch`; the budget less the outliers, which stay on the GPU).
      The paper runs the rebuild and the fetch on separate
      CUDA streams; `roofline.evaluate` hides the fetch under the rebuild
      (`overlap_shadowkv`). The sparse attention over the budget is `attention_decode`."""
    sk = prec.shadowkv
    if sk is None:
        return []
    heads, kv_heads = _gqa_heads(attn, tp)
    width = kv_heads * attn.head_dim
    rank = sk.rank * kv_heads / attn.num_kv_heads
    a, kvb = DTYPE_BYTES[prec.activations], kv_bytes_per_elem(prec.kv_cache)
    n = float(model.num_layers)
    if part == "prefill":
        t = b.prefill_tokens
        return [
            gemm(
                "shadowkv_key_factor",
                m=t,
                n=rank,
                k=width,
                count=n,
                prec=prec,
                weight_dtype=prec.activations,
                scales_with="batch",
            ),
            elementwise(
                "shadowkv_landmarks_write",
                bytes_=t * width * a * (1.0 + 1.0 / sk.chunk),
                count=n,
                scales_with="batch",
            ),
            collective(
                "shadowkv_value_offload",
                "host_copy",
                msg_bytes=t * width * kvb,
                group=1,
                count=n,
                scales_with="batch",
            ),
        ]
    seqs = np.asarray(b.decode_seqs, dtype=float)
    landmarks = np.asarray(b.decode_kv_tokens, dtype=float) / sk.chunk
    selected = np.minimum(np.asarray(b.decode_kv_tokens, dtype=float), seqs * sk.budget)
    outliers = sk.outlier_share * np.asarray(b.decode_kv_tokens, dtype=float)
    fetched = np.maximum(selected - outliers, 0.0)
    return [
        Op(
            "shadowkv_landmark_scores",
            "memory",
            n,
            flops=2.0 * heads * attn.head_dim * landmarks,
            bytes=landmarks * (width * a + heads * 4.0 * 2),
            dtype=prec.activations,
            scales_with="batch",
        ),
        gemm(
            "shadowkv_key_rebuild",
            m=sk.budget,
            n=width,
            k=rank,
            groups=seqs,
            count=n,
            prec=prec,
            weight_dtype=prec.activations,
            scales_with="batch",
        ),
        collective(
            "shadowkv_value_fetch",
            "host_copy",
            msg_bytes=fetched * width * kvb,
            group=1,
            count=n,
            scales_with="batch",
        ),
    ]


def swiftkv_ops(
    model: ModelSpec,
    layout: Parallelism,
    prec: Precision,
    b: BatchShape,
    part: BatchPart,
    *,
    gpus_per_node: int,
) -> list[Op]:
    """What SwiftKV (arXiv 2410.03960, sec. 3.1) runs in the layers prompt tokens skip, per
    device, of one part. Prefill: each prompt token's K and V projections in every skipped
    layer from the output of the last kept one (`swiftkv_kv_proj`) and their cache write
    (`swiftkv_kv_write`); the last prompt token of each prefilling sequence runs the skipped
    layers whole, for its logits (every sequence with a chunk counted: an upper bound).
    Decode: the decoding tokens run the skipped layers whole. Those layers' token-scaled ops
    (projections, norms, MLP, all-reduces) at those tokens, their share of the layers."""
    sw = prec.swiftkv
    attn = model.attention
    if sw is None or not isinstance(attn, GQAttention):
        return []
    n_layers = model.num_layers
    skipped = sw.skipped_layers(n_layers)
    if skipped == 0:
        return []
    ops: list[Op] = []
    if part == "prefill":
        _, kv_heads = _gqa_heads(attn, layout.tp)
        kv_elems = 2 * kv_heads * attn.head_dim
        ops += [
            gemm(
                "swiftkv_kv_proj",
                m=b.prefill_tokens,
                n=kv_elems,
                k=model.hidden_size,
                count=skipped,
                prec=prec,
                linears={"k": 0.5, "v": 0.5},
                layers=(n_layers - skipped, n_layers),
                scales_with="batch",
            ),
            elementwise(
                "swiftkv_kv_write",
                bytes_=b.prefill_tokens * kv_elems * kv_bytes_per_elem(prec.kv_cache),
                count=skipped,
                scales_with="batch",
            ),
        ]
        tokens = b.prefill_seqs
    else:
        tokens = b.decode_seqs
    plain = prec.model_copy(update={"swiftkv": None})
    share = skipped / n_layers
    for op in step_ops(
        model, layout, plain, BatchShape(prefill_tokens=tokens), gpus_per_node=gpus_per_node
    ):
        if op.scales_with == "tokens" and op.name not in NOT_LAYERS:
            ops.append(
                dataclasses.replace(
                    op, name=f"swiftkv_{op.name}", count=op.count * share, scales_with="batch"
                )
            )
    return ops


# token-scaled ops of a step that are not in its layers
NOT_LAYERS = ("embedding", "final_norm", "pp_send_recv", "pp_send_recv_internode")


def _gqa_attention(
    attn: GQAttention,
    model: ModelSpec,
    layout: Parallelism,
    prec: Precision,
    b: BatchShape,
    *,
    gpus_per_node: int,
    parts: tuple[BatchPart, ...] = BATCH_PARTS,
) -> list[Op]:
    """The attention ops of each of `parts` on one device, with what context parallelism
    sends for that part after them."""
    rank = cp_rank_shape(b, layout.cp)
    ops: list[Op] = []
    for part in parts:
        ops += _gqa_batch_ops(attn, model, layout.tp, prec, rank, (part,))
        ops += context_parallel_ops(
            attn, model, layout, prec, b, gpus_per_node=gpus_per_node, parts=(part,)
        )
        ops += shadowkv_ops(attn, model, layout.tp, prec, b, part)
        ops += swiftkv_ops(model, layout, prec, b, part, gpus_per_node=gpus_per_node)
    return ops


def _cca_conv_ops(
    attn: CCAttention, heads: int, kv_heads: int, t: Num, prec: Precision, count: float
) -> list[Op]:
    """CCA's convolutions of the latent queries and keys (arXiv 2510.04476, sec. 3; ZAYA1's
    conv_qk): a depthwise causal convolution (each channel read and written), then one grouped
    by head, a `head_dim` x (taps x `head_dim`) product per head and token (a grouped GEMM on
    its weights); then the queries' and keys' mean with their unconvolved selves, their norms
    and the value shift, elementwise (each latent read twice and written once)."""
    d = attn.head_dim
    taps0, taps1 = attn.conv_kernels
    channels = (heads + kv_heads) * d
    a = DTYPE_BYTES[prec.activations]
    return [
        elementwise("cca_conv_depthwise", bytes_=t * channels * a * (taps0 + 1), count=count),
        gemm(
            "cca_conv_grouped",
            m=t,
            n=d,
            k=taps1 * d,
            groups=heads + kv_heads,
            count=count,
            prec=prec,
            weight_dtype=prec.activations,
        ),
        elementwise("cca_mix", bytes_=t * (channels + kv_heads * d) * a * 3, count=count),
    ]


def _gqa_heads(attn: GQAttention, tp: int) -> tuple[int, int]:
    """(query heads, KV heads) per device; KV heads are replicated when fewer than ranks."""
    return attn.num_heads // tp, max(1, attn.num_kv_heads // tp)


def _gqa_batch_ops(
    attn: GQAttention,
    model: ModelSpec,
    tp: int,
    prec: Precision,
    b: BatchShape,
    parts: tuple[BatchPart, ...] = BATCH_PARTS,
) -> list[Op]:
    """The GQA ops whose cost depends on the batch's shape (`scales_with="batch"`). In a
    hybrid layout (`sliding_window_layers`) the batch is not window-capped (`batch_window`):
    the global layers attend to all of it and the window layers to `windowed(b)` of it."""
    heads, kv_heads = _gqa_heads(attn, tp)
    local = model.num_window_layers if attn.batch_window is None else 0
    window = attn.sliding_window
    skipped = 0 if prec.swiftkv is None else prec.swiftkv.skipped_layers(model.num_layers)
    ops: list[Op] = []
    for part in parts:  # all prefill ops first, then all decode ops, as `batch_ops` promises
        ops += attention_ops(
            heads=heads,
            kv_heads=kv_heads,
            head_dim=attn.head_dim,
            prec=prec,
            batch=_sparse_decode(b, prec) if part == "decode" else b,
            # SwiftKV: prompt tokens attend only in the layers they run
            count=model.num_layers - local - (skipped if part == "prefill" else 0),
            parts=(part,),
        )
        if local and window is not None:
            ops += attention_ops(
                heads=heads,
                kv_heads=kv_heads,
                head_dim=attn.head_dim,
                prec=prec,
                batch=windowed(b, window),
                count=local,
                parts=(part,),
            )
        ops += eviction_ops(model, tp, prec, b, part)
    return [op for op in ops if op.count]


def _mla_ops(
    attn: MLAttention, model: ModelSpec, tp: int, prec: Precision, b: BatchShape
) -> list[Op]:
    """DeepSeek MLA as vLLM runs it: prefill up-projects the latent to per-head K/V (MHA with
    qk dim nope+rope, v dim v_head_dim); decode absorbs W_UK/W_UV into the query/output and
    attends in the latent space (MQA over kv_lora_rank + rope dims)."""
    h, n_layers = model.hidden_size, model.num_layers
    heads = attn.num_heads // tp
    qk, v, lat = attn.head_dim, attn.v_head_dim, attn.kv_elems_per_token
    t = b.num_tokens
    ops: list[Op] = []

    def proj(name: str, n: float, k: float, linear: LinearName) -> Op:
        return gemm(
            name,
            m=t,
            n=n,
            k=k,
            count=n_layers,
            prec=prec,
            linears={linear: 1.0},
            layers=(0, n_layers),
        )

    if attn.q_lora_rank:
        ops.append(proj("q_a_proj", attn.q_lora_rank, h, "q"))
        ops.append(proj("q_b_proj", heads * qk, attn.q_lora_rank, "q"))
    else:
        ops.append(proj("q_proj", heads * qk, h, "q"))
    ops.append(proj("kv_a_proj", lat, h, "k"))
    ops += _mla_batch_ops(attn, model, tp, prec, b)
    ops.append(proj("o_proj", h, heads * v, "o"))
    return ops


def _mla_batch_ops(
    attn: MLAttention,
    model: ModelSpec,
    tp: int,
    prec: Precision,
    b: BatchShape,
    parts: tuple[BatchPart, ...] = BATCH_PARTS,
) -> list[Op]:
    """The MLA ops whose cost depends on the batch's shape (`scales_with="batch"`) of `parts`:
    prefill's latent up-projection and attention (the batch's prefill fields), decode's
    absorbed projections and attention (its decode fields)."""
    n_layers = model.num_layers
    heads = attn.num_heads // tp
    qk, v, lat = attn.head_dim, attn.v_head_dim, attn.kv_elems_per_token
    a, kvb = DTYPE_BYTES[prec.activations], kv_bytes_per_elem(prec.kv_cache)
    nope = attn.qk_nope_head_dim
    ops: list[Op] = []
    if "prefill" in parts:
        ops += [
            gemm(
                "kv_b_proj",
                m=b.prefill_kv_tokens,
                n=heads * (nope + v),
                k=attn.kv_lora_rank,
                count=n_layers,
                prec=prec,
                linears={"v": 1.0},
                layers=(0, n_layers),
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
                seq_len=safe_div(b.prefill_tokens, b.prefill_seqs),
                batch=b.prefill_seqs,
                heads=heads,
                kv_heads=heads,  # K/V up-projected per head: MHA
                kv_dtype=prec.kv_cache,
                kv_row_elems=attn.kv_lora_rank,  # the cache holds the latent
                scales_with="batch",
            ),
        ]
    if "prefill" in parts:
        ops += eviction_ops(model, tp, prec, b, "prefill")
    if "decode" in parts:
        ops += [
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
                seq_len=safe_div(b.decode_kv_tokens, b.decode_seqs),
                batch=b.decode_seqs,
                heads=heads,
                kv_bytes=b.decode_kv_tokens * lat * kvb,
                kv_heads=1.0,  # one latent shared by all query heads
                kv_dtype=prec.kv_cache,
                kv_row_elems=attn.kv_lora_rank,
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
        ]
    if "decode" in parts:
        ops += eviction_ops(model, tp, prec, b, "decode")
    return ops


# -- the step -----------------------------------------------------------------------------------
def sampler_op(sampled: Num, vocab: int) -> Op:
    """The greedy pick of `sampled` sequences' next tokens: their logits read and written as
    fp32 and reduced to an argmax, 8 bytes per sequence and vocabulary entry in one kernel.
    What sampling at a temperature, filtering or penalising adds is the engine's
    (`serving.steptime.sampler_passes`)."""
    return elementwise("sampler", bytes_=sampled * vocab * 4.0 * 2, count=1, scales_with="sampled")


def sampler_pass_op(name: str, work: LogitsPass, sampled: Num, vocab: int) -> Op:
    """One of the engine's sampler passes over the logits of `sampled` sequences (the draw at
    a temperature, a top-p sort, penalties...: `EngineSpec`'s LogitsPass entries), priced as
    its memory-bound kernels."""
    return elementwise(
        name,
        bytes_=sampled * vocab * work.bytes_per_logit / work.kernels,
        count=work.kernels,
        scales_with="sampled",
    )


def batch_ops(
    model: ModelSpec,
    layout: Parallelism,
    prec: Precision,
    batch: BatchShape,
    *,
    parts: tuple[BatchPart, ...] = BATCH_PARTS,
    gpus_per_node: int = 8,
) -> list[Op]:
    """The ops of `step_ops` whose cost depends on the batch's shape (`scales_with="batch"`:
    attention, and MLA's per-step projections), the same ops in the same order, built without
    the rest of the step (a serving timer prices a step's shape-dependent part thousands of
    times). With `parts`, only those that read the batch's prefill fields ("prefill") or its
    decode fields ("decode"); the prefill ones come first, so `parts=("prefill",)` then
    `parts=("decode",)` is the whole list, in order."""
    attn = model.attention
    if isinstance(attn, GQAttention):
        ops = _gqa_attention(
            attn, model, layout, prec, batch, gpus_per_node=gpus_per_node, parts=parts
        )
    else:
        ops = _mla_batch_ops(attn, model, layout.tp, prec, batch, parts)
    return [op for op in ops if op.count > 0]


# -- context parallelism ------------------------------------------------------------------------
def cp_rank_shape(batch: BatchShape, cp: int) -> BatchShape:
    """The attention work of one of `cp` context-parallel ranks. Prefill (ring attention,
    Liu et al. arXiv 2310.01889, with the load-balanced causal split of Llama 3, arXiv
    2407.21783 section 3.3: each sequence cut into 2cp chunks, rank i holding chunks i and
    2cp - 1 - i): a rank computes its 1/cp of every sequence's queries and of the causal
    (query, key) pairs, writes its 1/cp of the new KV and reads every KV block once as it
    passes round the ring. Decode (DistAttention, Infinite-LLM arXiv 2401.02669): every
    decoding query meets the rank's 1/cp of its sequence's KV. Sampling is the owning rank's:
    1/cp of the rows on average."""
    if cp == 1:
        return batch
    return BatchShape(
        prefill_tokens=batch.prefill_tokens / cp,
        prefill_seqs=batch.prefill_seqs,
        prefill_pairs=batch.prefill_pairs / cp,
        prefill_kv_tokens=batch.prefill_kv_tokens,
        decode_seqs=batch.decode_seqs,
        decode_kv_tokens=batch.decode_kv_tokens / cp,
        sampled=batch.sampled / cp,
    )


def context_parallel_ops(
    attn: GQAttention,
    model: ModelSpec,
    layout: Parallelism,
    prec: Precision,
    batch: BatchShape,
    *,
    gpus_per_node: int,
    parts: tuple[BatchPart, ...] = BATCH_PARTS,
) -> list[Op]:
    """What context parallelism sends, per device, for the whole replica's `batch`. Prefill:
    each layer's KV shards circulate round the ring of cp ranks (pass-KV), cp - 1 transfers
    of one rank's shard (`cp_ring_kv`), each overlapped with the attention of the block in hand
    (`roofline.evaluate` keeps only what outlasts it). Decode: the step's queries gathered to
    every rank (`cp_decode_q_all_gather`), then each rank's partial output with its
    log-sum-exp gathered and merged (`cp_decode_combine`), once a layer. Ranks in one node
    talk over its fabric; a group spanning nodes (tp x cp > gpus_per_node) over the
    scale-out network, whose hops set the pace."""
    cp = layout.cp
    if cp == 1:
        return []
    heads, kv_heads = _gqa_heads(attn, layout.tp)
    d, n = attn.head_dim, float(model.num_layers)
    a, kvb = DTYPE_BYTES[prec.activations], DTYPE_BYTES[prec.kv_cache]
    out = layout.cp_crosses_nodes(gpus_per_node)
    ops: list[Op] = []
    if "prefill" in parts:
        shard = batch.prefill_kv_tokens / cp * 2 * kv_heads * d * kvb
        ops.append(
            collective(
                "cp_ring_kv",
                "send_recv",
                msg_bytes=shard,
                group=2,  # to the next rank of the ring
                count=n * (cp - 1),
                scale_out=out,
                scales_with="batch",
            )
        )
    if "decode" in parts:
        q = batch.decode_seqs * heads * d * a
        partial = batch.decode_seqs * heads * (d * a + 4.0)  # output and fp32 log-sum-exp
        for name, msg in (("cp_decode_q_all_gather", q), ("cp_decode_combine", partial)):
            ops.append(
                collective(
                    name,
                    "all_gather",
                    msg_bytes=msg,
                    group=cp,
                    count=n,
                    scale_out=out,
                    scales_with="batch",
                )
            )
    return ops


def stage_boundaries(layout: Parallelism, *, gpus_per_node: int) -> list[bool]:
    """For each pipeline boundary (after stage 0 .. pp - 2): does it cross a node? Stages of
    tp x cp devices fill nodes of `gpus_per_node` in order."""
    stage = layout.tp * layout.cp
    return [(i * stage) % gpus_per_node == 0 for i in range(1, layout.pp)]


def step_ops(
    model: ModelSpec,
    layout: Parallelism,
    prec: Precision,
    batch: BatchShape,
    *,
    gpus_per_node: int = 8,
) -> list[Op]:
    """Every kernel of one step on one device of the replica, with repeat counts. Pipeline
    stages of tp x cp devices fill nodes of `gpus_per_node` in order; a stage boundary that
    crosses a node boundary sends over the scale-out network. With context parallelism each
    rank runs the layers' GEMMs on its 1/cp of the step's tokens (prompt chunks split, each
    decoding sequence owned by one rank) and its share of attention (`cp_rank_shape`,
    `context_parallel_ops`)."""
    h, tp, n_layers = model.hidden_size, layout.tp, float(model.num_layers)
    a = DTYPE_BYTES[prec.activations]
    cp = layout.cp
    t = batch.num_tokens / cp
    sampled = batch.sampled / cp
    # fused add + RMSNorm: vLLM's kernel is one block per token in 0.2, vectorised from 0.4
    # (width-8 loads, csrc/layernorm_kernels.cu), so only engines naming "norm" price its
    # launch; LayerNorm is PyTorch's (vectorised) kernel
    norm = rms_norm("norm", t, h, act_bytes=a, count=2 * n_layers, launched=model.norm == "rms")
    attn = model.attention
    attn_ops = (
        _gqa_ops(attn, model, layout, prec, batch, gpus_per_node=gpus_per_node)
        if isinstance(attn, GQAttention)
        else _mla_ops(attn, model, tp, prec, batch)
    )
    ops = [elementwise("embedding", bytes_=t * h * a * 2, count=1), norm, *attn_ops]
    if model.num_dense_layers:
        ops += mlp_ops(
            "",
            model.mlp,
            h=h,
            shards=tp,
            tokens=t,
            count=float(model.num_dense_layers),
            prec=prec,
            layers=(0, model.num_dense_layers),
        )
    if model.moe is not None:
        ops += moe_ops(model, layout, prec, batch if cp == 1 else BatchShape(prefill_tokens=t))
    ops += [
        elementwise("final_norm", bytes_=t * h * a * 2, count=1),
        gemm(
            "lm_head",
            m=sampled,
            n=model.vocab_size / tp,
            k=h,
            count=1,
            prec=prec,
            linears={"lm_head": 1.0},
            scales_with="sampled",
        ),
        sampler_op(sampled, model.vocab_size),
    ]
    if tp > 1:
        ops += [
            collective(
                "tp_all_reduce", "all_reduce", msg_bytes=t * h * a, group=tp, count=2 * n_layers + 1
            ),  # attention out, MLP out, vocab-parallel embedding
            collective(
                "logits_all_gather",
                "all_gather",
                msg_bytes=sampled * model.vocab_size * a,
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
    if prec.swiftkv is not None and isinstance(attn, GQAttention):
        # SwiftKV: every token runs the kept layers; the skipped ones are `swiftkv_ops`
        kept = 1.0 - prec.swiftkv.skipped_layers(model.num_layers) / n_layers
        ops = [
            dataclasses.replace(op, count=op.count * kept)
            if op.scales_with == "tokens" and op.name not in NOT_LAYERS
            else op
            for op in ops
        ]
    return [op for op in ops if op.count > 0]
