"""Accelerator specs: datasheet facts plus named, sourced efficiency factors.

One YAML file per device in `hardware_specs/` (file name = id). Peaks are dense (no 2:4
sparsity). A dtype missing from `peak_flops_per_s` means the device has no matrix unit for it:
the cost model then runs that precision weight-only (dequantise to bf16/fp16, compute there).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from simulator.errors import SpecError
from simulator.specs._base import (
    Bytes,
    BytesPerS,
    Curve,
    FlopsPerS,
    Frozen,
    Hertz,
    Seconds,
    Watts,
    flat,
)
from simulator.units import parse_quantity

ComputeDtype = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4", "fp4"]
# The keys of a GEMM library's per-dtype factors: a compute dtype, or `fp8_block`, an fp8 GEMM on
# weights scaled per block (DeepSeek-V3's 128 x 128), which runs other kernels than per-tensor
# fp8 (a per-token-group activation quantisation and a block-scaled GEMM); without its own
# entry it takes fp8's.
GemmKey = ComputeDtype | Literal["fp8_block"]

# What a kernel reaches of a peak or a bandwidth: above 0, at most all of it.
Fraction = Annotated[float, Field(gt=0, le=1)]


class ComputeSpec(Frozen):
    units: int = Field(gt=0, description="SMs (NVIDIA) or CUs (AMD)")
    threads_per_unit: int = Field(
        default=2048,
        gt=0,
        description="resident threads per SM/CU (CUDA: 2048 at compute capability 8.0, 9.0 and "
        "10.0; 1536 at 8.6 and 8.9)",
    )
    clock_hz: Hertz = Field(gt=0, description="clock at which the tensor peaks are computed")
    peak_flops_per_s: dict[ComputeDtype, Annotated[FlopsPerS, Field(gt=0)]] = Field(
        description="dense matrix-unit peak per dtype (fp32: vector FMA peak)"
    )

    @model_validator(mode="after")
    def _needs_16bit(self) -> ComputeSpec:
        if "bf16" not in self.peak_flops_per_s and "fp16" not in self.peak_flops_per_s:
            raise ValueError("peak_flops_per_s needs at least bf16 or fp16")
        return self


class MemorySpec(Frozen):
    capacity_bytes: Bytes = Field(gt=0, description="capacity the driver reports")
    bandwidth_bytes_per_s: BytesPerS = Field(
        gt=0, allow_inf_nan=False, description="datasheet DRAM bandwidth"
    )
    l2_cache_bytes: Bytes = Field(ge=0, description="last-level on-chip cache")


class InterconnectSpec(Frozen):
    """Scale-up fabric between GPUs of one node.

    topology: `switch` (NVSwitch: full bandwidth to any peer), `mesh` (xGMI full mesh: each
    peer gets `peer_bw_bytes_per_s`), `pcie` (no GPU fabric: traffic crosses the host PCIe).
    """

    topology: Literal["switch", "mesh", "pcie"]
    gpus_per_node: int = Field(gt=0)
    link_bw_bytes_per_s: BytesPerS = Field(gt=0, description="per GPU, per direction, aggregate")
    peer_bw_bytes_per_s: BytesPerS = Field(gt=0, description="to any one peer, per direction")
    latency_s: Seconds = Field(ge=0, description="one-hop latency of a small transfer")
    scale_out_bw_bytes_per_s: BytesPerS = Field(
        default=50e9, gt=0, description="per GPU between nodes (default: one 400 Gb/s NIC)"
    )
    scale_out_latency_s: Seconds = Field(default=5e-6, ge=0)


class HostCpu(Frozen):
    """A host CPU of `simulator/specs/host_cpus.yaml`: its name, its single-thread score
    (PassMark's Single Thread Rating, one scale for every CPU so that ratios compare) and
    where that score came from."""

    name: str
    single_thread: float = Field(gt=0, allow_inf_nan=False, description="PassMark single thread")
    source: str


class HostSpec(Frozen):
    """Defaults for a typical node hosting this GPU; scenarios may override."""

    cpu: str | None = Field(
        default=None,
        description="the node's CPU, an id of simulator/specs/host_cpus.yaml; an engine's "
        "CPU costs scale by its single-thread score (None: as the engine's own host)",
    )

    pcie_gen: int = Field(ge=3, le=6)
    pcie_bw_bytes_per_s: BytesPerS = Field(gt=0, description="x16, per direction, theoretical")
    memory_bytes: Bytes = Field(gt=0, description="host DRAM per GPU")
    memory_bw_bytes_per_s: BytesPerS = Field(gt=0, description="host DRAM bandwidth per GPU")
    nvme_bw_bytes_per_s: BytesPerS = Field(gt=0, description="NVMe read bandwidth per GPU")
    cpu_flops_per_s: FlopsPerS = Field(gt=0, description="host CPU fp32 FLOP/s per GPU share")


class PowerSpec(Frozen):
    """Board power and the shape of its draw under load (`simulator.runs.energy`).

    While a step runs, one GPU draws idle_w + (tdp_w - idle_w) x (active_fraction +
    compute_fraction x u_compute x clock_factor^3 + memory_fraction x u_memory), clamped to
    [between_steps_w, ceiling_w]: u_compute is the step's FLOPs at the dense peak over its time,
    u_memory its DRAM bytes at the datasheet bandwidth over its time. Between steps it draws
    `between_steps_w`: parked_w, what it draws with a serving engine's CUDA context open and
    nothing running (the context holds the clocks up: +26-50 W over a bare board's idle on
    H100 and A100, +66 W on L40S, arXiv:2605.23918), else idle_w. The shape's defaults are
    the fit to Splitwise's DGX-A100 llama-2-70b rows (`python -m simulator.validate.power
    --fit`; see hardware_specs/a100_sxm_80gb.yaml), assumed for devices without measurements
    of their own.
    """

    tdp_w: Watts = Field(gt=0)
    idle_w: Watts = Field(gt=0, description="draw with no process on the GPU")
    parked_w: Watts | None = Field(
        default=None,
        gt=0,
        description="draw with a serving engine's CUDA context open and no step running "
        "(None: idle_w)",
    )
    active_fraction: float = Field(
        default=0.115, ge=0, le=1, description="of tdp - idle while any step runs (clocks up)"
    )
    compute_fraction: float = Field(
        default=1.476, ge=0, description="of tdp - idle per unit of FLOP/s over the dense peak"
    )
    memory_fraction: float = Field(
        default=0.991, ge=0, description="of tdp - idle per unit of DRAM bytes/s over bandwidth"
    )
    boost_w: Watts | None = Field(
        default=None, gt=0, description="highest draw above TDP the board allows (None: TDP)"
    )
    cap_w: Watts | None = Field(
        default=None, gt=0, description="operator power limit (`with_power_cap` sets it)"
    )
    sensor_window_s: Seconds = Field(
        default=0.1,
        gt=0,
        description="averaging window of the on-board power sensor (only to compare with "
        "nvidia-smi readings; default: the 100 ms update period of A100/H100 [Yang et al.])",
    )

    @model_validator(mode="after")
    def _ordered(self) -> PowerSpec:
        if self.idle_w >= self.tdp_w:
            raise ValueError("idle_w must be below tdp_w")
        if self.parked_w is not None and not self.idle_w <= self.parked_w < self.tdp_w:
            raise ValueError(
                f"parked_w ({self.parked_w:g} W) must be at least idle_w ({self.idle_w:g} W) "
                f"and below tdp_w ({self.tdp_w:g} W)"
            )
        if self.boost_w is not None and self.boost_w < self.tdp_w:
            raise ValueError("boost_w must be at least tdp_w")
        if self.cap_w is not None and self.cap_w <= self.idle_w:
            raise ValueError(f"cap_w ({self.cap_w:g} W) must be above idle_w ({self.idle_w:g} W)")
        return self

    @property
    def between_steps_w(self) -> float:
        """What one GPU of a serving replica draws while no step runs: parked_w, else idle_w
        (no more than the ceiling: a cap below the parked draw holds it)."""
        parked = self.parked_w if self.parked_w is not None else self.idle_w
        return min(parked, self.ceiling_w)

    @property
    def ceiling_w(self) -> float:
        """The most one GPU draws: the cap, else the boost limit, else the TDP."""
        top = self.boost_w if self.boost_w is not None else self.tdp_w
        return min(top, self.cap_w) if self.cap_w is not None else top

    @property
    def clock_factor(self) -> float:
        """Clock under `cap_w` as a fraction of the clock the peaks are given at (1 without a
        cap below TDP). Dynamic power ~ f V^2 and V tracks f over the DVFS range, so full-load
        draw above idle scales as f^3: f = ((cap - idle) / (tdp - idle))^(1/3). Not modelled:
        the minimum power limit a board accepts, voltage floors at low clocks."""
        if self.cap_w is None or self.cap_w >= self.tdp_w:
            return 1.0
        return float(((self.cap_w - self.idle_w) / (self.tdp_w - self.idle_w)) ** (1.0 / 3.0))


class PriceSpec(Frozen):
    usd_per_hour: float = Field(gt=0, description="approximate on-demand price per GPU-hour")
    source: str
    date: str


class GemmEfficiency(Frozen):
    """Achieved fraction of the dense peak for a GEMM of shape m x n x k.

    eff = peak_fraction[dtype] * tile_utilisation(m, n) * wave_utilisation * size_curve(flops).
    The library picks, per shape, the power-of-two tile between the minimum and maximum sizes
    that wastes least to padding and partial waves (a wave: `units` tiles at once).
    W8A8 GEMMs (fp8/int8 compute with 16-bit activations) first quantise the activations in a
    separate memory-bound kernel.
    """

    peak_fraction: dict[GemmKey, Fraction]
    tile_m: int = Field(default=128, gt=0, description="largest row tile")
    tile_n: int = Field(default=128, gt=0, description="largest column tile")
    tile_m_min: int = Field(
        default=64, gt=0, description="smallest row tile the GEMM library uses for skinny m"
    )
    tile_n_min: int = Field(default=128, gt=0, description="smallest column tile")
    split_k_min_k: int = Field(
        default=512, gt=0, description="least k per split when split-K fills idle SMs"
    )
    size_curve: Curve = Field(default_factory=lambda: flat(1.0))
    size_curves: dict[GemmKey, Curve] = Field(
        default_factory=dict, description="per-dtype size curves replacing size_curve"
    )
    extra_latency_s: dict[GemmKey, Seconds] = Field(
        default_factory=dict, description="per-dtype fixed cost on top of the kernel latency"
    )
    quant_fraction: dict[GemmKey, Fraction] = Field(
        default_factory=dict,
        description="per-dtype fraction of DRAM bandwidth the activation-quantisation kernel "
        "before a W8A8 GEMM reaches (default: the memory stream fraction)",
    )
    quant_size_curve: Curve = Field(
        default_factory=lambda: flat(1.0),
        description="multiplier on quant_fraction by the bytes the quantisation kernel moves",
    )
    data_ceiling: dict[GemmKey, Fraction] = Field(
        default_factory=dict,
        description="per-dtype highest fraction of the dense peak a GEMM reaches on real "
        "(random-like) weights, whose switching power holds the clock down at the power limit; "
        "caps the efficiency above. Set where the fitted operator data ran on uninitialised "
        "(zero) weights, which draw less power (see without_data_ceiling)",
    )


class GemmLibrary(Frozen):
    """How another GEMM library runs this device's GEMMs: the peak fractions, size curves,
    per-dtype fixed costs and smallest row tile its measurements give, where they differ from
    the library `gemm` was fitted to. Every other GEMM factor (largest tiles, the activation
    quantisation kernel, data ceiling) is the device's. An engine names its library
    (`EngineSpec.gemm_library`); `EfficiencySpec.gemm_for` resolves it."""

    peak_fraction: dict[GemmKey, Fraction] = Field(
        default_factory=dict, description="per-dtype peak fractions replacing the device's"
    )
    size_curve: Curve | None = Field(
        default=None, description="size curve replacing the device's (None: the device's)"
    )
    size_curves: dict[GemmKey, Curve] = Field(
        default_factory=dict, description="per-dtype size curves replacing the device's"
    )
    extra_latency_s: dict[GemmKey, Seconds] = Field(
        default_factory=dict, description="per-dtype fixed costs replacing the device's"
    )
    tile_m_min: int | None = Field(
        default=None, gt=0, description="smallest row tile it uses (None: the device's)"
    )


class AttentionKernel(Frozen):
    """Another attention kernel on this device, measured against the one `attention` was
    fitted to, in one benchmark that ran both: the speed of its prefill relative to that
    kernel's, by the mean query length per sequence. Decode keeps the device's factors (an
    engine's `decode_split` names its split rule). An engine names its kernel
    (`EngineSpec.attention_kernel`); `EfficiencySpec.attention_speed` resolves it."""

    prefill_speed: Curve = Field(
        description="prefill throughput relative to the device's fitted kernel, by query length"
    )


# Elementwise kernels with one thread block per token (`costmodel.elementwise_kernels`).
RowKernel = Literal["norm", "rotary", "act"]


class MemoryEfficiency(Frozen):
    """Achieved fraction of DRAM bandwidth: stream_fraction * size_curve(bytes moved). The
    `row_*` factors price elementwise kernels with one thread block per token whose threads
    load one element per loop trip (`costmodel.elementwise_kernels`): such a kernel takes at
    least trips x max(row_latency_s, waves of resident blocks x the kernel's row_wave_s), the
    wave time scaled by row_l2_factor when its bytes fit in L2, plus row_fixed_s (None: the
    device's kernel latency). A kernel without a row_wave_s is not priced so."""

    stream_fraction: float = Field(gt=0, le=1)
    size_curve: Curve = Field(default_factory=lambda: flat(1.0))
    row_fixed_s: Seconds | None = Field(
        default=None, ge=0, description="fixed cost of a one-block-per-token kernel"
    )
    row_latency_s: Seconds = Field(
        default=0.0, ge=0, description="one loop trip of one block's threads, device idle"
    )
    row_wave_s: dict[RowKernel, Seconds] = Field(
        default_factory=dict, description="one loop trip of a full wave of resident blocks"
    )
    row_l2_factor: float = Field(
        default=1.0, gt=0, le=1, description="row_wave_s multiplier when the bytes fit in L2"
    )


DecodeSplit = Literal["none", "fa2", "fa3", "paged_v2"]


class AttentionEfficiency(Frozen):
    """Flash-style attention kernels.

    Prefill: fraction of the 16-bit dense peak, times curves of the mean query length per
    sequence, of the parallel work (thread blocks, `roofline.prefill_work`: sequences x KV
    heads x 128-row tiles of a packed GQA group; under `decode_split` `fa2`, FlashAttention-2,
    sequences x query heads x 64-token tiles, no packing) and of the GQA group size (query
    heads per KV head). Decode: fraction of DRAM bandwidth reading the KV
    cache, times curves of the mean KV length per sequence, of the KV work (sequences x KV heads
    x KV length in 256-token tiles) and of the GQA group size. An fp8 KV cache multiplies both
    by `fp8_kv_factor` (dequantisation). Each call also costs a fixed time (None: the device's
    kernel latency): a layer's attention is several kernels (KV-cache write, attention, merge
    of split results); and a time per wave of thread blocks (`*_wave_s` x blocks / SMs: each
    block's setup, block-table walk and Q/O traffic, which the roofline misses when blocks have
    little work each).

    Decode thread blocks follow the kernel's split-KV choice (`decode_split`): `none`, one block
    per (sequence, KV head); `fa2`, vLLM's FlashAttention-2 paged path, which splits the KV of
    GQA layers to fill two blocks per SM and never splits MHA layers; `fa3`, FlashAttention-3's
    dynamic split, which fills the SMs; `paged_v2`, vLLM 0.2's PagedAttention V2, 512-token
    partitions per (sequence, query head) (see `attention_kernels.decode_blocks`). An engine profile
    may name its own (`EngineSpec.decode_split`). With
    `decode_block_bytes_per_s` set, the KV read also takes at least its bytes over that rate
    times the resident blocks: one block walks its pages one after another, so a few long
    blocks are latency-bound whatever the bandwidth. With `decode_walk_tokens_per_s` set, an
    `fa3` decode also takes at least the KV tokens of up to `decode_walk_seqs` sequences over
    that rate, counted in tokens whatever the KV heads or dtype (`attention_kernels.walk_tokens`:
    measured on H100's FlashAttention-3, where few sequences with one KV head stream at a
    third of the rate of eight). `decode_gqa_copy_s` is the extra cost of the `fa2` path's
    query and output re-layout for GQA with two or more KV heads and sequences.
    """

    prefill_fraction: float = Field(gt=0, le=1)
    prefill_len_curve: Curve = Field(default_factory=lambda: flat(1.0))
    prefill_parallel_curve: Curve = Field(default_factory=lambda: flat(1.0))
    prefill_group_curve: Curve = Field(default_factory=lambda: flat(1.0))
    prefill_fixed_s: Seconds | None = Field(default=None, ge=0)
    prefill_wave_s: Seconds = Field(default=0.0, ge=0, description="time per wave of blocks")
    cache_write_block_s: Seconds = Field(
        default=0.0,
        ge=0,
        description="time per thread block of the KV-cache write kernel, one block per token "
        "(`attention_kernels.cache_write_waves`), prefill and decode alike",
    )
    decode_fraction: float = Field(gt=0, le=1)
    decode_len_curve: Curve = Field(default_factory=lambda: flat(1.0))
    decode_parallel_curve: Curve = Field(default_factory=lambda: flat(1.0))
    decode_group_curve: Curve = Field(default_factory=lambda: flat(1.0))
    decode_fixed_s: Seconds | None = Field(default=None, ge=0)
    decode_wave_s: Seconds = Field(default=0.0, ge=0, description="time per wave of blocks")
    decode_split: DecodeSplit = Field(
        default="none",
        description="split-KV heuristic of the decode kernel (none, fa2, fa3, paged_v2)",
    )
    decode_block_bytes_per_s: BytesPerS | None = Field(
        default=None, gt=0, description="KV bytes/s of one resident decode block (None: no bound)"
    )
    decode_gqa_copy_s: Seconds = Field(
        default=0.0, ge=0, description="fa2 only: query/output re-layout of GQA decode"
    )
    decode_walk_tokens_per_s: float | None = Field(
        default=None, gt=0, description="fa3 only: KV tokens/s of the page walk (None: no bound)"
    )
    decode_walk_seqs: float = Field(
        default=1.0, ge=1, description="sequences that share one walk rate"
    )
    fp8_kv_factor: float = Field(default=1.0, gt=0, le=2)


class CollectiveEfficiency(Frozen):
    """Collectives: time = latency_s * latency_group_curve(devices) + bytes_on_the_wire /
    (bandwidth * busbw_fraction * size_curve(message bytes))."""

    busbw_fraction: float = Field(gt=0, le=1.2, description="NVLS can exceed the wire speed")
    latency_s: Seconds = Field(ge=0)
    latency_group_curve: Curve = Field(default_factory=lambda: flat(1.0))
    size_curve: Curve = Field(default_factory=lambda: flat(1.0))


class EfficiencySpec(Frozen):
    gemm: GemmEfficiency
    memory: MemoryEfficiency
    attention: AttentionEfficiency
    collective: CollectiveEfficiency
    kernel_latency_s: Seconds = Field(ge=0, description="fixed cost of one kernel on the GPU")
    host_link_fraction: float = Field(gt=0, le=1, description="measured H2D / theoretical PCIe")
    gemm_libraries: dict[str, GemmLibrary] = Field(
        default_factory=dict,
        description="GEMM libraries other than the one `gemm` was fitted to, by name (e.g. "
        "cublas-12.1), where measurements of them exist for this device",
    )

    attention_kernels: dict[str, AttentionKernel] = Field(
        default_factory=dict,
        description="attention kernels other than the one `attention` was fitted to, by name "
        "(e.g. fa2 on a device fitted to fa3), where a benchmark compares them on this device",
    )

    def attention_speed(self, kernel: str | None) -> Curve | None:
        """The prefill speed of `kernel` relative to the device's fitted kernel, by query
        length, where this device has a comparison of the two; else None (the device's own)."""
        entry = self.attention_kernels.get(kernel) if kernel is not None else None
        return None if entry is None else entry.prefill_speed

    def gemm_for(self, library: str | None) -> GemmEfficiency:
        """The GEMM efficiency under `library`: its factors over the device's where this
        device has measurements of it, else the device's own (None: the device's)."""
        lib = self.gemm_libraries.get(library) if library is not None else None
        if lib is None:
            return self.gemm
        update: dict[str, object] = {
            "peak_fraction": {**self.gemm.peak_fraction, **lib.peak_fraction},
            "size_curves": {**self.gemm.size_curves, **lib.size_curves},
            "extra_latency_s": {**self.gemm.extra_latency_s, **lib.extra_latency_s},
        }
        if lib.size_curve is not None:
            update["size_curve"] = lib.size_curve
        if lib.tile_m_min is not None:
            update["tile_m_min"] = lib.tile_m_min
        return self.gemm.model_copy(update=update)


class HardwareSpec(Frozen):
    id: str = Field(default="", description="set from the file name by the loader")
    name: str
    vendor: Literal["nvidia", "amd", "intel"]
    compute: ComputeSpec
    memory: MemorySpec
    interconnect: InterconnectSpec
    host: HostSpec
    power: PowerSpec
    price: PriceSpec
    efficiency: EfficiencySpec

    def peak_flops(self, dtype: str) -> float:
        """Dense peak for `dtype`, or 0.0 where the device has no matrix unit for it."""
        return float(self.compute.peak_flops_per_s.get(dtype, 0.0))  # type: ignore[call-overload]

    def supports(self, dtype: str) -> bool:
        return self.peak_flops(dtype) > 0.0

    def with_gemm(self, gemm: GemmEfficiency) -> HardwareSpec:
        """This device with `gemm` as its GEMM efficiency."""
        eff = self.efficiency.model_copy(update={"gemm": gemm})
        return self.model_copy(update={"efficiency": eff})

    def with_gemm_library(self, library: str | None) -> HardwareSpec:
        """This device with `library`'s GEMM efficiency as its own (`EfficiencySpec.gemm_for`);
        for running a kernel alone as that library does."""
        return self.with_gemm(self.efficiency.gemm_for(library))

    def without_data_ceiling(self) -> HardwareSpec:
        """This device as the bundled operator data measured it: GEMMs on uninitialised
        (zero) weights, so no `gemm.data_ceiling` (calibration and the `ops` suite use it)."""
        return self.with_gemm(self.efficiency.gemm.model_copy(update={"data_ceiling": {}}))


def with_power_cap(hw: HardwareSpec, watts: float | str) -> HardwareSpec:
    """`hw` under an operator power limit of `watts` per GPU (a number, or text with its unit
    as a scenario takes it: "350 W"): the clock (and every dtype's dense peak) scaled by
    `PowerSpec.clock_factor`, memory bandwidth unchanged, draw capped. A cap at or above TDP
    leaves the speed alone. A cap at or below idle power is a SpecError."""
    power = hw.power
    try:
        watts = parse_quantity(watts, dimension="w")
    except ValueError as exc:
        raise SpecError(str(exc), field="power_cap_w") from None
    if not watts > power.idle_w:
        raise SpecError(
            f"power cap {watts:g} W must be above the idle draw of {hw.id or hw.name} "
            f"({power.idle_w:g} W)",
            field="power_cap_w",
        )
    capped = power.model_copy(update={"cap_w": float(watts)})
    factor = capped.clock_factor / power.clock_factor  # relative to any cap already applied
    compute = hw.compute.model_copy(
        update={
            "clock_hz": hw.compute.clock_hz * factor,
            "peak_flops_per_s": {k: v * factor for k, v in hw.compute.peak_flops_per_s.items()},
        }
    )
    return hw.model_copy(update={"power": capped, "compute": compute})
