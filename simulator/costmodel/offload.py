"""Weight streaming and MoE expert offload: the GPU memory they free and the time they add.

Link. Offloaded weights come from host DRAM (or NVMe) over the GPU's host link at
min(source bandwidth, PCIe x host_link_fraction), all per GPU from the hardware spec's `host:`
section; each device of a TP/PP group streams its own share over its own link.

Which layers stream. With `cpu_offload_gb` = B GiB, each device streams the fewest of its stage's
decoder layers that hold B, spread evenly over the stage (the last layer of each of S equal
groups, as vLLM's prefetch offloader groups them), with the B bytes shared evenly among them;
with `resident_layers` = R the other L - R layers stream whole. Embeddings and the LM head stay.

Schedule of one step on one stage (layer l computes for c_l, its streamed bytes take x_l):
- `prefetch` (double buffering): loads run in layer order on a copy engine into two staging
  buffers; a load starts when the previous load is done and its buffer is free (the streamed
  layer two back has computed); layer l computes once layer l-1 is done and its load is in.
  A load overlaps the compute before it, so streamed layers cost max(c_l, x_l) in steady state
  and the first streamed layer's load is exposed less the resident layers in front of it. All
  L layers streamed, equal c and x: time = x + (L - 1) max(c, x) + c.
- `uva` (zero copy): the layer's kernels read its streamed weights over the link as they run:
  each layer takes max(c_l, x_l); no staging buffers (optimistic: the layer's other kernels are
  assumed to overlap the reads).
- `sync`: a blocking copy before each streamed layer: c_l + x_l; one staging buffer.
The step is the stages one after another (as the operator list walks every layer), the
streaming's exposed time is the schedule less the layers' compute. Experts fetched by the expert
cache (`expert_cache`) are on their layer's critical path, so they add to that layer's c_l.

GPU memory: the offloaded bytes leave the device; staging buffers (two layers' streamed bytes
for prefetch, one for sync, one layer's worst-case expert fetch) are added. Host memory must hold
what each device offloads (plus swap space) unless the source is NVMe.

Not modelled: PCIe switches or CPU sockets shared by several GPUs beyond the spec's per-GPU
host figures, pinned-memory registration, prefetch of the next step's first layers during the
current step's tail (the first load of a step is exposed), NVMe capacity, GPUDirect Storage.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from typing_extensions import assert_never

from simulator.costmodel.batch import Num
from simulator.costmodel.expert_cache import ExpertCache, build_expert_cache
from simulator.costmodel.roofline import OpCost
from simulator.errors import SpecError
from simulator.specs.deployment import Parallelism, Precision
from simulator.specs.hardware import HardwareSpec
from simulator.specs.model import ModelSpec
from simulator.specs.offload import OffloadSource, OffloadSpec, Transfer
from simulator.units import GiB

LINK_BOUND: dict[str, str] = {"host": "pcie", "nvme": "nvme"}
MOE_OPS = ("router", "topk_softmax")  # moe_align, moe_sum: by their prefix
MOE_PREFIXES = ("expert_", "shared_", "moe_")
DENSE_MLP_OPS = ("up_proj", "act", "down_proj")
CURVE_POINTS = 161  # log grid of a step's layer compute, for the serving simulator's tables


@dataclass(frozen=True, slots=True)
class ExtraCost:
    """A cost of the step that is not a kernel: `count` instances of `time_s` seconds each,
    moving `bytes` each, bound by `bound` (pcie, nvme, cpu; per step when an array)."""

    name: str
    count: float
    time_s: np.ndarray
    bytes: np.ndarray
    bound: str | np.ndarray


def link_bandwidth(hw: HardwareSpec, source: OffloadSource) -> float:
    """Bytes/s one GPU streams offloaded weights at: min(source, PCIe x host_link_fraction)."""
    pcie = hw.host.pcie_bw_bytes_per_s * hw.efficiency.host_link_fraction
    src = hw.host.memory_bw_bytes_per_s if source == "host" else hw.host.nvme_bw_bytes_per_s
    return float(min(pcie, src))


def spread_positions(num_layers: int, streamed: int) -> np.ndarray:
    """The last layer of each of `streamed` equal groups of `num_layers` layers."""
    i = np.arange(1, streamed + 1)
    return np.asarray((i * num_layers) // streamed - 1, dtype=int)


def streamed_layer_bytes(
    layer_bytes: np.ndarray, *, offload_bytes: float, resident_layers: int | None
) -> np.ndarray:
    """Bytes each of one stage's layers streams per step (0 for resident layers)."""
    n = len(layer_bytes)
    out = np.zeros(n)
    if resident_layers is not None:
        pos = spread_positions(n, max(0, n - resident_layers))
        out[pos] = layer_bytes[pos]
        return out
    target = min(offload_bytes, float(layer_bytes.sum()))
    if target <= 0:
        return out
    count = 1
    while layer_bytes[spread_positions(n, count)].sum() < target:
        count += 1
    pos = spread_positions(n, count)
    out[pos] = layer_bytes[pos] * target / layer_bytes[pos].sum()
    return out


