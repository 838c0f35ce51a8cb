"""Analytical bounds for one layout, from the same step-time tables the simulator uses.

- Latency floors: what each request would see with the replica to itself. Its TTFT is at
  least its prefill run alone (in chunks of max_num_batched_tokens); every later token takes
  at least one decode step, and a step holding this request (KV length c) holds at least c KV
  tokens in all, so it lasts at least min over batch sizes b of the decode step of b sequences
  of mean length c/b. Percentiles of floors bound percentiles of the simulation's latencies
  from below (order statistics keep a pointwise order), so a layout whose floors already miss
  an SLO is hopeless at any rate.
- Capacity ceiling: requests/s no run can sustain. A step of t tokens takes at least the GPU
  time of its token-proportional ops (GEMMs, norms, activations) for t tokens plus the
  engine's per-step overhead; a step with b decodes takes at least the decode step of b
  sequences of length 1; batches hold at most max_num_seqs sequences and what the KV cache
  fits. Dividing the work of a request by the cheapest rate of each gives the ceiling.

Premises, the cost model's (tests/costmodel checks them): a step never gets faster when it
carries more tokens, more sequences or longer contexts, and splitting a prefill over more
steps never finishes it sooner. The step-time tables interpolate, so the simulator can sit a
little below a floor; the planner prunes only past a margin (`search.prescreen_margin`).
Not modelled here: prefix caching (no prompt is assumed cached), speculative decoding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.deployment import Deployment
from simulator.costmodel.memory import MemoryPlan
from simulator.costmodel.ops import step_ops
from simulator.costmodel.roofline import evaluate, total_time
from simulator.planning.spec import PlanSLO
from simulator.serving.steptime import StepTimer
from simulator.specs.serving import SchedulerSpec

FLOOR_CONTEXT_POINTS = 32  # log grid of KV lengths on which the decode floor is tabulated
TOKEN_GRID_POINTS = 200  # log grid of step sizes for the cheapest prefill token


@dataclass(frozen=True)
class LatencyFloors:
    """Per-request lower bounds in seconds, in the order of the requests given, and the floor of
    any inter-token latency. `tpot_s` is 0 for single-token outputs (vLLM's goodput)."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2el_s: np.ndarray
    itl_s: float
    output_len: np.ndarray

    def values(self, metric: str) -> np.ndarray:
        """The floors the simulator's percentile of `metric` is taken over (TPOT: only
        requests with more than one output token, as vLLM reports it)."""
        match metric:
            case "ttft":
                return self.ttft_s
            case "tpot":
                return self.tpot_s[self.output_len > 1]
            case "e2el":
                return self.e2el_s
            case "itl":
                return np.array([self.itl_s])
            case _:
                raise ValueError(f"unknown metric {metric!r}")


def prefill_chunks(prompt_len: int, chunk_tokens: int) -> list[tuple[int, int, bool]]:
    """A prompt's prefill alone: (tokens, cached offset, is last chunk) per step."""
    starts = range(0, prompt_len, chunk_tokens)
    return [(min(chunk_tokens, prompt_len - s), s, s + chunk_tokens >= prompt_len) for s in starts]


def decode_floor(timer: StepTimer, *, max_num_seqs: int, contexts: np.ndarray) -> np.ndarray:
    """For each KV length c: min over b <= max_num_seqs of the decode step of b sequences whose
    KV lengths sum to c (mean c / b, at least 1): the shortest step that can hold a sequence of
    length c."""
    out = np.empty(len(contexts))
    for i, c in enumerate(contexts):
        out[i] = min(
            float(timer.decode_run(num_seqs=b, total_context=max(float(c), b), steps=1)[0])
            for b in range(1, max_num_seqs + 1)
        )
    return out


def latency_floors(
    timer: StepTimer,
    *,
    prompt_len: np.ndarray,
    output_len: np.ndarray,
    scheduler: SchedulerSpec,
) -> LatencyFloors:
    """Floors of TTFT, TPOT and E2EL for each request, and of ITL (see the module doc)."""
    chunk = scheduler.max_num_batched_tokens if scheduler.chunked_prefill else 2**62
    ttft_of = {
        int(p): sum(
            timer.mixed(chunks=[c], decode_contexts=[]) for c in prefill_chunks(int(p), chunk)
        )
        for p in np.unique(prompt_len)
    }
    ttft = np.array([ttft_of[int(p)] for p in prompt_len])
    # The decode floor is non-decreasing in the KV length: take it at the grid point below.
    top = float(np.max(prompt_len + output_len))
    grid = np.unique(np.round(np.geomspace(1.0, max(top, 2.0), FLOOR_CONTEXT_POINTS)))
    floor = decode_floor(timer, max_num_seqs=scheduler.max_num_seqs, contexts=grid)
    below = np.searchsorted(grid, prompt_len + 1, side="right") - 1
    tpot = np.where(output_len > 1, floor[below], 0.0)
    e2el = ttft + np.maximum(output_len - 1, 0) * tpot
    return LatencyFloors(ttft, tpot, e2el, float(floor[0]), np.asarray(output_len))


def hopeless(
    floors: LatencyFloors, slo: PlanSLO, *, margin: float, scale: Mapping[str, float] | None = None
) -> str | None:
    """Why no rate can meet `slo` (a floor past a target by more than `margin`), or None.
    `scale`: each metric's floors multiplied by it first (a plan's band margin, `judge`)."""
    factor = dict(scale or {})
    for metric, target in slo.targets().items():
        values = floors.values(metric) * factor.get(metric, 1.0)
        if values.size == 0:
            continue
        floor_ms = float(np.percentile(values, target.p)) * 1000.0
        if floor_ms > target.max * (1.0 + margin):
            edge = " at the edge of its error band" if factor.get(metric, 1.0) != 1.0 else ""
            return (
                f"p{target.p:g} {metric.upper()} is at least {floor_ms:.1f} ms with each request "
                f"alone on the replica{edge} (SLO {target.max:g} ms)"
            )
    if slo.goodput is not None:
        good = np.ones(floors.ttft_s.shape, dtype=bool)
        per_request = {"ttft": floors.ttft_s, "tpot": floors.tpot_s, "e2el": floors.e2el_s}
        for metric, limit in slo.thresholds_ms().items():
            values = per_request[metric] * factor.get(metric, 1.0)
            good &= values * 1000.0 <= limit * (1.0 + margin)
        share = float(good.mean())
        if share < slo.goodput:
            return (
                f"at most {share:.1%} of requests can meet the per-request SLOs even alone "
                f"(goodput target {slo.goodput:.0%})"
            )
    return None


def token_ops_time(dep: Deployment, *, tokens: np.ndarray) -> np.ndarray:
    """GPU seconds of the ops whose cost depends only on a step's token count, per element."""
    model, hw = dep.model, dep.hardware
    batch = BatchShape(prefill_tokens=tokens)
    ops = step_ops(
        model, dep.layout, dep.precision, batch, gpus_per_node=hw.interconnect.gpus_per_node
    )
    tokens_only = [op for op in ops if op.scales_with == "tokens"]
    costs = evaluate(tokens_only, hw, dep.engine)
    return np.broadcast_to(np.asarray(total_time(costs), dtype=float), np.shape(tokens)).copy()


def capacity_ceiling(
    dep: Deployment,
    timer: StepTimer,
    memory: MemoryPlan,
    *,
    prompt_len: np.ndarray,
    output_len: np.ndarray,
    scheduler: SchedulerSpec,
    phase: Literal["both", "prefill", "decode"] = "both",
) -> float:
    """Requests/s one replica cannot exceed on this workload (see the module doc); `phase`:
    the work of a disaggregated pool's replica (prefill: the prompt and the first token;
    decode: the later tokens)."""
    mean_prompt = float(np.mean(prompt_len)) if phase != "decode" else 0.0
    mean_decodes = float(np.mean(np.maximum(output_len - 1, 0))) if phase != "prefill" else 0.0
    # Cheapest token: GPU time of the token-proportional ops of a step of c tokens plus the
    # per-step overhead, over c; between grid points c_k <= c <= c_k+1, at least
    # time(c_k) / c_k+1 (time grows with c).
    most = max(scheduler.max_num_batched_tokens, scheduler.max_num_seqs)
    sizes = np.unique(np.round(np.geomspace(1.0, most, TOKEN_GRID_POINTS)))
    gpu = token_ops_time(dep, tokens=sizes)
    step_s = dep.engine.overhead.step_s
    per_token = (gpu[:-1] + step_s) / sizes[1:]
    token_s = float(min(per_token.min(), (gpu[-1] + step_s) / sizes[-1]))
    # Cheapest decode: a step of b decodes of one token of context each, over b.
    blocks_each = -(-(int(np.min(prompt_len)) + 1) // memory.block_size)
    batch = max(1, min(scheduler.max_num_seqs, memory.kv_capacity_blocks // blocks_each))
    decode_s = min(
        float(timer.decode_run(num_seqs=b, total_context=float(b), steps=1)[0]) / b
        for b in range(1, batch + 1)
    )
    busy_s = max((mean_prompt + mean_decodes) * token_s, mean_decodes * decode_s)
    return math.inf if busy_s <= 0 else 1.0 / busy_s
