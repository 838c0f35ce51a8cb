"""One engine step's cost on a replica: the op list evaluated on a device, plus a breakdown.

With offloaded weights (`costmodel.offload`) the step also pays what streaming and expert misses
leave exposed; those appear in the breakdown as their own rows (kind "offload")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.nanobatch import class_times, nano_shape, overlapped_time
from simulator.costmodel.offload import ExtraCost, OffloadPlan
from simulator.costmodel.ops import sampler_pass_op, step_ops
from simulator.costmodel.roofline import OpCost, evaluate, total_launches, total_time
from simulator.specs.deployment import Parallelism, Precision
from simulator.specs.engine import EngineSpec, LogitsPass
from simulator.specs.hardware import HardwareSpec
from simulator.specs.model import ModelSpec


@dataclass(frozen=True, slots=True)
class StepCost:
    """Time of one step through every pipeline stage (`time_s`, including `extras`: offload
    costs that are not kernels) and its per-op breakdown. `overlapped`: the engine's
    nano-batches overlap its kernels (`costmodel.nanobatch`); the ops are the whole batch's,
    and the breakdown's `nano_batch_overlap` row (negative when it saves time) makes its lines
    add up to `time_s`."""

    costs: list[OpCost]
    time_s: np.ndarray
    extras: tuple[ExtraCost, ...] = ()
    overlapped: bool = False

    @property
    def seconds(self) -> float:
        """The step time as a float (the first element when vectorised)."""
        return float(np.ravel(self.time_s)[0])

    def breakdown(self, index: int = 0) -> pd.DataFrame:
        """One row per op: count, time per instance and in total, share, FLOPs, bytes, bound."""

        def element(x: object) -> Any:
            """Element `index` of a vectorised field (a scalar field is the same for all)."""
            arr = np.ravel(np.asarray(x))
            return arr[index] if arr.size > 1 else arr[0]

        def at(x: object) -> float:
            return float(element(np.asarray(x, dtype=float)))

        rows = []
        total = at(self.time_s) or 1.0
        for c in self.costs:
            t = at(c.time_s)
            if t == 0.0:
                continue
            rows.append(
                {
                    "op": c.op.name,
                    "kind": c.op.kind,
                    "count": c.op.count,
                    "time_s": t,
                    "total_s": t * c.op.count,
                    "share": t * c.op.count / total,
                    "flops": at(c.op.flops) * c.op.count,
                    "bytes": (at(c.op.bytes) + at(c.op.msg_bytes)) * c.op.count,
                    "bound": str(element(c.bound)),
                }
            )
        hidden = at(self.time_s) - sum(at(c.time_s) * c.op.count for c in self.costs)
        hidden -= sum(at(e.time_s) * e.count for e in self.extras)
        if self.overlapped and hidden != 0.0:  # nano-batching: what the overlap saves
            rows.append(
                {
                    "op": "nano_batch_overlap",
                    "kind": "overlap",
                    "count": 1,
                    "time_s": hidden,
                    "total_s": hidden,
                    "share": hidden / total,
                    "flops": 0.0,
                    "bytes": 0.0,
                    "bound": "overlap",
                }
            )
        for e in self.extras:
            t = at(e.time_s)
            rows.append(
                {
                    "op": e.name,
                    "kind": "offload",
                    "count": e.count,
                    "time_s": t,
                    "total_s": t * e.count,
                    "share": t * e.count / total,
                    "flops": 0.0,
                    "bytes": at(e.bytes) * e.count,
                    "bound": str(element(e.bound)),
                }
            )
        return pd.DataFrame(rows)


def step_cost(
    model: ModelSpec,
    hw: HardwareSpec,
    layout: Parallelism,
    prec: Precision,
    batch: BatchShape,
    *,
    engine: EngineSpec | None = None,
    offload: OffloadPlan | None = None,
    sampler: Mapping[str, LogitsPass] | None = None,
) -> StepCost:
    """GPU time of one step of `batch` on one replica as `engine`'s kernels run it (no engine
    CPU overheads; see `roofline.evaluate`), with what `offload` adds (streamed weights,
    expert misses) and the engine's `sampler` passes over the sampled sequences' logits (by
    name, as `serving.steptime.sampler_passes` gives them)."""
    ops = step_ops(model, layout, prec, batch, gpus_per_node=hw.interconnect.gpus_per_node)
    ops += [
        sampler_pass_op(name, work, batch.sampled, model.vocab_size)
        for name, work in (sampler or {}).items()
    ]
    costs = evaluate(ops, hw, engine)
    gpu = total_time(costs)
    if engine is not None and engine.overlap.nano_batches > 1:  # NanoFlow's overlap
        gpu = nano_batched_time(model, hw, layout, prec, batch, engine=engine, sampler=sampler)
    nano = engine is not None and engine.overlap.nano_batches > 1
    if offload is None:
        return StepCost(costs, gpu, overlapped=nano)
    extras = tuple(offload.extras(model, costs, batch.num_tokens))
    time = gpu + sum((e.time_s * e.count for e in extras), start=np.zeros(1))
    return StepCost(costs, time, extras, overlapped=nano)


def nano_batched_time(
    model: ModelSpec,
    hw: HardwareSpec,
    layout: Parallelism,
    prec: Precision,
    batch: BatchShape,
    *,
    engine: EngineSpec,
    sampler: Mapping[str, LogitsPass] | None = None,
) -> np.ndarray:
    """GPU seconds of a step of `batch` split into the engine's nano-batches, its compute,
    memory and network kernels overlapped (`costmodel.nanobatch`): each op priced at the
    nano-batch's shape, so a GEMM's efficiency is that of m / n rows."""
    n = engine.overlap.nano_batches
    nano = nano_shape(batch, n)
    ops = step_ops(model, layout, prec, nano, gpus_per_node=hw.interconnect.gpus_per_node)
    ops += [
        sampler_pass_op(name, work, nano.sampled, model.vocab_size)
        for name, work in (sampler or {}).items()
    ]
    parts = class_times(evaluate(ops, hw, engine))
    return overlapped_time(
        n * parts["compute"],
        n * parts["memory"],
        n * parts["network"],
        engine.overlap,
        layers=model.num_layers // layout.pp,
    )


def kernel_launches(step: StepCost) -> np.ndarray:
    """Kernels launched in the step (ops with work, times their repeat count)."""
    return total_launches(step.costs)


def engine_step_time(
    step: StepCost,
    engine: EngineSpec,
    *,
    num_tokens: np.ndarray | float,
    num_seqs: np.ndarray | float,
    enforce_eager: bool = False,
) -> np.ndarray:
    """Wall time of a step under a serving engine; see `engine_time`."""
    return engine_time(
        step.time_s,
        kernel_launches(step),
        engine,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        enforce_eager=enforce_eager,
    )


def engine_time(
    gpu_s: np.ndarray | float,
    kernels: np.ndarray | float,
    engine: EngineSpec,
    *,
    num_tokens: np.ndarray | float,
    num_seqs: np.ndarray | float,
    enforce_eager: bool = False,
    host_s: np.ndarray | float = 0.0,
) -> np.ndarray:
    """Wall time of a step of `gpu_s` GPU time and `kernels` kernel launches (`launch_time`):
    the CPU launches kernels asynchronously, so GPU time and launch time overlap and the longer
    one counts; the scheduler's per-step and per-sequence CPU work does not overlap (vLLM runs
    it between steps). With async scheduling (`EngineSpec.async_scheduling`) the next step's
    scheduling, input preparation and launches all run while the GPU computes this one: the
    longer of the two counts, the GPU's with the residual the engine still exposes per step.
    `host_s`: CPU work after the launches that the GPU waits for only where it outlasts the
    GPU time (the sampler's penalty bookkeeping), counted with the launches."""
    ov = engine.overhead
    launch = launch_time(kernels, engine, num_tokens=num_tokens, enforce_eager=enforce_eager)
    launch = launch + host_s
    cpu = ov.step_s + ov.per_seq_s * np.asarray(num_seqs)
    if engine.async_scheduling:
        return np.maximum(np.asarray(gpu_s) + (ov.async_residual_s or 0.0), launch + cpu)
    return np.maximum(gpu_s, launch) + cpu


def launch_time(
    kernels: np.ndarray | float,
    engine: EngineSpec,
    *,
    num_tokens: np.ndarray | float,
    enforce_eager: bool = False,
) -> np.ndarray:
    """CPU seconds to launch a step's `kernels`: one CUDA-graph replay when the engine captures
    graphs, `enforce_eager` is off and the step has at most `cuda_graph_max_tokens` tokens;
    otherwise every kernel's eager launch."""
    ov = engine.overhead
    graphed = (engine.cuda_graphs and not enforce_eager) & (
        np.asarray(num_tokens) <= engine.cuda_graph_max_tokens
    )
    return np.where(graphed, ov.graph_launch_s, np.asarray(kernels) * ov.launch_eager_s)


def engine_overhead_rows(
    step: StepCost,
    engine: EngineSpec,
    *,
    index: int,
    num_tokens: float,
    num_seqs: float,
    enforce_eager: bool,
) -> pd.DataFrame:
    """The engine's lines of step `index` of `step` (kind "engine", bound "cpu"), in the
    breakdown's columns: `cpu_step` (per-step CPU work), `cpu_per_seq` (per running sequence)
    and the kernel launches, `launch_graph` (one CUDA-graph replay) or `launch_eager` (one per
    kernel). The step takes max(GPU, launch) + CPU (`engine_time`), so the launch row's
    `hidden_s` is the part of its time under GPU work and each row adds total_s - hidden_s."""
    ov = engine.overhead

    def at(x: np.ndarray) -> float:
        arr = np.ravel(np.asarray(x, dtype=float))
        return float(arr[index] if arr.size > 1 else arr[0])

    small = num_tokens <= engine.cuda_graph_max_tokens
    graphed = engine.cuda_graphs and not enforce_eager and small
    if graphed:
        launch = ("launch_graph", 1.0, ov.graph_launch_s)
    else:
        launch = ("launch_eager", at(kernel_launches(step)), ov.launch_eager_s)
    rows = [("cpu_step", 1.0, ov.step_s), ("cpu_per_seq", num_seqs, ov.per_seq_s), launch]
    df = pd.DataFrame(
        [
            {"op": op, "kind": "engine", "count": n, "time_s": t, "total_s": n * t}
            for op, n, t in rows
        ]
    ).assign(flops=0.0, bytes=0.0, bound="cpu", hidden_s=0.0)
    last = df.index[-1]
    df.loc[last, "hidden_s"] = min(float(df.loc[last, "total_s"]), at(step.time_s))
    return df
