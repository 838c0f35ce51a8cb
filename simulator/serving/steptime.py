"""How long an engine step takes on one replica: the cost model plus the engine's overheads.

A serving run asks for hundreds of thousands of step times, so a replica's timer tabulates the
cost model once (vectorised) and answers each step with a few lookups:

- decode-only steps: a table over every batch size up to max_num_seqs and a log-spaced grid of
  mean KV lengths, interpolated linearly in the KV length;
- steps with prefill chunks, split the way the cost model splits them: the ops whose cost
  depends only on the step's token count, or only on how many sequences sample, are tabulated
  exactly over every count; the attention ops (and MLA's per-step projections) depend on the
  batch's shape, and are additive in its prefill part and its decode part. The decode part
  comes from a table over (sequences, mean KV length); the prefill part of a single chunk from a
  table over (chunk tokens, cached offset), interpolated log-linearly in both; steps with
  several chunks are costed exactly.

With speculative decoding (`verify_tokens` = 1 + k) each decoding sequence computes k + 1
query tokens at its context instead of one (`verify_shape`), and the target computes logits at
all of them; the decode part's table is over that shape instead, and `draft` adds the
drafter's passes to every step. `kernel_s` and `pass_s` price a step or a one-token pass
without the engine's per-step CPU work (a drafter's passes inside a target step).

How the requests sample (`sampling`) adds the engine's sampler work to the sampled ops'
table: the random draw, the top-p sort or the top-k, the min-p pass, the logprobs and the
penalties' kernels.
Penalties also add host work that grows with the sampling sequences' output tokens (`outputs`
of `mixed` and `decode_run`: their sum and the longest), which runs once the forward pass is
launched: it counts where it outlasts the GPU, as the launches do.

The interpolation is the only approximation; `tests/serving` bounds it against the exact cost.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Protocol

import numpy as np

from simulator.costmodel.batch import BatchShape, Num, attended_pairs
from simulator.costmodel.deployment import Deployment
from simulator.costmodel.nanobatch import (
    ResourceClass,
    class_times,
    nano_shape,
    overlapped_s,
    overlapped_time,
)
from simulator.costmodel.offload import OffloadPlan
from simulator.costmodel.ops import Op, batch_ops, eviction_ops, sampler_pass_op, step_ops
from simulator.costmodel.roofline import OpCost, evaluate, total_launches, total_time
from simulator.costmodel.step import engine_time
from simulator.specs.deployment import Parallelism, Precision
from simulator.specs.engine import EngineSpec, LogitsPass
from simulator.specs.hardware import HardwareSpec
from simulator.specs.model import MLAttention, ModelSpec
from simulator.specs.workload import SamplingSpec

CONTEXT_GRID_POINTS = 48
CHUNK_GRID_POINTS = 64
# Decode runs up to this many steps are timed in plain Python (`decode_run`): most runs are a
# few steps (an arrival or a finish ends them), where numpy's cost per call dominates.
SHORT_RUN_STEPS = 32


Chunks = Sequence[tuple[int, int, bool]]
# Extra seconds a step costs on top of the target's forward pass (a drafter's passes), given the
# step's prefill chunks and its decoding sequences' contexts.
DraftCost = Callable[[Chunks, Sequence[int]], float]


# (The protocols' defaults are values, not `...`: a compiled build evaluates them.)
class OpList(Protocol):
    """The kernels of one forward pass (`costmodel.ops.step_ops`, or a drafter's)."""

    def __call__(
        self,
        model: ModelSpec,
        layout: Parallelism,
        prec: Precision,
        batch: BatchShape,
        *,
        gpus_per_node: int = 8,
    ) -> list[Op]: ...


class Timer(Protocol):
    """What a replica asks of its step timer: `StepTimer`, or a test's simpler one."""

    @property
    def penalises(self) -> bool: ...

    @property
    def async_scheduling(self) -> bool: ...

    def mixed(
        self,
        *,
        chunks: Chunks,
        decode_contexts: Sequence[int],
        outputs: tuple[int, int] = (0, 0),
    ) -> float: ...

    def decode_run(
        self,
        *,
        num_seqs: int,
        total_context: float,
        steps: int,
        outputs: tuple[int, int] = (0, 0),
    ) -> np.ndarray: ...

    def decode_ends(
        self, *, start: float, num_seqs: int, total_context: float, steps: int
    ) -> list[float] | None: ...

    def cpu_s(self, num_seqs: int) -> float: ...

    def kernel_s(self, *, chunks: Chunks, decode_contexts: Sequence[int]) -> float: ...


def verify_floor(verify_s: np.ndarray, decode_s: np.ndarray) -> np.ndarray:
    """A verification step's time, at least the plain decode step's of the same sequences and
    context. The model prices a short query chunk over a long cache on the varlen prefill
    kernel and a one-token query on the decode kernel, each fitted to its own measurements
    (vLLM runs one kernel for both); for a few query tokens per sequence the two can disagree
    by a few microseconds a layer, which must not make verifying k + 1 tokens cheaper than
    decoding one."""
    return np.maximum(verify_s, decode_s)


def verify_shape(
    *, model: ModelSpec, num_seqs: Num, context: Num, tokens: int, logits: Num = 0.0
) -> BatchShape:
    """`num_seqs` sequences each computing `tokens` query tokens (its last sampled token and
    tokens - 1 proposals) on top of its cached KV; `context` is the KV length a plain decode of
    it would attend to (cached + 1), and `logits` how many rows the LM head computes.

    GQA/MHA: one causal chunk per sequence in the varlen kernel, which reads each sequence's
    KV once. MLA: vLLM runs such short queries on the absorbed (decode) path; they are priced
    as `tokens` decode queries per sequence, each attending to its prefix, which reads the
    latent cache once per query token: an upper bound on the traffic (FlashMLA reads it once
    per sequence). With tokens = 1 this is exactly `BatchShape.decode`."""
    window = model.attention.batch_window
    n = np.asarray(num_seqs, dtype=float)
    if tokens == 1:
        kv = np.minimum(np.asarray(context, dtype=float), window or np.inf)
        return BatchShape(decode_seqs=n, decode_kv_tokens=n * kv, sampled=np.asarray(logits))
    cached = np.minimum(np.asarray(context, dtype=float) - 1.0, window or np.inf)
    if isinstance(model.attention, MLAttention):
        per_seq = tokens * cached + tokens * (tokens + 1) / 2.0  # query i attends cached + i
        return BatchShape(
            decode_seqs=n * tokens, decode_kv_tokens=n * per_seq, sampled=np.asarray(logits)
        )
    return BatchShape(
        prefill_tokens=n * tokens,
        prefill_seqs=n,
        prefill_pairs=n * attended_pairs(tokens, cached, window),
        prefill_kv_tokens=n * np.minimum(cached + tokens, window or np.inf),
        sampled=np.asarray(logits),
    )


def verify_pricing(
    model: ModelSpec, layout: Parallelism, prec: Precision, verify: BatchShape
) -> tuple[Precision, list[Op]]:
    """The precision a verification batch (`verify_shape`) is priced at and the ops it adds.
    Under a KV token budget a verification is no prompt, though GQA prices it as prompt
    chunks: SnapKV's selection does not run on its tokens, and H2O scores the attention
    weights of every query it verifies (each over the KV it attends to: the chunks' pairs).
    MLA verifies as decode queries, which the budget's decode kernels already price."""
    if prec.kv_eviction is None or isinstance(model.attention, MLAttention):
        return prec, []
    queries = BatchShape(decode_seqs=verify.prefill_tokens, decode_kv_tokens=verify.prefill_pairs)
    scores = eviction_ops(model, layout.tp, prec, queries, "decode")
    return prec.model_copy(update={"kv_eviction": None}), scores


def _log_grid(top: float, points: int) -> np.ndarray:
    return np.unique(np.round(np.geomspace(1, max(2.0, top), points)))


def _interp(grid: list[float], values: list[float], x: float) -> float:
    """Linear interpolation on a sorted grid, clamped at the ends (scalar, no numpy)."""
    i = bisect_right(grid, x)
    if i == 0:
        return values[0]
    if i == len(grid):
        return values[-1]
    x0, x1 = grid[i - 1], grid[i]
    return values[i - 1] + (values[i] - values[i - 1]) * (x - x0) / (x1 - x0)


def sampler_passes(engine: EngineSpec, sampling: SamplingSpec) -> dict[str, LogitsPass]:
    """The engine's sampler passes over the logits that requests sampling as `sampling` run
    every step, beyond the forward pass's generic `sampler` op (the engine's own pick, then
    what the sampling adds), by name; a pass the engine does not price is left out."""
    passes = {
        "greedy_pick": engine.greedy_pick,
        "random_sample": engine.random_sample if sampling.samples_randomly else None,
        "top_p": engine.top_p if sampling.sorts else None,
        "top_k": engine.top_k if sampling.top_k_only else None,
        "min_p": engine.min_p if sampling.min_p_filters else None,
        "logprobs": engine.logprobs if sampling.returns_logprobs else None,
        "penalties": engine.penalties if sampling.penalises else None,
    }
    return {name: work for name, work in passes.items() if work is not None}


def logits_pass(
    name: str,
    work: LogitsPass,
    *,
    rows: np.ndarray,
    vocab: int,
    hw: HardwareSpec,
    engine: EngineSpec,
) -> tuple[np.ndarray, np.ndarray]:
    """(GPU seconds, launches) of a sampler's pass over the logits of each number of sampling
    sequences in `rows` (0 for none): memory-bound kernels of `work.bytes_per_logit` bytes per
    sequence and vocabulary entry."""
    costs = evaluate([sampler_pass_op(name, work, rows, vocab)], hw, engine)
    busy = rows > 0
    return np.where(busy, total_time(costs), 0.0), np.where(busy, total_launches(costs), 0.0)


class StepTimer:
    """Step times of one replica. `verify_tokens` (1 + k with speculative decoding) is what each
    decoding sequence computes per step, with logits at all of them (`verify_logits`, the target)
    or at the last only (a drafter's catch-up pass); `ops` is the forward pass's op list and
    `draft` adds a drafter's passes to every step (`mixed`).

    An engine with nano-batches (`EngineSpec.overlap`, NanoFlow) keeps one timer per resource
    class (`resource`: that class's kernels alone, priced at the nano-batch's shape times the
    nano-batches, `costmodel.nanobatch`); a step's GPU time is the three classes' times
    overlapped (`overlapped_s`). Offloaded weights' streaming is not overlapped."""

    def __init__(
        self,
        dep: Deployment,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_context: int,
        enforce_eager: bool = False,
        verify_tokens: int = 1,
        verify_logits: bool = True,
        ops: OpList = step_ops,
        draft: DraftCost | None = None,
        offload: OffloadPlan | None = None,
        sampling: SamplingSpec | None = None,
        resource: ResourceClass | None = None,
    ) -> None:
        self._dep = dep
        overlap = dep.engine.overlap
        self._only = resource
        self._nano = overlap.nano_batches if resource is not None else 1
        self._layers = dep.model.num_layers // dep.layout.pp
        self._classes: list[StepTimer] = []
        if resource is None and overlap.nano_batches > 1:
            self._classes = [
                StepTimer(
                    dep,
                    max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max_num_batched_tokens,
                    max_context=max_context,
                    enforce_eager=enforce_eager,
                    verify_tokens=verify_tokens,
                    verify_logits=verify_logits,
                    ops=ops,
                    sampling=sampling,
                    resource=cls,
                )
                for cls in ("compute", "memory", "network")
            ]
        if resource is not None:
            offload = None
        self._ops = ops
        self._engine = dep.engine
        self._eager = enforce_eager
        self._window = dep.model.attention.batch_window
        # a KV token budget caps what a decode attends to (H2O, StreamingLLM; not SnapKV)
        eviction = dep.precision.kv_eviction
        self._cap = math.inf if eviction is None else eviction.decode_cap
        self._q = verify_tokens
        self._logits = verify_tokens if verify_logits else 1
        self._draft = draft
        # Offloaded weights: expert misses join the token table; exposed streaming follows a
        # step's decoder-layer compute (a curve, the layers keeping a mid-size decode's shares).
        self._offload, self._stream = offload, None
        if offload is not None and offload.spec.streams_weights:
            ref = BatchShape.decode(
                batch_size=float(min(max_num_seqs, 32)),
                context_len=float(min(max_context, 1024)),
                window=self._window,
            )
            ref_ops = ops(
                dep.model,
                dep.layout,
                dep.precision,
                ref,
                gpus_per_node=dep.hardware.interconnect.gpus_per_node,
            )
            ref_costs = evaluate(ref_ops, dep.hardware, dep.engine)
            self._stream = offload.streaming_curve(dep.model, ref_costs)
        ov = dep.engine.overhead
        self._graphs = dep.engine.cuda_graphs and not enforce_eager
        self._graph_max = dep.engine.cuda_graph_max_tokens
        self._graph_s, self._eager_s = ov.graph_launch_s, ov.launch_eager_s
        self._step_s, self._per_seq_s = ov.step_s, ov.per_seq_s
        # async scheduling: the CPU work overlaps the GPU, this much stays exposed (None: off)
        self._async_s = (ov.async_residual_s or 0.0) if dep.engine.async_scheduling else None

        max_tokens = max(max_num_batched_tokens, max_num_seqs * verify_tokens)
        tok_gpu, tok_k = self._table(
            BatchShape(prefill_tokens=np.arange(max_tokens + 1, dtype=float)), "tokens"
        )
        smp_gpu, smp_k = self._table(
            BatchShape(sampled=np.arange(max_num_seqs * self._logits + 1, dtype=float)), "sampled"
        )
        sampling = sampling or SamplingSpec()
        rows = np.arange(len(smp_gpu), dtype=float)
        passes = sampler_passes(dep.engine, sampling)
        for name, work in passes.items():
            if resource not in (None, "memory"):  # the sampler's kernels are memory-bound
                break
            gpu_s, launches = logits_pass(
                name,
                work,
                rows=rows / self._nano,
                vocab=dep.model.vocab_size,
                hw=dep.hardware,
                engine=dep.engine,
            )
            smp_gpu, smp_k = smp_gpu + self._nano * gpu_s, smp_k + launches
        pen = dep.engine.penalties if "penalties" in passes else None
        # host seconds per output token and per padded element (None: no penalties priced)
        self._pen = None if pen is None else (pen.host_s_per_token, pen.host_s_per_padded)
        self._tok_gpu, self._tok_k = tok_gpu.tolist(), tok_k.tolist()
        self._smp_gpu, self._smp_k = smp_gpu.tolist(), smp_k.tolist()
        # The decode part of a step's shape-dependent ops: row = sequences (0 = none).
        ctx_grid = _log_grid(max_context, CONTEXT_GRID_POINTS)
        self._ctx_grid = ctx_grid
        self._ctx_list = ctx_grid.tolist()
        n = np.arange(1, max_num_seqs + 1, dtype=float)
        seqs, ctx = np.meshgrid(n, ctx_grid, indexing="ij")
        decode = BatchShape.decode(
            batch_size=seqs.ravel(), context_len=ctx.ravel(), window=self._window
        )
        gpu, kernels = (a.reshape(seqs.shape) for a in self._table(decode, "batch"))
        self._one_gpu = [[0.0] * len(self._ctx_list), *gpu.tolist()]
        self._one_k = [0.0, *kernels[:, 0].tolist()]
        self._dec_gpu, self._dec_k = self._one_gpu, self._one_k
        if verify_tokens > 1:  # decoding sequences verify proposals: their own table
            verify = verify_shape(
                model=dep.model, num_seqs=seqs.ravel(), context=ctx.ravel(), tokens=verify_tokens
            )
            v_gpu, v_k = (a.reshape(seqs.shape) for a in self._verify_table(verify))
            # A verification reads every KV token the plain decode of the same sequences reads,
            # and computes more: never cheaper than that decode (`verify_floor`).
            v_gpu = verify_floor(v_gpu, gpu)
            self._dec_gpu = [[0.0] * len(self._ctx_list), *v_gpu.tolist()]
            self._dec_k = [0.0, *v_k[:, 0].tolist()]
        # Decode-only steps, whole: n tokens, n sampled, and the decode part.
        rows = n.astype(int)
        if self._stream is not None:
            gpu = gpu + np.interp(gpu + tok_gpu[rows][:, None], *self._stream)
        dec_gpu = gpu + (tok_gpu[rows] + smp_gpu[rows])[:, None]
        dec_k = kernels + (tok_k[rows] + smp_k[rows])[:, None]
        self._dec_whole = dec_gpu
        if self._classes:  # nano-batched: the classes' decode steps, overlapped
            c, m, k = (t._dec_whole for t in self._classes)
            dec_gpu = overlapped_time(c, m, k, overlap, layers=self._layers)
        self._decode = np.asarray(
            engine_time(
                dec_gpu,
                dec_k,
                dep.engine,
                num_tokens=seqs,
                num_seqs=seqs,
                enforce_eager=enforce_eager,
            ),
            dtype=float,
        )
        # with penalties a run's steps add host work: their GPU time and launches, kept
        self._decode_parts = None if pen is None else (dec_gpu, dec_k[:, 0])
        self._decode_rows: dict[int, list[float]] = {}  # rows of `_decode` as floats, when used
        # The prefill part for one chunk, over log grids of its tokens and cached offset.
        chunk_grid = _log_grid(max_tokens, CHUNK_GRID_POINTS)
        offset_grid = np.concatenate(([0.0], ctx_grid))
        q, off = np.meshgrid(chunk_grid, offset_grid, indexing="ij")
        prefill = BatchShape.prefill(
            batch_size=1.0, prompt_len=q.ravel(), offset=off.ravel(), window=self._window
        )
        gpu, kernels = self._table(prefill, "batch")
        # Steps of several chunks and no decodes (`_chunks_part`): the decode ops' costs at no
        # decodes, once; the chunks' ops are costed per step (with `step_ops` only: a drafter's
        # op list is filtered whole, as in `_table`).
        self._no_decode: list[OpCost] | None = None
        if ops is step_ops and resource is None:
            no_decode = batch_ops(
                dep.model,
                dep.layout,
                dep.precision,
                BatchShape(),
                parts=("decode",),
                gpus_per_node=dep.hardware.interconnect.gpus_per_node,
            )
            self._no_decode = evaluate(no_decode, dep.hardware, dep.engine)
        self._pre_q = np.log(chunk_grid).tolist()
        self._pre_off = np.log1p(offset_grid).tolist()
        self._pre_log_gpu = np.log(np.maximum(gpu, 1e-12)).reshape(q.shape).tolist()
        self._pre_k = float(np.ravel(kernels)[0])

    # -- tables ---------------------------------------------------------------------------------
    def _verify_table(self, verify: BatchShape) -> tuple[np.ndarray, np.ndarray]:
        """`_table(verify, "batch")` of a verification batch, priced as `verify_pricing` says
        (its added ops at each nano-batch's shape)."""
        dep = self._dep
        prec, _ = verify_pricing(dep.model, dep.layout, dep.precision, verify)

        def added(b: BatchShape) -> list[Op]:
            return verify_pricing(dep.model, dep.layout, dep.precision, b)[1]

        return self._table(verify, "batch", precision=prec, extra=added)

    def _table(
        self,
        batch: BatchShape,
        scales_with: str,
        *,
        precision: Precision | None = None,
        extra: Callable[[BatchShape], list[Op]] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(GPU seconds, kernel launches) of the ops that scale with `scales_with`, per element
        of the vectorised `batch`; `precision` in place of the deployment's, and the `extra`
        ops of the batch (at its nano-batches' shape) added."""
        dep = self._dep
        prec = dep.precision if precision is None else precision
        size = np.broadcast_shapes(*(np.shape(getattr(batch, f)) for f in BatchShape.__slots__))
        batch = nano_shape(batch, self._nano)
        if scales_with == "batch" and self._ops is step_ops:  # those alone: the same ops
            ops = batch_ops(
                dep.model,
                dep.layout,
                prec,
                batch,
                gpus_per_node=dep.hardware.interconnect.gpus_per_node,
            )
        else:
            gpus_per_node = dep.hardware.interconnect.gpus_per_node
            ops = [
                op
                for op in self._ops(dep.model, dep.layout, prec, batch, gpus_per_node=gpus_per_node)
                if op.scales_with == scales_with
            ]
        if extra is not None:
            ops += extra(batch)
        costs = evaluate(ops, dep.hardware, self._engine)
        if self._only is not None:  # one class of a nano-batched step, over its nano-batches
            gpu = np.zeros(size) + self._nano * class_times(costs)[self._only]
            return gpu, np.zeros(size) + total_launches(costs)
        gpu, kernels = np.zeros(size) + total_time(costs), np.zeros(size) + total_launches(costs)
        if self._offload is not None and scales_with == "tokens":
            gpu = gpu + self._offload.expert_extra_s(dep.model, costs, batch.num_tokens)
        return gpu, kernels

    def _chunks_part(self, chunks: Chunks) -> tuple[float, float]:
        """`_table(BatchShape.mixed(chunks=chunks), "batch")` as floats, for several chunks: the
        same costs summed in the same order (the chunks' ops first, then the decode ops, whose
        cost at no decodes `__init__` kept), without building or evaluating the rest."""
        batch = BatchShape.mixed(chunks=chunks, window=self._window)
        if self._no_decode is None:
            gpu, kernels = self._table(batch, "batch")
        else:
            dep = self._dep
            ops = batch_ops(
                dep.model,
                dep.layout,
                dep.precision,
                batch,
                parts=("prefill",),
                gpus_per_node=dep.hardware.interconnect.gpus_per_node,
            )
            costs = evaluate(ops, dep.hardware, self._engine) + self._no_decode
            gpu, kernels = total_time(costs), total_launches(costs)
        return float(np.ravel(gpu)[0]), float(np.ravel(kernels)[0])

    # -- lookups --------------------------------------------------------------------------------
    @property
    def penalises(self) -> bool:
        """Whether steps price sampling penalties (`mixed` and `decode_run` take `outputs`)."""
        return self._pen is not None

    def decode_run(
        self,
        *,
        num_seqs: int,
        total_context: float,
        steps: int,
        outputs: tuple[int, int] = (0, 0),
    ) -> np.ndarray:
        """Durations of `steps` consecutive decode steps of `num_seqs` sequences whose KV
        lengths sum to `total_context` in the first step (each step adds num_seqs); `outputs`
        (their output tokens, summed and the longest, in the first step) prices penalties.
        One token per sequence per step: not for a timer whose decodes verify proposals."""
        if self._q > 1:
            raise RuntimeError("decode runs assume one token per step: no speculation")
        k = min(num_seqs, len(self._decode)) - 1
        if self._decode_parts is not None:
            return self._penalised_run(k, num_seqs, total_context, steps, outputs)
        if steps <= SHORT_RUN_STEPS:
            return np.array(self._short_run(k, num_seqs, total_context, steps))
        mean = (total_context + num_seqs * np.arange(steps, dtype=float)) / num_seqs
        return np.interp(np.minimum(mean, self._cap), self._ctx_grid, self._decode[k])

    def decode_ends(
        self, *, start: float, num_seqs: int, total_context: float, steps: int
    ) -> list[float] | None:
        """When each of `decode_run`'s steps (no penalties) ends, started at `start`: the same
        floats as `(start + np.cumsum(durations)).tolist()` (numpy's cumsum adds in order),
        summed in Python for a short run, where numpy's per-call work costs more than the
        sum. None for a long run or a timer that prices penalties (use `decode_run`)."""
        if steps > SHORT_RUN_STEPS or self._decode_parts is not None:
            return None
        if self._q > 1:
            raise RuntimeError("decode runs assume one token per step: no speculation")
        k = min(num_seqs, len(self._decode)) - 1
        return [start + t for t in accumulate(self._short_run(k, num_seqs, total_context, steps))]

    def _penalised_run(
        self, k: int, num_seqs: int, total_context: float, steps: int, outputs: tuple[int, int]
    ) -> np.ndarray:
        """`decode_run` with the penalties' host work, which grows by a token per sequence and
        step (`_host_s`)."""
        assert self._decode_parts is not None
        gpu, kernels = self._decode_parts
        i = np.arange(steps, dtype=float)
        mean = np.minimum((total_context + num_seqs * i) / num_seqs, self._cap)
        host = self._host_s(num_seqs, outputs[0] + num_seqs * i, outputs[1] + i)
        return np.asarray(
            engine_time(
                np.interp(mean, self._ctx_grid, gpu[k]),
                kernels[k],
                self._engine,
                num_tokens=num_seqs,
                num_seqs=num_seqs,
                enforce_eager=self._eager,
                host_s=host,
            ),
            dtype=float,
        )

    def _host_s(self, rows: Num, tokens: Num, longest: Num) -> Num:
        """Host seconds of the penalties of `rows` sampling sequences with `tokens` output
        tokens, the longest `longest`: each token copied, each element of the padded array
        (only where penalties are priced)."""
        assert self._pen is not None
        per_token, per_padded = self._pen
        return per_token * tokens + per_padded * rows * longest

    def _short_run(self, k: int, num_seqs: int, total_context: float, steps: int) -> list[float]:
        """`decode_run`'s durations (row `k` of the table) in plain Python, with np.interp's
        own operations (the slope between grid points times the distance from the lower one,
        plus its value): the same floats where numpy's build does not fuse that multiply-add,
        as x86-64 builds do not (else they differ by a rounding)."""
        row = self._decode_rows.get(k)
        if row is None:
            row = self._decode_rows[k] = self._decode[k].tolist()
        grid, top = self._ctx_list, len(self._ctx_list) - 1
        cap = self._cap
        durations: list[float] = []
        append = durations.append  # (locals: this runs for most decode segments)
        # the means grow with the step, so the grid interval is walked forward, not searched
        # (`j` is `bisect_right(grid, mean) - 1` throughout)
        j = bisect_right(grid, min(total_context / num_seqs, cap)) - 1
        for i in range(steps):
            mean = (total_context + num_seqs * i) / num_seqs
            if cap < mean:  # min(mean, cap)
                mean = cap
            while j < top and grid[j + 1] <= mean:
                j += 1
            if j < 0:
                append(row[0])
            elif j >= top:
                append(row[top])
            else:
                lo = grid[j]
                if lo == mean:
                    append(row[j])
                else:
                    below = row[j]
                    append((row[j + 1] - below) / (grid[j + 1] - lo) * (mean - lo) + below)
        return durations

    def _prefill_part(self, tokens: int, offset: int) -> float:
        """GPU seconds of the shape-dependent ops of one prefill chunk (bilinear in logs)."""
        qs, offs, table = self._pre_q, self._pre_off, self._pre_log_gpu
        x, y = math.log(tokens), math.log1p(offset)
        i = min(max(bisect_right(qs, x) - 1, 0), len(qs) - 2)
        j = min(max(bisect_right(offs, y) - 1, 0), len(offs) - 2)
        tx = min(max((x - qs[i]) / (qs[i + 1] - qs[i]), 0.0), 1.0)
        ty = min(max((y - offs[j]) / (offs[j + 1] - offs[j]), 0.0), 1.0)
        lo = table[i][j] + (table[i + 1][j] - table[i][j]) * tx
        hi = table[i][j + 1] + (table[i + 1][j + 1] - table[i][j + 1]) * tx
        return math.exp(lo + (hi - lo) * ty)

    def mixed(
        self,
        *,
        chunks: Chunks,
        decode_contexts: Sequence[int],
        outputs: tuple[int, int] = (0, 0),
    ) -> float:
        """Duration of one step with prefill `chunks` (tokens, offset, last) and decodes (each
        `verify_tokens` tokens; `decode_contexts` are their KV lengths as plain decodes),
        plus the drafter's passes if any; `outputs` (the decodes' output tokens, summed and
        the longest) prices penalties."""
        gpu_s, launches, tokens = self._parts(chunks, decode_contexts)
        seqs = len(chunks) + len(decode_contexts)
        host = float(self._host_s(seqs, outputs[0], outputs[1])) if self._pen else 0.0
        step = self._engine_time(gpu_s, launches, tokens, seqs, host)
        if self._draft is not None:
            step += self._draft(chunks, decode_contexts)
        return step

    def kernel_s(self, *, chunks: Chunks, decode_contexts: Sequence[int]) -> float:
        """The GPU part of `mixed` (GPU time or kernel launches, the longer) without the
        engine's per-step CPU work or a drafter: one forward pass inside another's step."""
        gpu_s, launches, tokens = self._parts(chunks, decode_contexts)
        return max(gpu_s, self._launch_s(launches, tokens))

    def pass_s(self, *, num_seqs: int, mean_context: float) -> float:
        """As `kernel_s` for `num_seqs` sequences decoding one token each at `mean_context`
        (a drafter's second and later passes), whatever `verify_tokens` is."""
        if num_seqs == 0:
            return 0.0
        gpu_s = self._pass_gpu(num_seqs, mean_context)
        if self._classes:
            c, m, k = (t._pass_gpu(num_seqs, mean_context) for t in self._classes)
            gpu_s = overlapped_s(c, m, k, self._engine.overlap, layers=self._layers)
        launches = self._tok_k[num_seqs] + self._smp_k[num_seqs] + self._one_k[num_seqs]
        return max(gpu_s, self._launch_s(launches, num_seqs))

    def _pass_gpu(self, num_seqs: int, mean_context: float) -> float:
        """GPU seconds of `pass_s`'s pass, this timer's ops alone."""
        gpu_s = self._tok_gpu[num_seqs] + self._smp_gpu[num_seqs]
        return gpu_s + _interp(self._ctx_list, self._one_gpu[num_seqs], mean_context)

    def _parts(self, chunks: Chunks, decode_contexts: Sequence[int]) -> tuple[float, float, int]:
        """(GPU seconds, kernel launches, tokens) of one step."""
        n_dec = len(decode_contexts)
        window = self._window
        ctx_sum = (
            sum(decode_contexts) if window is None else sum(min(c, window) for c in decode_contexts)
        )
        prefill_tokens = sum(c[0] for c in chunks)
        tokens = prefill_tokens + self._q * n_dec
        sampled = self._logits * n_dec + sum(1 for c in chunks if c[2])
        gpu_s = self._tok_gpu[tokens] + self._smp_gpu[sampled]
        launches = self._tok_k[tokens] + self._smp_k[sampled]
        if n_dec:
            gpu_s += _interp(self._ctx_list, self._dec_gpu[n_dec], ctx_sum / n_dec)
            launches += self._dec_k[n_dec]
        if len(chunks) == 1:
            gpu_s += self._prefill_part(chunks[0][0], chunks[0][1])
            launches += self._pre_k
        elif chunks:  # several chunks in one varlen kernel: cost that shape exactly
            chunks_gpu, chunks_k = self._chunks_part(chunks)
            gpu_s += chunks_gpu
            launches += chunks_k
        if self._classes:  # nano-batched: the classes' times overlapped
            c, m, k = (t._parts(chunks, decode_contexts)[0] for t in self._classes)
            gpu_s = overlapped_s(c, m, k, self._engine.overlap, layers=self._layers)
        if self._stream is not None:  # the sampled ops run outside the decoder layers
            gpu_s += _interp(*self._stream, gpu_s - self._smp_gpu[sampled])
        return gpu_s, launches, tokens

    @property
    def async_scheduling(self) -> bool:
        """Whether steps overlap the next step's CPU work with the GPU (`engine_time`)."""
        return self._async_s is not None

    def cpu_s(self, num_seqs: int) -> float:
        """The engine's scheduling CPU time of one step of `num_seqs` sequences (part of every
        step's duration; a multi-step block pays it once)."""
        return self._step_s + self._per_seq_s * num_seqs

    def _launch_s(self, launches: float, tokens: int) -> float:
        if self._graphs and tokens <= self._graph_max:
            return self._graph_s
        return launches * self._eager_s

    def _engine_time(
        self, gpu_s: float, launches: float, tokens: int, seqs: int, host_s: float = 0.0
    ) -> float:
        """`costmodel.step.engine_time` for one step, in plain floats."""
        launch_s = self._launch_s(launches, tokens) + host_s
        if self._async_s is not None:
            return max(gpu_s + self._async_s, launch_s + self.cpu_s(seqs))
        return max(gpu_s, launch_s) + self.cpu_s(seqs)
