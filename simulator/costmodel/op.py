"""One operator of a step's op list (`costmodel.ops`): the `Op` record, a kernel's FLOPs and
DRAM bytes per instance with its repeat count, and its three constructors: a GEMM on a stored
weight, a memory-bound elementwise kernel and a collective. No device or time appears here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from simulator.costmodel.batch import Num
from simulator.specs.deployment import QUANTISED_COMPUTE, Precision
from simulator.specs.hardware import RowKernel
from simulator.specs.model import DTYPE_BYTES
from simulator.specs.weights import (
    BYTES_PER_WEIGHT,
    FP4_BLOCK_SIZE,
    INT4_GROUP_SIZE,
    UNQUANTISED,
    LinearName,
    bytes_per_weight,
)

OpKind = Literal["gemm", "attention_prefill", "attention_decode", "memory", "collective"]
# host_copy: bytes between this device and host memory over the host link (ShadowKV's values)
Collective = Literal["", "all_reduce", "all_gather", "all_to_all", "send_recv", "host_copy"]
# What an op's cost depends on: the step's token count alone, the number of sequences sampled
# alone, or the batch's full shape (attention). The serving simulator tabulates the first two.
# `ep_group`: the tokens of the whole expert-parallel group under DP attention (the expert FFNs
# and the all-to-alls of wide EP), which `serving.dp_group` prices once for all its ranks.
ScalesWith = Literal["tokens", "sampled", "batch", "ep_group"]

__all__ = [
    "FP4_BLOCK_SIZE",
    "INT4_GROUP_SIZE",
    "Collective",
    "Op",
    "OpKind",
    "RowLaunch",
    "ScalesWith",
    "collective",
    "elementwise",
    "gemm",
    "safe_div",
    "weight_bytes_per_param",
]


def weight_bytes_per_param(dtype: str) -> float:
    """Storage bytes per weight (or quantised activation) including its block scales
    (`simulator.specs.weights`: AWQ/GPTQ int4 groups of 128, NVFP4 blocks of 16, GGUF blocks)."""
    return bytes_per_weight(dtype) if dtype in BYTES_PER_WEIGHT else DTYPE_BYTES[dtype]


@dataclass(frozen=True, slots=True)
class RowLaunch:
    """How an elementwise kernel with one thread block per row (token) is launched: `rows`
    blocks of `threads` threads, each thread looping `trips` times over its row's elements
    (`costmodel.elementwise_kernels` has the engines' launch rules and the time it costs)."""

    kernel: RowKernel
    rows: Num
    threads: Num
    trips: Num


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel, `count` times per step. flops/bytes are per instance; for GEMMs m, n, k are
    the shape and `groups` the number of independent GEMMs fused in one launch (MoE experts,
    per-head batched GEMMs). For attention, `seq_len` is the mean query (prefill) or KV
    (decode) length, `batch` the sequences, `heads` / `kv_heads` the query and KV heads per
    device, `kv_dtype` the KV cache's dtype and `kv_bytes` the part of `bytes` that reads the
    KV cache, `kv_row_elems` the elements per token of a K row the KV-cache write stores (KV
    heads x head dim; MLA: the latent; 0: no write priced). `pre_bytes` is the traffic of a
    memory-bound kernel that must run first (activation quantisation of a W8A8 GEMM).
    `launch` is the thread-block launch of a one-block-per-row elementwise kernel (None:
    priced by its bytes alone). `fused_moe`: a routed experts' GEMM, run by the engine's fused
    MoE kernel (`EngineSpec.fused_moe_fraction`), as that kernel's shape (local experts,
    intermediate size per shard: what its configuration is picked by); None for any other.
    `weight_only`: a GEMM on quantised weights dequantised and multiplied in 16-bit (Marlin,
    ggml). Collectives move `msg_bytes` among
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
    fused_moe: tuple[int, int] | None = None
    moe_tokens: Num = 0.0  # fused MoE: the tokens of the kernel's call (vLLM's M)
    fp8_blocks: bool = False  # an fp8 GEMM on weights scaled per block (Precision.fp8_blocks)
    weight_only: bool = False
    kv_row_elems: float = 0.0
    launch: RowLaunch | None = None
    collective: Collective = ""
    group_size: int = 1
    msg_bytes: Num = 0.0
    scale_out: bool = False
    scales_with: ScalesWith = "tokens"


def safe_div(a: Num, b: Num) -> Num:
    """a / b, elementwise, and 0 where b is not positive."""
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
    linears: dict[LinearName, float] | None = None,
    layers: tuple[int, int] = (0, 0),
    groups: Num = 1.0,
    scales_with: ScalesWith = "tokens",
    fused_moe: tuple[int, int] | None = None,
    moe_tokens: Num = 0.0,
) -> Op:
    """A (groups x) m-by-k times k-by-n GEMM whose k-by-n operand is a stored weight. A W8A8
    or NVFP4 W4A4 GEMM (8- or 4-bit compute, 16-bit activations) reads activations quantised
    by a kernel before it (`pre_bytes`: read 16-bit, write 8-bit, or 4-bit with block scales).
    `fused_moe`: routed experts' GEMMs in the engine's fused MoE kernel, whose configuration
    vLLM picks by this shape (local experts, intermediate size per shard) and the call's
    `moe_tokens`. The weight is stored
    in `weight_dtype`, else in the formats of `linears` (linear -> share of the weight) over
    `layers` [start, stop) (`Precision.gemm_weights`), else in the main weight format."""
    a = DTYPE_BYTES[prec.activations]
    if weight_dtype is None and linears is not None:
        wb, dtype, fmt = prec.gemm_weights(linears, layers)
    else:
        fmt = weight_dtype or prec.weights
        wb = weight_bytes_per_param(fmt)
        dtype = prec.compute if fmt == prec.weights else prec.activations
    quantised = dtype in QUANTISED_COMPUTE and a > 1
    a_in = weight_bytes_per_param(dtype) if quantised else a
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
        fused_moe=fused_moe,
        moe_tokens=moe_tokens,
        fp8_blocks=dtype == "fp8" and prec.fp8_blocks,
        weight_only=fmt not in UNQUANTISED and dtype == prec.activations,
    )


def elementwise(
    name: str,
    *,
    bytes_: Num,
    count: float,
    scales_with: ScalesWith = "tokens",
    launch: RowLaunch | None = None,
) -> Op:
    return Op(name, "memory", count, 0.0, bytes_, launch=launch, scales_with=scales_with)


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
