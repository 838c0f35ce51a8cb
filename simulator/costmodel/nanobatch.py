"""Nano-batched step time: NanoFlow's intra-device overlap (Zhu et al., "NanoFlow: Towards
Optimal Large Language Model Serving Throughput", arXiv 2408.12757).

An engine with `overlap.nano_batches` = n > 1 splits each step's batch into n nano-batches
and runs the kernels of different resource classes concurrently on partitioned SMs:

- compute: GEMMs and prefill attention;
- memory: decode attention, the elementwise and sampler kernels;
- network: the collectives.

Every op is priced at the nano-batch's shape (`nano_shape`: a GEMM's m is the step's m / n,
so the GEMM efficiency curve applies per nano-batch, and each nano-batch re-reads the
weights) and its time counted n times: C, M and N are the three classes' sums over the
nano-batches. The classes that overlap (`overlap.compute_memory`, `overlap.compute_network`)
form a pipeline: its time is the longest class, each stretched by the interference penalty
(`interference`, costmodel/nanobatch.yaml), plus the pipeline fill, one nano-batch's share
of one layer's other classes (the nano-batches flow through the layers without draining
between them); a class that does not overlap runs after it, in series. The step is never
slower than the nano-batches run one after another (C + M + N, the engine's choice were the
overlap to lose), and never faster than max(C, M, N), the nano-batched work's own resource
bound. With one nano-batch nothing changes: the step is the sequential sum of today's costs.

Not modelled: NanoFlow's unequal, per-operation nano-batch sizes (efeslab/Nanoflow's
LLaMA-2-70B config splits the 2048-token dense batch 640 / 1408 for the GEMMs and finer for
attention; the paper's Fig. 6 draws 768 / 1280), its search of SM shares, and its
asynchronous CPU scheduling (the engine profile's own CPU overheads apply).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from simulator.costmodel.batch import BatchShape
from simulator.costmodel.ops import Op
from simulator.costmodel.roofline import OpCost
from simulator.specs.engine import OverlapSpec

ResourceClass = Literal["compute", "memory", "network"]
CLASSES: tuple[ResourceClass, ...] = ("compute", "memory", "network")


def op_class(op: Op) -> ResourceClass:
    """The resource class an op's kernel occupies while it runs."""
    if op.kind == "collective":
        return "network"
    if op.kind in ("gemm", "attention_prefill"):
        return "compute"
    return "memory"


def class_times(costs: Sequence[OpCost]) -> dict[ResourceClass, np.ndarray]:
    """Seconds of each class in `costs` (count x time of its ops)."""
    out: dict[ResourceClass, np.ndarray] = {c: np.zeros(1) for c in CLASSES}
    for c in costs:
        cls = op_class(c.op)
        out[cls] = out[cls] + c.total_s
    return out


def nano_shape(batch: BatchShape, nano_batches: int) -> BatchShape:
    """One of `nano_batches` equal nano-batches of `batch`: every count over n, but a prefill
    chunk split across nano-batches stays one sequence in each (its tokens, pairs and KV
    follow the share it keeps)."""
    n = float(nano_batches)
    if n == 1.0:
        return batch
    pre = np.asarray(batch.prefill_seqs, dtype=float)
    pre_nano = np.maximum(pre / n, np.minimum(pre, 1.0))
    kv_share = np.divide(pre_nano, pre, out=np.zeros_like(pre_nano), where=pre > 0)
    return dataclasses.replace(
        batch,
        prefill_tokens=np.asarray(batch.prefill_tokens, dtype=float) / n,
        prefill_seqs=pre_nano,
        prefill_pairs=np.asarray(batch.prefill_pairs, dtype=float) / n,
        prefill_kv_tokens=np.asarray(batch.prefill_kv_tokens, dtype=float) * kv_share,
        decode_seqs=np.asarray(batch.decode_seqs, dtype=float) / n,
        decode_kv_tokens=np.asarray(batch.decode_kv_tokens, dtype=float) / n,
        sampled=np.asarray(batch.sampled, dtype=float) / n,
    )


def overlapped_time(
    compute: np.ndarray | float,
    memory: np.ndarray | float,
    network: np.ndarray | float,
    overlap: OverlapSpec,
    *,
    layers: int,
) -> np.ndarray:
    """A step's GPU seconds from its classes' sums over the nano-batches (see the module):
    the overlapping classes' pipeline, max of each class x (1 + interference) plus the fill
    (the rest over nano-batches x layers), then the classes that do not overlap in series;
    at most compute + memory + network. With one nano-batch: that sum."""
    c, m, k = (np.asarray(x, dtype=float) for x in (compute, memory, network))
    serial = c + m + k
    if overlap.nano_batches <= 1:
        return serial
    together = [c]
    apart = np.zeros_like(serial)
    for on, part in ((overlap.compute_memory, m), (overlap.compute_network, k)):
        if on:
            together.append(part)
        else:
            apart = apart + part
    if len(together) == 1:
        return serial
    stretched = np.stack(np.broadcast_arrays(*together)) * (1.0 + overlap.interference)
    longest = stretched.max(axis=0)
    fill = (stretched.sum(axis=0) - longest) / (overlap.nano_batches * max(1, layers))
    return np.minimum(longest + fill + apart, serial)


def interference() -> float:
    """The sourced slowdown of overlapped kernels (`costmodel/nanobatch.yaml`), what
    `--nano-batches` sets on a profile that has none of its own."""
    import yaml

    text = (Path(__file__).parent / "nanobatch.yaml").read_text()
    return float(yaml.safe_load(text)["interference"])


def overlapped_s(
    compute: float, memory: float, network: float, overlap: OverlapSpec, *, layers: int
) -> float:
    """`overlapped_time` for one step in plain floats (a serving run asks for many)."""
    serial = compute + memory + network
    if overlap.nano_batches <= 1:
        return serial
    together, apart = [compute], 0.0
    for on, part in ((overlap.compute_memory, memory), (overlap.compute_network, network)):
        if on:
            together.append(part)
        else:
            apart += part
    if len(together) == 1:
        return serial
    scale = 1.0 + overlap.interference
    longest, total = max(together) * scale, sum(together) * scale
    fill = (total - longest) / (overlap.nano_batches * max(1, layers))
    return min(longest + fill + apart, serial)
