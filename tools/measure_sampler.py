#!/usr/bin/env python3
"""Time vLLM's V1 sampler on the local GPU: its kernels' GPU time and count per step, for each
way a request can sample, in the format of simulator/data/measured/llmsim/<device>/sampler.csv.

    python tools/measure_sampler.py OUT_DIR [--budget-s 300] [--quick]

Needs PyTorch (and Triton) with a CUDA device; it is not a dependency of llmsim: run it where
the GPU is. Each path re-enacts, op for op, what vLLM 0.11.1's `Sampler.forward`
(vllm/v1/sample/sampler.py) issues for a batch whose requests all sample alike, from a
`batch x vocab` bf16 logits tensor (the LM head's output) to the int32 token ids:

  greedy       temperature 0: logits to fp32, argmax.
  random       temperature 0.7: to fp32, divide by the temperature, softmax, an exponential
               draw, divide, argmax (topk_topp_sampler.py `random_sample`).
  top_p        random with top-p 0.9: `apply_top_k_top_p` sorts every row, softmaxes and
               cumsums the sorted row, masks it and scatters it back; then as random.
  top_k        random with top-k 50: `apply_top_k_only` (torch.topk, no sort); then as random.
  top_k_top_p  both: the sort path with the top-k mask too.
  min_p        random with min-p 0.1 (logits_processor/builtin.py MinPLogitsProcessor: softmax,
               row max, `<` mask, boolean-mask fill of -inf).
  logprobs     greedy with 5 logprobs: log_softmax of the raw logits, top-k, gather and the
               rank count (`batched_count_greater_than`, torch.compile'd as in vLLM).
  penalties    greedy with repetition penalty 1.1 (frequency and presence 0, as ML.ENERGY's
               driver sends): the output tokens padded on the host and copied over, the prompt
               and output token counts and masks (model_executor/layers/utils.py
               `apply_penalties`), the repetition kernel (csrc/sampler.cu's, re-written in
               Triton with the same memory traffic: the two masks read, a logit read and
               rewritten where either is set), the frequency and presence subtractions.

Each (path, batch, vocab) row: `kernels` and `kernel_ms`, the GPU kernels (memsets included)
per call and their summed durations, read from a PyTorch profiler trace of PROFILED calls;
`copy_ms`, host-device copies per call; `wall_ms`, the wall-clock time of one eager call in a
loop of WALL calls synchronised at the end (the CPU's launches and syncs included). Prompts are
PROMPT_LEN tokens and outputs OUTPUT_LEN (penalties only). Rows are written as they are taken,
so a run stopped early keeps what it measured; OUT_DIR/sampler_env.json holds the device and
versions.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

BATCHES = [1, 8, 32, 64, 128, 256, 512, 1024]
VOCABS = [32000, 128256, 151936]  # Llama 2 / Mistral, Llama 3, Qwen 2.5
QUICK_BATCHES = [1, 128, 1024]
QUICK_VOCABS = [128256]
PATHS = ["greedy", "random", "top_p", "top_k", "top_k_top_p", "min_p", "logprobs", "penalties"]
WARMUP, WALL, PROFILED = 3, 10, 5
PROMPT_LEN, OUTPUT_LEN = 512, 128
TEMPERATURE, TOP_P, TOP_K, MIN_P, LOGPROBS, REPETITION = 0.7, 0.9, 50, 0.1, 5, 1.1
GPU_EVENTS = {"kernel", "gpu_memset"}
COPY_EVENTS = {"gpu_memcpy"}

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _repetition_kernel(logits, prompt_mask, output_mask, penalties, vocab, BLOCK: tl.constexpr):
        """csrc/sampler.cu apply_repetition_penalties_kernel: one program per sequence and
        vocabulary tile; a logit is read and rewritten only where a mask is set."""
        seq = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < vocab
        base = seq.to(tl.int64) * vocab
        seen = tl.load(prompt_mask + base + offs, mask=inside, other=0) | tl.load(
            output_mask + base + offs, mask=inside, other=0
        )
        hit = inside & (seen != 0)
        penalty = tl.load(penalties + seq)
        x = tl.load(logits + base + offs, mask=hit, other=0.0)
        tl.store(logits + base + offs, tl.where(x > 0, x / penalty, x * penalty), mask=hit)

    def repetition(
        logits: torch.Tensor, pm: torch.Tensor, om: torch.Tensor, p: torch.Tensor
    ) -> None:
        seqs, vocab = logits.shape
        assert pm.is_contiguous() and om.is_contiguous()
        block = 1024
        grid = (seqs, triton.cdiv(vocab, block))
        _repetition_kernel[grid](logits, pm.view(torch.uint8), om.view(torch.uint8), p, vocab,
                                 BLOCK=block)  # fmt: skip

    REPETITION_KERNEL = "triton"
except ImportError:  # vLLM's own fallback (vllm/_custom_ops.py apply_repetition_penalties_torch)

    def repetition(
        logits: torch.Tensor, pm: torch.Tensor, om: torch.Tensor, p: torch.Tensor
    ) -> None:
        penalties = torch.where(pm | om, p.unsqueeze(1).repeat(1, logits.size(1)), 1.0)
        logits *= torch.where(logits > 0, 1.0 / penalties, penalties)

    REPETITION_KERNEL = "torch"


def _count_greater(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return (x >= values).sum(-1)


try:  # vllm/v1/sample/ops/logprobs.py compiles it
    count_greater = torch.compile(_count_greater, dynamic=True)
    COUNT_COMPILED = True
except Exception:  # any compile problem: the eager ops
    count_greater = _count_greater
    COUNT_COMPILED = False


class Batch:
    """The tensors vLLM's SamplingMetadata holds for `batch` requests sampling alike."""

    def __init__(self, batch: int, vocab: int, device: str) -> None:
        gen = torch.Generator(device=device).manual_seed(batch * 7919 + vocab)
        self.logits = 3.0 * torch.randn(batch, vocab, device=device, generator=gen)
        self.logits = self.logits.to(torch.bfloat16)
        full = (batch,)
        self.temperature = torch.full(full, TEMPERATURE, device=device)
        self.top_p = torch.full(full, TOP_P, device=device)
        self.top_k = torch.full(full, TOP_K, device=device, dtype=torch.int32)
        self.min_p = torch.full((batch, 1), MIN_P, device=device)
        self.repetition = torch.full(full, REPETITION, device=device)
        self.frequency = torch.zeros(full, device=device)
        self.presence = torch.zeros(full, device=device)
        prompts = torch.randint(0, vocab, (batch, PROMPT_LEN), device=device, generator=gen)
        self.prompt_ids = prompts
        rng = np.random.default_rng(batch)
        self.output_ids = [rng.integers(0, vocab, OUTPUT_LEN).tolist() for _ in range(batch)]
        self.vocab = vocab
        self.device = device


