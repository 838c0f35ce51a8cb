#!/usr/bin/env python3
"""Time a decode-attention kernel that reads each KV head once per query head against one that
reads it once per KV head, on the local GPU.

    python tools/measure_gqa_decode.py OUT_DIR [--kv-dtype fp8|fp16] [--quick]

Needs PyTorch with a CUDA device and Triton (not dependencies of llmsim: run it where the GPU
is). Writes OUT_DIR/gqa_decode_<kv dtype>.csv row by row and OUT_DIR/env.json.

Why: TensorRT-LLM up to 0.7 (XQA off) ran every generation step of a grouped-query model on its
masked multi-head attention kernel, one thread block per (query head, sequence):
`dim3 grid{num_heads, batch_size, 1}` (decoderMaskedMultiheadAttentionLaunch.h), each block
streaming the whole K and V history of its KV head `hi / (num_heads / num_kv_heads)` and
converting it from fp8 on CUDA cores (NVIDIA/TensorRT-LLM main at __version__ 0.6.1, 9b3e12d,
decoderMaskedMultiheadAttentionTemplate.h). So each KV head's cache passes through the SMs once
per query head; how much of that reaches DRAM depends on whether the sibling blocks, adjacent in
the grid, share it through L2. This measures that on the device with two kernels of the same
arithmetic:

  * `per_query_head`: grid (query heads, batch), blocks in the same order as that kernel's
    (x fastest: the query heads of one sequence side by side); each block loads its KV head's
    fp8 K and V in chunks of BLOCK_T tokens, dequantises them to fp32, and runs the online-softmax
    dot products on CUDA cores (no tensor cores, as the MMHA kernel).
  * `per_kv_head`: grid (KV heads, batch); each block loads the same chunks once and computes the
    scores of all the group's query heads from them (the group padded to 16 rows, tl.dot),
    the read-once layout of a grouped kernel (TensorRT-LLM's later XQA, vLLM's FlashAttention).

Each row: Llama-2-70B's attention at one tensor-parallel degree (64/8, 32/4 or 16/2 query/KV
heads, head dim 128), `batch` sequences of `context` tokens each in a contiguous KV cache of
`--kv-dtype` (fp8 e4m3, as the FP8 engines of TensorRT-LLM's performance pages, or fp16),
random data; `triton.testing.do_bench` (median of repeats after warm-up, the cache
flushed between repeats as do_bench does); `kv_bytes` is the K and V bytes of one read per KV
head. The ratio of the two times is what reading per query head costs on this device over
reading once.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

HEAD_DIM = 128
BLOCK_T = 32
LAYOUTS = ((64, 8), (32, 4), (16, 2))  # Llama-2-70B at TP 1, 2, 4
BATCHES = (16, 64, 256, 512)
CONTEXTS = (256, 1024, 2048)
QUICK = ((64, 8, 64, 1024), (16, 2, 512, 2048))


@triton.jit
def _per_query_head(
    q_ptr, k_ptr, v_ptr, o_ptr, ctx, scale,
    sqb, sqh, skb, skh, skt,
    GROUP: tl.constexpr, D: tl.constexpr, BT: tl.constexpr,
):  # fmt: skip
    h = tl.program_id(0)
    b = tl.program_id(1)
    hk = h // GROUP
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * sqb + h * sqh + d).to(tl.float32)
    m_i = tl.max(tl.full([BT], -float("inf"), dtype=tl.float32), axis=0)
    l_i = tl.sum(tl.zeros([BT], dtype=tl.float32), axis=0)
    acc = tl.zeros([D], dtype=tl.float32)
    base = b * skb + hk * skh
    for t0 in range(0, ctx, BT):
        t = t0 + tl.arange(0, BT)
        live = t < ctx
        offs = base + t[:, None] * skt + d[None, :]
        k = tl.load(k_ptr + offs, mask=live[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale
        s = tl.where(live, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_ptr + offs, mask=live[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    tl.store(o_ptr + b * sqb + h * sqh + d, (acc / l_i).to(tl.float16))


@triton.jit
def _per_kv_head(
    q_ptr, k_ptr, v_ptr, o_ptr, ctx, scale,
    sqb, sqh, skb, skh, skt,
    GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BT: tl.constexpr,
):  # fmt: skip
    hk = tl.program_id(0)
    b = tl.program_id(1)
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    rows = g < GROUP
    q_offs = b * sqb + (hk * GROUP + g)[:, None] * sqh + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=rows[:, None], other=0.0)
    m_i = tl.full([GP], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, D], dtype=tl.float32)
    base = b * skb + hk * skh
    for t0 in range(0, ctx, BT):
        t = t0 + tl.arange(0, BT)
        live = t < ctx
        offs = base + t[:, None] * skt + d[None, :]
        k = tl.load(k_ptr + offs, mask=live[:, None], other=0.0).to(tl.float16)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(live[None, :], s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_ptr + offs, mask=live[:, None], other=0.0).to(tl.float16)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    tl.store(o_ptr + q_offs, (acc / l_i[:, None]).to(tl.float16), mask=rows[:, None])


KV_DTYPES = {"fp8": torch.float8_e4m3fn, "fp16": torch.float16}


def measure(
    heads: int, kv_heads: int, batch: int, context: int, kv_dtype: str = "fp8"
) -> dict[str, float | str]:
    group = heads // kv_heads
    dtype = KV_DTYPES[kv_dtype]
    q = torch.randn(batch, heads, HEAD_DIM, device="cuda", dtype=torch.float16)
    k = torch.randn(batch, kv_heads, context, HEAD_DIM, device="cuda").to(dtype)
    v = torch.randn(batch, kv_heads, context, HEAD_DIM, device="cuda").to(dtype)
    outs = [torch.empty_like(q) for _ in range(2)]
    scale = 1.0 / math.sqrt(HEAD_DIM)
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2))

    def per_q() -> None:
        _per_query_head[(heads, batch)](
            q, k, v, outs[0], context, scale, *strides, GROUP=group, D=HEAD_DIM, BT=BLOCK_T
        )

    def per_kv() -> None:
        _per_kv_head[(kv_heads, batch)](
            q, k, v, outs[1], context, scale, *strides,
            GROUP=group, GP=max(16, group), D=HEAD_DIM, BT=BLOCK_T,
        )  # fmt: skip

    per_q()
    per_kv()
    torch.cuda.synchronize()
    err = (outs[0].float() - outs[1].float()).abs().max().item()
    t_q = triton.testing.do_bench(per_q, warmup=25, rep=200)
    t_kv = triton.testing.do_bench(per_kv, warmup=25, rep=200)
    kv_bytes = 2.0 * batch * kv_heads * context * HEAD_DIM * k.element_size()
    torch.cuda.empty_cache()
    return {
        "kv_dtype": kv_dtype,
        "heads": heads,
        "kv_heads": kv_heads,
        "batch": batch,
        "context": context,
        "kv_bytes": kv_bytes,
        "per_query_head_ms": t_q,
        "per_kv_head_ms": t_kv,
        "ratio": t_q / t_kv,
        "per_kv_head_tb_s": kv_bytes / (t_kv * 1e-3) / 1e12,
        "max_abs_diff": err,
    }


def _smi(query: str) -> str:
    cmd = ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"unavailable: {exc}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--kv-dtype", choices=sorted(KV_DTYPES), default="fp8")
    parser.add_argument("--quick", action="store_true", help="two shapes only")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    env = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "driver_clocks_power": _smi("driver_version,clocks.sm,clocks.mem,power.limit"),
        "python": sys.version.split()[0],
    }
    (args.out_dir / "env.json").write_text(json.dumps(env, indent=2) + "\n")
    shapes = (
        QUICK
        if args.quick
        else [(h, kv, b, c) for h, kv in LAYOUTS for b in BATCHES for c in CONTEXTS]
    )
    path = args.out_dir / f"gqa_decode_{args.kv_dtype}.csv"
    with path.open("w", newline="") as f:
        writer: csv.DictWriter[str] | None = None
        for heads, kv_heads, batch, context in shapes:
            row = measure(heads, kv_heads, batch, context, args.kv_dtype)
            if writer is None:
                writer = csv.DictWriter(f, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)
            f.flush()
            print(
                ", ".join(
                    f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                ),
                flush=True,
            )
    env["after"] = _smi("clocks.sm,power.draw,temperature.gpu")
    (args.out_dir / "env.json").write_text(json.dumps(env, indent=2) + "\n")


if __name__ == "__main__":
    main()