def _prefetch_time(compute: np.ndarray, load_s: np.ndarray) -> np.ndarray:
    t = np.zeros(compute.shape[1:])
    copy_done = np.zeros_like(t)
    computed: list[np.ndarray] = []  # when each streamed layer so far finished computing
    for c, x in zip(compute, load_s, strict=True):
        if x > 0:
            buffer_free = computed[-2] if len(computed) >= 2 else 0.0
            copy_done = np.maximum(copy_done, buffer_free) + x
            t = np.maximum(t, copy_done)
        t = t + c
        if x > 0:
            computed.append(t)
    return t


def stage_time(compute: np.ndarray, load_s: np.ndarray, transfer: Transfer) -> np.ndarray:
    """Time of one stage's layers: `compute` (layers x steps) seconds, `load_s` per layer."""
    match transfer:
        case "prefetch":
            return _prefetch_time(compute, load_s)
        case "uva":
            column = load_s.reshape(-1, *([1] * (compute.ndim - 1)))
            return np.asarray(np.maximum(compute, column).sum(axis=0))
        case "sync":
            return np.asarray(compute.sum(axis=0) + load_s.sum())
        case _:
            assert_never(transfer)


@dataclass(frozen=True)
class LayerTimes:
    """A step's GPU seconds per decoder layer (layers x steps), and per MoE layer the time of
    its routed-expert and shared-expert kernels."""

    per_layer: np.ndarray
    expert_s: np.ndarray
    shared_s: np.ndarray