def to_tokens(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1).view(-1)


def random_sample(logits: torch.Tensor) -> torch.Tensor:
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs)
    q.exponential_()
    return probs.div_(q).argmax(dim=-1).view(-1)


def top_k_top_p(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None
) -> torch.Tensor:
    """vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p (0.11.1)."""
    if p is None:
        assert k is not None
        no_top_k = k == logits.shape[1]
        k = k.masked_fill(no_top_k, 1)
        max_top_k = k.max()
        k_index = k.sub_(1).unsqueeze(1)
        top_k_mask = logits.topk(max_top_k, dim=1).values.gather(1, k_index.long())
        top_k_mask.masked_fill_(no_top_k.unsqueeze(1), -float("inf"))
        logits.masked_fill_(logits < top_k_mask, -float("inf"))
        return logits
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        top_k_mask = logits_sort.size(1) - k.to(torch.long)
        top_k_mask = logits_sort.gather(1, top_k_mask.unsqueeze(dim=1))
        logits_sort.masked_fill_(logits_sort < top_k_mask, -float("inf"))
    probs_sum = torch.cumsum(logits_sort.softmax(dim=-1), dim=-1)
    top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)
    top_p_mask[:, -1] = False
    logits_sort.masked_fill_(top_p_mask, -float("inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


def min_p(logits: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    probs = torch.nn.functional.softmax(logits, dim=-1)
    adjusted = torch.amax(probs, dim=-1, keepdim=True).mul_(value)
    logits[probs < adjusted] = -float("inf")
    return logits


def penalties(logits: torch.Tensor, b: Batch) -> torch.Tensor:
    """vllm/v1/sample/ops/penalties.py apply_all_penalties with apply_penalties."""
    rows = b.output_ids
    padded = np.full((len(rows), max(map(len, rows), default=0)), b.vocab, dtype=np.int64)
    for i, row in enumerate(rows):
        padded[i, : len(row)] = row
    output_t = torch.from_numpy(padded).pin_memory().to(b.device, non_blocking=True)
    output_t.masked_fill_(output_t == -1, b.vocab)
    seqs, vocab = logits.shape

    def counts(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bins = torch.zeros((seqs, vocab + 1), dtype=torch.long, device=tokens.device)
        bins.scatter_add_(1, tokens, torch.ones_like(tokens))
        bins = bins[:, :vocab]
        return bins, bins > 0

    _, prompt_mask = counts(b.prompt_ids)
    output_counts, output_mask = counts(output_t)
    repetition(logits, prompt_mask, output_mask, b.repetition)
    logits -= b.frequency.unsqueeze(dim=1) * output_counts
    logits -= b.presence.unsqueeze(dim=1) * output_mask
    return logits


def sampler(path: str, b: Batch) -> Callable[[], torch.Tensor]:
    """One call of vLLM's Sampler.forward for `path` (see the module doc)."""

    def call() -> torch.Tensor:
        raw = b.logits
        logprobs = raw.log_softmax(dim=-1, dtype=torch.float32) if path == "logprobs" else None
        logits = raw.to(torch.float32)
        if path == "penalties":
            logits = penalties(logits, b)
        if path in ("greedy", "logprobs", "penalties"):
            sampled = to_tokens(logits)
        else:
            logits = logits.div_(b.temperature.unsqueeze(dim=1))
            if path == "min_p":
                logits = min_p(logits, b.min_p)
            k = b.top_k if path in ("top_k", "top_k_top_p") else None
            p = b.top_p if path in ("top_p", "top_k_top_p") else None
            if k is not None or p is not None:
                logits = top_k_top_p(logits, k, p)
            sampled = random_sample(logits)
        sampled = sampled.long()
        if logprobs is not None:  # Sampler.gather_logprobs
            top_values, top_indices = torch.topk(logprobs, LOGPROBS, dim=-1)
            token_ids = sampled.unsqueeze(-1)
            token_logprobs = logprobs.gather(-1, token_ids)
            ranks = count_greater(logprobs, token_logprobs)
            torch.cat((token_ids, top_indices), dim=1).to(torch.int32)
            torch.cat((token_logprobs, top_values), dim=1)
            del ranks
        return sampled.to(torch.int32)

    return call


def profile(call: Callable[[], object], calls: int) -> tuple[float, float, float]:
    """Kernels per call, their GPU ms per call and copy ms per call, from a profiler trace."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    kernels = [e for e in events if e.get("cat") in GPU_EVENTS and "dur" in e]
    copies = [e for e in events if e.get("cat") in COPY_EVENTS and "dur" in e]
    us = sum(float(e["dur"]) for e in kernels)
    copy_us = sum(float(e["dur"]) for e in copies)
    return len(kernels) / calls, us / 1e3 / calls, copy_us / 1e3 / calls


def wall_ms(call: Callable[[], object], calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / calls


def environment() -> dict[str, object]:
    props = torch.cuda.get_device_properties(0)
    env: dict[str, object] = {
        "device": props.name,
        "multiprocessors": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "repetition_kernel": REPETITION_KERNEL,
        "count_greater_compiled": COUNT_COMPILED,
        "python": sys.version.split()[0],
        "params": {
            "temperature": TEMPERATURE,
            "top_p": TOP_P,
            "top_k": TOP_K,
            "min_p": MIN_P,
            "logprobs": LOGPROBS,
            "repetition_penalty": REPETITION,
            "prompt_len": PROMPT_LEN,
            "output_len": OUTPUT_LEN,
            "warmup": WARMUP,
            "wall_calls": WALL,
            "profiled_calls": PROFILED,
        },
    }
    try:
        env["triton"] = __import__("triton").__version__
        query = "driver_version,clocks.max.sm,clocks.max.mem,power.limit"
        env["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False,
        ).stdout.strip()  # fmt: skip
    except (ImportError, OSError, subprocess.SubprocessError):
        pass
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--paths", default=",".join(PATHS))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("measure_sampler.py: no CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sampler_env.json").write_text(json.dumps(environment(), indent=1) + "\n")
    deadline = time.monotonic() + args.budget_s
    batches = QUICK_BATCHES if args.quick else BATCHES
    vocabs = QUICK_VOCABS if args.quick else VOCABS
    paths = args.paths.split(",")
    with (args.out / "sampler.csv").open("w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["path", "batch", "vocab", "kernels", "kernel_ms", "copy_ms", "wall_ms"])
        for vocab in vocabs:
            for batch in batches:
                b = Batch(batch, vocab, "cuda")
                for path in paths:
                    if time.monotonic() > deadline:
                        print("budget spent; stopping", flush=True)
                        return 0
                    call = sampler(path, b)
                    try:
                        for _ in range(WARMUP):
                            call()
                        wall = wall_ms(call, WALL)
                        kernels, gpu, copy = profile(call, PROFILED)
                    except Exception as exc:  # one row fails, not the run
                        print(f"{path} {batch}x{vocab}: {type(exc).__name__}: {exc}", flush=True)
                        continue
                    rows.writerow([path, batch, vocab, f"{kernels:g}", f"{gpu:.5f}",
                                   f"{copy:.5f}", f"{wall:.5f}"])  # fmt: skip
                    f.flush()
                    print(f"{path:12s} {batch:5d} x {vocab:6d}: {kernels:5.1f} kernels "
                          f"{gpu:8.4f} ms GPU, {wall:8.4f} ms wall", flush=True)  # fmt: skip
                del b
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
