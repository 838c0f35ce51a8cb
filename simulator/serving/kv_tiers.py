"""KV-cache tiers below the GPU's HBM: host DRAM (`cpu`) and NVMe, behind prefix caching.

What vLLM's KV offloading does (`--kv-offloading-size GiB --kv-offloading-backend
native|lmcache`: vLLM's OffloadingConnector, or LMCache's connector with its CPU and local-disk
backends), on block counts:

- Writes (write-through). Every full block a request computed is written to each lower tier
  when the request frees its blocks (finished, or preempted), unless the tier holds it already
  (then it is only touched). vLLM writes a block as soon as it is computed, asynchronously on a
  copy stream: the same bytes, earlier. Writes overlap compute: counted, not timed. Each tier
  keeps its blocks in LRU order and drops the least recently used when full (LMCache writes a
  chunk to every backend, so the NVMe tier also holds what the CPU tier dropped, as far as its
  capacity reaches). A request frees its tail first, so a prefix outlives its tail.
- Lookups. A request admitted with nothing computed starts from its longest run of cached
  full blocks (`PrefixCachingBlockManager`), each block from the fastest tier holding it: HBM
  (no copy), else the CPU tier, else NVMe. A block found below HBM is copied into a new HBM
  block: block bytes / the tier's bandwidth per GPU (each GPU of the replica copies its share
  over its own link at once); NVMe blocks come through host memory, pipelined, at the slower of
  the NVMe and host links. A hit is always loaded, as vLLM and LMCache do: neither weighs a
  load against recomputing the tokens, so a slow tier can make a hit cost more than a miss.
- When a load costs time. `native` (vLLM's connector): between steps; the request waits out of
  the batch until its blocks arrive (loads queue on the replica's host link), the others keep
  stepping. `lmcache`: before the step that admits the request; the whole batch waits (its
  default; its layer-wise and asynchronous loading modes are not modelled).

Sizes follow vLLM: `cpu_gib` (`--kv-offloading-size`) and `nvme_gib` are per replica, split
evenly over its tp x pp GPUs; a tier of the KV cache dtype's blocks (fp8 halves a block).
Defaults come from the hardware spec's `host:` section: the CPU tier is the host memory per GPU
less swap space and offloaded weights; GPU <-> CPU at min(PCIe x host_link_fraction, host DRAM
bandwidth) (`costmodel.offload.link_bandwidth`); NVMe at `nvme_bw_bytes_per_s`. No NVMe tier
unless `nvme_gib` is given (the spec has no disk capacity).

Not modelled: the write traffic's share of the links (writes never delay a step), reads
sharing the link with weight streaming, LMCache's 256-token chunks (tiers work in engine
blocks), promotion of NVMe hits into the CPU tier, vLLM's cap on concurrent loads and its
store-reuse gating, a tier shared by several replicas (each replica has its own), and swap
preemption with tiers (refused: vLLM V1 has no swap mode; a preempted request reloads its
blocks from the CPU tier instead).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from simulator.costmodel.memory import KvHold, MemoryPlan
from simulator.costmodel.offload import link_bandwidth
from simulator.errors import SpecError
from simulator.serving.kv_cache import RUN, BlockManager, PrefixCachingBlockManager
from simulator.serving.request import BlockKey, Request
from simulator.specs.hardware import HardwareSpec
from simulator.specs.serving import Backend, KVOffloadSpec
from simulator.units import GiB


@dataclass(frozen=True, kw_only=True)
class KVTiers:
    """The tiers of one replica, resolved: blocks each tier holds, seconds to load one block
    (each GPU its share, at once), and bytes of one block over the replica's GPUs."""

    backend: Backend
    replica_block_bytes: float
    cpu_blocks: int
    cpu_s_per_block: float
    nvme_blocks: int = 0
    nvme_s_per_block: float = 0.0

    @property
    def async_loads(self) -> bool:
        return self.backend == "native"


