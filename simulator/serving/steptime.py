"""How long an engine step takes on one replica: the cost model plus the engine's overheads.

Decode-only steps dominate a serving run, so their times are tabulated once per replica: for
every batch size up to max_num_seqs and a log-spaced grid of mean KV lengths (vectorised, one
cost-model call), then interpolated linearly in the KV length (the only approximation here).
Steps with prefill chunks are costed exactly: the ops whose cost depends only on the step's
token count, or only on how many sequences sample, come from tables built once per replica;
the attention ops, which depend on the batch's shape, are costed for the step itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.ops import step_ops
from simulator.costmodel.roofline import evaluate
from simulator.costmodel.step import engine_step_time, engine_time, step_cost
from simulator.specs.deployment import Parallelism, Precision
from simulator.specs.engine import EngineSpec
from simulator.specs.hardware import HardwareSpec
from simulator.specs.model import ModelSpec

CONTEXT_GRID_POINTS = 48


class StepTimer:
    def __init__(
        self,
        *,
        model: ModelSpec,
        hw: HardwareSpec,
        layout: Parallelism,
        prec: Precision,
        engine: EngineSpec,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_context: int,
        enforce_eager: bool = False,
    ) -> None:
        self._args = (model, hw, layout, prec)
        self._engine = engine
        self._eager = enforce_eager
        self._window = model.attention.sliding_window
        self._ctx_grid = np.unique(
            np.round(np.geomspace(1, max(2, max_context), CONTEXT_GRID_POINTS))
        )
        n = np.arange(1, max_num_seqs + 1, dtype=float)
        seqs, ctx = np.meshgrid(n, self._ctx_grid, indexing="ij")
        self._decode = self._time(
            BatchShape.decode(batch_size=seqs.ravel(), context_len=ctx.ravel(), window=self._window)
        ).reshape(seqs.shape)
        max_tokens = max(max_num_batched_tokens, max_num_seqs)
        self._tok_gpu, self._tok_k = (
            t.tolist()
            for t in self._table(
                BatchShape(prefill_tokens=np.arange(max_tokens + 1, dtype=float)), "tokens"
            )
        )
        self._smp_gpu, self._smp_k = (
            t.tolist()
            for t in self._table(
                BatchShape(sampled=np.arange(max_num_seqs + 1, dtype=float)), "sampled"
            )
        )

    def _time(self, batch: BatchShape) -> np.ndarray:
        cost = step_cost(*self._args, batch, attention_factor=self._engine.attention_factor)
        num_seqs = np.asarray(batch.prefill_seqs) + np.asarray(batch.decode_seqs)
        return np.asarray(
            engine_step_time(
                cost,
                self._engine,
                num_tokens=batch.num_tokens,
                num_seqs=num_seqs,
                enforce_eager=self._eager,
            ),
            dtype=float,
        )

    def _table(self, batch: BatchShape, scales_with: str) -> tuple[np.ndarray, np.ndarray]:
        """(GPU seconds, kernel launches) of the ops that scale with `scales_with`, per element
        of the vectorised `batch`."""
        model, hw, layout, prec = self._args
        ops = [
            op
            for op in step_ops(
                model, layout, prec, batch, gpus_per_node=hw.interconnect.gpus_per_node
            )
            if op.scales_with == scales_with
        ]
        costs = evaluate(ops, hw, attention_factor=self._engine.attention_factor)
        size = np.broadcast_shapes(*(np.shape(getattr(batch, f)) for f in BatchShape.__slots__))
        gpu, kernels = np.zeros(size), np.zeros(size)
        for c in costs:
            gpu = gpu + c.total_s
            kernels = kernels + c.op.count * (c.time_s > 0)
        return gpu, kernels

    def decode_run(self, *, num_seqs: int, total_context: float, steps: int) -> np.ndarray:
        """Durations of `steps` consecutive decode steps of `num_seqs` sequences whose KV
        lengths sum to `total_context` in the first step (each step adds num_seqs)."""
        mean = (total_context + num_seqs * np.arange(steps, dtype=float)) / num_seqs
        row = self._decode[min(num_seqs, len(self._decode)) - 1]
        return np.interp(mean, self._ctx_grid, row)

    def mixed(
        self, *, chunks: Sequence[tuple[int, int, bool]], decode_contexts: Sequence[int]
    ) -> float:
        """Duration of one step with prefill `chunks` (tokens, offset, last) and decodes."""
        batch = BatchShape.mixed(
            chunks=chunks, decode_context_lens=decode_contexts, window=self._window
        )
        tokens, sampled = int(batch.num_tokens), int(batch.sampled)
        gpu, kernels = self._table(batch, "batch")
        gpu_s = float(np.ravel(gpu)[0]) + self._tok_gpu[tokens] + self._smp_gpu[sampled]
        launches = float(np.ravel(kernels)[0]) + self._tok_k[tokens] + self._smp_k[sampled]
        seqs = len(chunks) + len(decode_contexts)
        return float(
            engine_time(
                gpu_s,
                launches,
                self._engine,
                num_tokens=tokens,
                num_seqs=seqs,
                enforce_eager=self._eager,
            )
        )