def layer_times(costs: list[OpCost], model: ModelSpec) -> LayerTimes:
    """Split a step's op costs over its decoder layers; ops outside the layers (embedding, LM
    head, sampler, pipeline sends) and one-off instances are left out."""
    n, moe = model.num_layers, model.moe is not None
    first = model.num_dense_layers if moe else n
    shape = np.broadcast_shapes((1,), *(np.shape(c.time_s) for c in costs))
    per_layer = np.zeros((n, *shape))
    expert, shared = np.zeros(shape), np.zeros(shape)
    for c in costs:
        name, count, t = c.op.name, c.op.count, np.broadcast_to(c.time_s, shape)
        if moe and (name in MOE_OPS or name.startswith(MOE_PREFIXES)):
            per_layer[first:] += t * count / model.num_moe_layers
            if name.startswith("expert_"):
                expert = expert + t
            elif name.startswith("shared_"):
                shared = shared + t
        elif moe and name in DENSE_MLP_OPS:
            per_layer[:first] += t * count / max(1, first)
        elif count >= n:
            per_layer += t * (count // n)
    return LayerTimes(per_layer, expert, shared)


@dataclass(frozen=True)
class OffloadPlan:
    """What each device of a deployment offloads and streams. Per-layer arrays run over all
    layers in model order, each on its stage's device; byte totals are the busiest device's."""

    spec: OffloadSpec
    link_bytes_per_s: float
    stage_bounds: tuple[int, ...]
    streamed_bytes: np.ndarray
    offloaded_layer_bytes: np.ndarray
    staging_bytes: float
    host_bytes: float
    experts: ExpertCache | None

    @property
    def load_s(self) -> np.ndarray:
        return self.streamed_bytes / self.link_bytes_per_s

    @property
    def link_bound(self) -> str:
        return LINK_BOUND[self.spec.source]

    def stream_time(self, compute: np.ndarray) -> np.ndarray:
        """Time of all decoder layers through every stage, with streaming, given their compute
        (layers x steps)."""
        b, load = self.stage_bounds, self.load_s
        return sum(
            (stage_time(compute[lo:hi], load[lo:hi], self.spec.transfer) for lo, hi in pairwise(b)),
            start=np.zeros(compute.shape[1:]),
        )

    def extras(self, model: ModelSpec, costs: list[OpCost], tokens: Num) -> list[ExtraCost]:
        """The step's offload costs: expert misses (per MoE layer) and exposed streaming."""
        times = layer_times(costs, model)
        compute, out = times.per_layer, []
        if self.experts is not None:
            cache = self.experts
            per_layer, on_cpu = cache.layer_extra_s(
                tokens, expert_gpu_s=times.expert_s, shared_gpu_s=times.shared_s
            )
            compute = compute + np.where(
                (np.arange(model.num_layers) >= model.num_dense_layers).reshape(
                    -1, *([1] * (compute.ndim - 1))
                ),
                per_layer,
                0.0,
            )
            moved = np.where(on_cpu, 0.0, cache.misses(tokens) * cache.expert_bytes)
            bound = np.where(on_cpu, "cpu", self.link_bound)
            out.append(
                ExtraCost("uncached experts", float(cache.num_layers), per_layer, moved, bound)
            )
        if self.spec.streams_weights:
            exposed = self.stream_time(compute) - compute.sum(axis=0)
            moved = np.asarray(self.streamed_bytes.sum())
            out.append(
                ExtraCost("weight streaming (exposed)", 1.0, exposed, moved, self.link_bound)
            )
        return out

    def expert_extra_s(self, model: ModelSpec, costs: list[OpCost], tokens: Num) -> np.ndarray:
        """Time the expert cache adds to a step, over all MoE layers (0 without experts)."""
        if self.experts is None:
            return np.zeros(np.shape(tokens))
        times = layer_times(costs, model)
        per_layer, _ = self.experts.layer_extra_s(
            tokens, expert_gpu_s=times.expert_s, shared_gpu_s=times.shared_s
        )
        return np.asarray(per_layer * self.experts.num_layers)

    def streaming_curve(
        self, model: ModelSpec, reference: list[OpCost]
    ) -> tuple[list[float], list[float]]:
        """Exposed streaming as a function of a step's total decoder-layer compute, on a grid
        (seconds, seconds): the layers keep their shares of `reference`'s compute. For the
        serving simulator, which knows a step's total but not its split over layers."""
        per_layer = layer_times(reference, model).per_layer.reshape(model.num_layers, -1)[:, 0]
        total = per_layer.sum()
        shares = per_layer / total if total > 0 else np.full(model.num_layers, 1 / model.num_layers)
        scale = max(float(self.load_s.sum()), 1e-9)
        grid = np.concatenate(([0.0], scale * np.geomspace(1e-3, 1e3, CURVE_POINTS)))
        if not self.spec.streams_weights:
            return grid.tolist(), [0.0] * len(grid)
        exposed = self.stream_time(shares[:, None] * grid[None, :]) - grid
        return grid.tolist(), np.maximum(exposed, 0.0).tolist()


def _stage_bounds(num_layers: int, pp: int) -> tuple[int, ...]:
    sizes = [len(s) for s in np.array_split(np.arange(num_layers), pp)]
    return tuple(int(x) for x in np.concatenate(([0], np.cumsum(sizes))))


def _staging(streamed: np.ndarray, bounds: tuple[int, ...], transfer: Transfer) -> float:
    """The busiest stage's staging buffers for streamed layers."""
    buffers = {"prefetch": 2, "sync": 1, "uva": 0}[transfer]
    worst = 0.0
    for lo, hi in pairwise(bounds):
        stage = streamed[lo:hi]
        worst = max(worst, min(buffers, int(np.count_nonzero(stage))) * float(stage.max()))
    return worst


def _streamed(on_gpu: np.ndarray, bounds: tuple[int, ...], spec: OffloadSpec) -> np.ndarray:
    """Bytes each layer streams per step; each stage's device picks from its own layers."""
    if not spec.streams_weights:
        return np.zeros(len(on_gpu))
    return np.concatenate(
        [
            streamed_layer_bytes(
                on_gpu[lo:hi],
                offload_bytes=spec.cpu_offload_gb * GiB,
                resident_layers=spec.resident_layers,
            )
            for lo, hi in pairwise(bounds)
        ]
    )


def _check_host(
    plan: OffloadPlan, hw: HardwareSpec, *, host_reserved_bytes: float, streams: bool
) -> None:
    spec = plan.spec
    if spec.source != "host":
        return
    host = spec.host_memory_bytes or hw.host.memory_bytes
    need = plan.host_bytes + host_reserved_bytes
    if need > host:
        raise SpecError(
            f"{need / GiB:.1f} GiB of host memory needed per GPU (offloaded weights"
            f"{' + swap space' if host_reserved_bytes else ''}), {host / GiB:.1f} GiB available "
            f"({'offload.host_memory_bytes' if spec.host_memory_bytes else hw.id + ' host'})",
            field="cpu_offload_gb" if streams else "expert_offload",
        )


def plan_offload(
    model: ModelSpec,
    hw: HardwareSpec,
    layout: Parallelism,
    prec: Precision,
    spec: OffloadSpec,
    *,
    layer_bytes: np.ndarray,
    max_tokens: int,
    host_reserved_bytes: float = 0.0,
) -> OffloadPlan:
    """Resolve `spec` for one device per stage; `layer_bytes` are each layer's weights on its
    device (`memory.layer_weight_bytes`). SpecError if host memory cannot hold it."""
    link = link_bandwidth(hw, spec.source)
    experts = (
        build_expert_cache(model, hw, layout, prec, spec.expert_offload, link_bytes_per_s=link)
        if spec.expert_offload is not None
        else None
    )
    expert_off = np.zeros(model.num_layers)
    if experts is not None:
        expert_off[model.num_dense_layers :] = experts.offloaded_bytes_per_layer
    bounds = _stage_bounds(model.num_layers, layout.pp)
    streamed = _streamed(layer_bytes - expert_off, bounds, spec)
    off = streamed + expert_off
    staging = _staging(streamed, bounds, spec.transfer) if spec.streams_weights else 0.0
    if experts is not None:
        staging += experts.staging_bytes(max_tokens=max_tokens)
    plan = OffloadPlan(
        spec=spec,
        link_bytes_per_s=link,
        stage_bounds=bounds,
        streamed_bytes=streamed,
        offloaded_layer_bytes=off,
        staging_bytes=staging,
        host_bytes=max(float(off[lo:hi].sum()) for lo, hi in pairwise(bounds)),
        experts=experts,
    )
    _check_host(plan, hw, host_reserved_bytes=host_reserved_bytes, streams=spec.streams_weights)
    return plan