def plan_tiers(
    spec: KVOffloadSpec,
    *,
    hw: HardwareSpec,
    plan: MemoryPlan,
    gpus: int,
    swap_space_gib: float = 0.0,
) -> KVTiers:
    """`spec` for a replica of `gpus` GPUs whose memory plan is `plan`; SpecError when host
    memory (less swap space and offloaded weights) cannot hold the CPU tier."""
    block = plan.kv_bytes_per_token * plan.block_size  # one GPU's share of a block
    host, reserved = hw.host.memory_bytes, swap_space_gib * GiB
    if plan.offload is not None and plan.offload.spec.source == "host":
        host = plan.offload.spec.host_memory_bytes or host
        reserved += plan.offload.host_bytes
    room = host - reserved
    cpu = room if spec.cpu_gib is None else spec.cpu_gib * GiB / gpus
    if cpu > room or cpu < block:
        raise SpecError(
            f"{cpu / GiB:.1f} GiB per GPU for the CPU tier; the host has {max(room, 0) / GiB:.1f}"
            f" GiB per GPU after swap space and offloaded weights, and one block takes "
            f"{block / 2**20:.2f} MiB",
            field="kv_offload.cpu_gib",
        )
    cpu_bw = spec.cpu_bw_bytes_per_s or link_bandwidth(hw, "host")
    nvme_bw = min(spec.nvme_bw_bytes_per_s or hw.host.nvme_bw_bytes_per_s, cpu_bw)
    return KVTiers(
        backend=spec.backend,
        cpu_blocks=int(cpu // block),
        cpu_s_per_block=block / cpu_bw,
        nvme_blocks=int(spec.nvme_gib * GiB / gpus // block),
        nvme_s_per_block=block / nvme_bw,
        replica_block_bytes=block * gpus,
    )


class Tier:
    """One tier below HBM: an LRU of entries, each a keyed block or a run of one stream's own
    leading blocks (`RUN` keys, moved as one unit), `capacity` blocks in all. `written` and
    `read` count blocks moved in and out."""

    __slots__ = ("capacity", "lru", "read", "s_per_block", "used", "written")

    def __init__(self, *, capacity: int, s_per_block: float) -> None:
        if capacity < 1:
            raise ValueError("a KV tier must hold at least one block")
        self.capacity = capacity
        self.s_per_block = s_per_block
        self.lru: OrderedDict[BlockKey, int] = OrderedDict()  # entry -> blocks, oldest first
        self.used = 0
        self.written = 0
        self.read = 0

    def touch(self, key: BlockKey) -> None:
        if key in self.lru:
            self.lru.move_to_end(key)

    def write(self, key: BlockKey, blocks: int = 1) -> None:
        """Hold `blocks` blocks under `key` (a run may grow), most recently used; the blocks
        it held already are not written again. Drops least recently used entries to fit; a
        run longer than the tier keeps its head (its blocks are written tail first)."""
        lru = self.lru
        have = lru.get(key, 0)
        if have:
            lru.move_to_end(key)
        if blocks <= have:
            return
        self.written += blocks - have
        keep = min(blocks, self.capacity)
        lru[key] = keep
        self.used += keep - have
        while self.used > self.capacity:
            self.used -= lru.popitem(last=False)[1]


class TieredBlockManager(PrefixCachingBlockManager):
    """Prefix caching with tiers below HBM (see the module doc). `take_prefix` returns the
    seconds the hit's loads take; `tier_row` is the state the recorder samples."""

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        tiers: KVTiers,
        watermark: float = 0.01,
        host_blocks: int = 0,
        hold: KvHold | None = None,
    ) -> None:
        super().__init__(
            num_blocks=num_blocks,
            block_size=block_size,
            watermark=watermark,
            host_blocks=host_blocks,
            hold=hold,
        )
        self.tiers = tiers
        self.async_loads = tiers.async_loads
        self.lower = [Tier(capacity=tiers.cpu_blocks, s_per_block=tiers.cpu_s_per_block)]
        if tiers.nvme_blocks:
            self.lower.append(Tier(capacity=tiers.nvme_blocks, s_per_block=tiers.nvme_s_per_block))
        self.hit_blocks = [0, 0, 0]  # blocks found in HBM, CPU, NVMe (every admission)
        self.load_s = 0.0  # seconds of loads so far
        # Where the last lookup found its blocks: the tier of each key (0: HBM), the run's
        # blocks in HBM and the tier of the rest of it.
        self._where: tuple[list[int], int, int] = ([], 0, 0)

    def _lookup(self, req: Request) -> tuple[list[BlockKey], int, int]:
        """As PrefixCachingBlockManager's, through the lower tiers: a block found below HBM
        counts as unheld (it takes a free block when loaded)."""
        probe = self._probe
        if probe is not None and probe[0] is req and probe[1] == self._version:
            return probe[2], probe[3], probe[4]
        keys: list[BlockKey] = []
        places: list[int] = []
        unheld = run = hbm_run = run_tier = 0
        if req.num_computed == 0:
            held, lru, size, lower = self.held, self.lru, self.block_size, self.lower
            cap = (req.prompt_len + req.num_output - 1) // size
            shared = self._shareable(req, cap)
            for i in range(shared):
                key = self.key(req, (i + 1) * size)
                place = 0
                if key not in held:
                    if key not in lru:
                        place = _tier_of(key, lower)
                        if not place:
                            break
                    unheld += 1
                keys.append(key)
                places.append(place)
            if len(keys) == shared < cap:
                room = cap - shared
                run = hbm_run = min(self.runs.get(req.stream, 0), room)
                for t, tier in enumerate(lower, 1):
                    n = min(tier.lru.get((RUN, req.stream, 0, 0), 0), room)
                    if n > run:
                        run, run_tier = n, t
        self._probe = (req, self._version, keys, unheld, run)
        self._where = (places, hbm_run, run_tier)
        return keys, unheld, run

    def take_prefix(self, req: Request, hit: int) -> float:
        """Start `req` from its `hit` cached tokens (loading those below HBM into new blocks);
        returns the seconds the loads take."""
        keys, _, run = self._lookup(req)
        places, hbm_run, run_tier = self._where
        if (len(keys) + run) * self.block_size != hit or req.blocks:
            raise ValueError(f"{req}: cannot take {hit} cached tokens")
        held, lru, lower = self.held, self.lru, self.lower
        found = [0, 0, 0]  # blocks per tier
        unheld = 0
        for key, place in zip(keys, places, strict=True):
            if not place and key in held:
                held[key] += 1
            else:
                if not place:
                    del lru[key]
                    unheld += 1
                held[key] = 1
            found[place] += 1
            for tier in lower:  # vLLM touches a request's blocks in the offload tier at lookup
                tier.touch(key)
        if hbm_run:  # as PrefixCachingBlockManager: the run leaves the queue
            whole = self.runs.pop(req.stream)
            del lru[(RUN, req.stream, 0, 0)]
            self.unheld -= whole
            self.empty += whole - hbm_run
        found[0] += hbm_run
        if run > hbm_run:
            found[run_tier] += run - hbm_run
            lower[run_tier - 1].touch((RUN, req.stream, 0, 0))
        self.unheld -= unheld
        self.free -= unheld + hbm_run
        if found[1] + found[2]:
            self._take(found[1] + found[2])  # new HBM blocks for what is loaded
        self.peak_used = max(self.peak_used, self.num_blocks - self.free)
        req.cache_keys = list(keys)
        req.blocks = len(keys) + run
        req.num_computed = hit
        if not req.preemptions:
            req.cached_tokens = hit
        self._version += 1
        return self._loaded(found)

    def _loaded(self, found: list[int]) -> float:
        """Count blocks found per tier; the seconds loading those below HBM takes."""
        seconds = 0.0
        for t, blocks in enumerate(found):
            self.hit_blocks[t] += blocks
            if t and blocks:
                tier = self.lower[t - 1]
                tier.read += blocks
                seconds += blocks * tier.s_per_block
        self.load_s += seconds
        return seconds

    def release(self, req: Request) -> None:
        """Free `req`'s blocks (PrefixCachingBlockManager), then write the full blocks it
        computed to every lower tier, its own run first and its keyed blocks tail first (so
        its head is the most recently used). Under a KV token budget its own content is not a
        run from its prefix's end any more (the budget evicted from it): only its keyed blocks
        are written."""
        size = self.block_size
        keys, valid, stream = req.cache_keys, req.num_computed // size, req.stream
        whole = stream < -1 and self.hold is None
        own = valid - req.prefix_len // size if whole else 0
        super().release(req)
        for tier in self.lower:
            if own > 0:
                tier.write((RUN, stream, 0, 0), own)
            for i in range(min(valid, len(keys)) - 1, -1, -1):
                # a None is our copy of a block cached under its key: vLLM writes it too
                tier.write(keys[i] or self.key(req, (i + 1) * size))
        self._version += 1

    def tier_row(self) -> tuple[float, ...]:
        """The state the recorder samples (`metrics.recorder.TIER_COLUMNS` after replica and
        time): blocks per tier and capacities, cumulative bytes each way over the replica's
        GPUs, tokens found per tier, seconds of loads."""
        cpu = self.lower[0]
        nvme = self.lower[1:]
        b, size = self.tiers.replica_block_bytes, self.block_size
        gpu, on_cpu, on_nvme = self.hit_blocks
        return (
            self.used,
            cpu.used,
            sum(t.used for t in nvme),
            cpu.capacity,
            sum(t.capacity for t in nvme),
            cpu.written * b,
            cpu.read * b,
            sum(t.written for t in nvme) * b,
            sum(t.read for t in nvme) * b,
            gpu * size,
            on_cpu * size,
            on_nvme * size,
            self.load_s,
        )


def block_manager(
    *,
    num_blocks: int,
    block_size: int,
    watermark: float,
    host_blocks: int,
    prefix_caching: bool,
    tiers: KVTiers | None,
    hold: KvHold | None = None,
) -> BlockManager:
    """An empty KV cache: plain, with prefix caching, or with tiers below HBM (which implies
    prefix caching); `hold` (sliding windows, a KV token budget) applies to the plain one and,
    on the requests' own blocks, to the prefix-caching and tiered ones."""
    if tiers is not None:
        return TieredBlockManager(
            num_blocks=num_blocks,
            block_size=block_size,
            tiers=tiers,
            watermark=watermark,
            host_blocks=host_blocks,
            hold=hold,
        )
    if prefix_caching:
        return PrefixCachingBlockManager(
            num_blocks=num_blocks,
            block_size=block_size,
            watermark=watermark,
            host_blocks=host_blocks,
            hold=hold,
        )
    return BlockManager(
        num_blocks=num_blocks,
        block_size=block_size,
        watermark=watermark,
        host_blocks=host_blocks,
        hold=hold,
    )


def _tier_of(key: BlockKey, lower: list[Tier]) -> int:
    """1 + the index of the first tier holding `key`, or 0."""
    for t, tier in enumerate(lower, 1):
        if key in tier.lru:
            return t
    return 0
