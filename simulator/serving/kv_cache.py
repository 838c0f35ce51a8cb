"""The paged KV-cache block manager: the only owner of block state.

Blocks of `block_size` tokens; a request holds ceil(num_computed_after_step / block_size)
blocks. `allocate` answers "does it fit" and takes the blocks, or returns False and changes
nothing (vLLM V1's allocate_slots returning None). A `watermark` fraction of all blocks is kept
free when admitting a new request, so running requests can grow.

Swap space (`host_blocks`) holds the blocks of requests preempted by swapping.

`PrefixCachingBlockManager` (below) adds vLLM's automatic prefix caching; without it no block
is shared and `allocate` / `extend` stay the lean loops of `BlockManager`. Tiers below HBM (host
DRAM, NVMe) extend it in `serving/kv_tiers.py`.

With a `hold` (`costmodel.memory.KvHold`: sliding-window layers keeping only their window, or
a KV token budget, `specs.deployment.KvEviction`), a request holds the blocks of
`hold.tokens(num_computed, prompt_len)` tokens and gives back those its window layers no
longer need, or its budget evicted. With prefix caching a window (never a budget) gives back
blocks of a request's own content only (`PrefixCachingBlockManager`).

Not modelled: block-table fragmentation.
"""

from __future__ import annotations

from collections import OrderedDict

from simulator.costmodel.memory import KvHold
from simulator.serving.request import BlockKey, Request


class BlockManager:
    prefix_caching = False  # a PrefixCachingBlockManager looks up cached prefixes
    async_loads = False  # KV tiers whose loads run between steps (serving/kv_tiers.py)

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        watermark: float = 0.01,
        host_blocks: int = 0,
        hold: KvHold | None = None,
    ) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache must hold at least one block")
        self.hold = hold
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free = num_blocks  # (a pooled cache's setter keeps it as its own count)
        self.watermark_blocks = int(watermark * num_blocks)
        self.peak_used = 0
        self.host_free = host_blocks  # swap space in host memory, in blocks

    # A property, not an attribute, because a cache in a pool (serving/kv_pool.py) counts its
    # room differently: a compiled build (simulator/native.py) reaches a subclass's property
    # through the base class's only where the base has one too.
    @property
    def free(self) -> int:
        """Blocks free to use."""
        return self._free

    @free.setter
    def free(self, value: int) -> None:
        self._free = value

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    @property
    def usage(self) -> float:
        return self.used / self.num_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def needed(self, req: Request, num_new_tokens: int) -> int:
        """More blocks `req` needs to hold `num_new_tokens` more computed tokens."""
        tokens = req.num_computed + num_new_tokens
        if self.hold is not None:
            tokens = self.hold.tokens(tokens, req.prompt_len)
        return max(0, self.blocks_for(tokens) - req.blocks)

    def can_admit(self, req: Request, num_new_tokens: int, *, hit: int = 0) -> bool:
        """Whether a waiting `req` may start (`hit` cached tokens taken first, then
        `num_new_tokens` computed) and leave the watermark free."""
        return self.needed(req, hit + num_new_tokens) <= self.free - self.watermark_blocks

    def prefix_hit(self, req: Request) -> int:
        """Tokens of a waiting `req` the prefix cache holds: none without prefix caching."""
        return 0

    def awaits_pool(self) -> bool:
        """Whether a replica with nothing it can schedule should wait for another replica to
        free blocks (a cache in a cluster's pool, serving/kv_pool.py); never for its own."""
        return False

    def take_prefix(self, req: Request, hit: int) -> float:
        """Start a waiting `req` from its `hit` cached tokens; returns the seconds loading
        them from a tier below HBM takes (0 here: nothing is cached)."""
        if hit:
            raise ValueError("no prefix cache to take tokens from")
        return 0.0

    def allocate(self, req: Request, num_new_tokens: int) -> bool:
        """Take the blocks for `num_new_tokens` more tokens of `req`, or change nothing.
        (The scheduler calls this for every running request every step: kept lean.)"""
        if self.hold is not None:
            return self._allocate_held(req, num_new_tokens)
        need = -(-(req.num_computed + num_new_tokens) // self.block_size) - req.blocks
        if need <= 0:
            return True
        if need > self.free:
            return False
        self.free -= need
        req.blocks += need
        used = self.num_blocks - self.free
        if used > self.peak_used:
            self.peak_used = used
        return True

    def _allocate_held(self, req: Request, num_new_tokens: int) -> bool:
        """`allocate` under a hold: blocks the window layers no longer need, or the budget
        evicted, go back first."""
        assert self.hold is not None
        held = self.hold.tokens(req.num_computed + num_new_tokens, req.prompt_len)
        need = self.blocks_for(held) - req.blocks
        if need > self.free:
            return False
        self.free -= need  # a negative need gives blocks back
        req.blocks += need
        self.peak_used = max(self.peak_used, self.num_blocks - self.free)
        return True

    def extend(self, reqs: list[Request], num_new_tokens: int) -> None:
        """Take the blocks for `num_new_tokens` more tokens of each of `reqs`, which the caller
        has checked fit (a run of decode steps; one loop instead of a call per request)."""
        if self.hold is not None:
            for req in reqs:
                if not self._allocate_held(req, num_new_tokens):
                    raise RuntimeError("KV blocks over-allocated: the caller's fit check was wrong")
            return
        size, free = self.block_size, self.free
        for req in reqs:
            need = -(-(req.num_computed + num_new_tokens) // size) - req.blocks
            if need > 0:
                req.blocks += need
                free -= need
        if free < 0:
            raise RuntimeError("KV blocks over-allocated: the caller's fit check was wrong")
        self.free = free
        self.peak_used = max(self.peak_used, self.num_blocks - free)

    def swap_out(self, req: Request) -> bool:
        """Move `req`'s blocks to host memory if the swap space holds them (else change
        nothing and return False)."""
        if req.blocks == 0 or req.blocks > self.host_free:
            return False
        self.host_free -= req.blocks
        req.swapped_blocks = req.blocks
        self.release(req)
        return True

    def swap_in(self, req: Request) -> int:
        """Give back the host blocks of a swapped request whose GPU blocks were just
        allocated; returns how many blocks came back."""
        blocks, req.swapped_blocks = req.swapped_blocks, 0
        self.host_free += blocks
        return blocks

    def release(self, req: Request) -> None:
        """Give back all of `req`'s blocks (finished or preempted)."""
        self.free += req.blocks
        req.blocks = 0


RUN = -3  # first field of an LRU entry that stands for a run of one request's own blocks


class PrefixCachingBlockManager(BlockManager):
    """vLLM's automatic prefix caching (V1 KVCacheManager), on block counts; used in place of
    `BlockManager` when it is on.

    A full block is known by a key that says what its tokens are (`key`: the request's shared
    prefix and token stream up to the block's end, see serving/sharing.py); equal keys mean equal
    tokens and the same KV, as vLLM's chained block hashes. Full blocks are registered when they
    are allocated (prompt and generated tokens alike, as vLLM caches them), counted by the running
    requests that hold them; a block whose key is already cached stays its holder's own copy.

    Blocks no request holds go to an LRU queue: still cached, counted as free (`free` = empty +
    unheld cached); an allocation takes empty blocks first, then evicts the least recently freed.
    A request frees its blocks last to first, so a prefix outlives its tail (vLLM frees in reverse
    order for the same reason).

    Admission (`prefix_hit`, `take_prefix`): the longest run of cached full blocks from the start,
    capped at all known tokens but one (the last is computed to sample from, as vLLM V1: a fully
    cached 48-token prompt with 16-token blocks reuses 32). A request readmitted after a
    preemption by recompute looks up again and finds its own blocks unless evicted.

    Blocks of a request's own content (past its shared prefix, outside any conversation) can only
    ever be found by itself, so they are not keyed one by one: when it frees them they enter the
    LRU queue as one entry (a run, evicted tail first), which keeps the cost of caching to the
    blocks that can be shared.

    Sliding-window layers (a `hold` with a window, vLLM V1's hybrid allocator: the blocks of
    window layers that fall out of the window are freed, SlidingWindowManager in
    vllm/v1/core/single_type_kv_cache_manager.py): a request of its own stream gives back the
    blocks the window frees, counted as in `BlockManager` but only out of its own content (at
    least its last own block stays), while its keyed shared-prefix blocks stay whole and
    shareable; its own blocks are not queued as a run when it ends (the window freed the
    oldest, so what is left no longer starts where its prefix ends). A conversation's requests
    keep every block (each is keyed for the next turn). A KV token budget (a `hold` with an
    eviction policy) is held the same way: once the prompt is in, the request keeps what its
    budget keeps out of its own content, its shared prefix whole (the cache holds the prefix's
    full KV, which later requests hit; the budget's selection is the request's own).

    Not modelled: hash collisions (keys are exact), the hybrid allocator's per-group prefix
    hits (a window layer needs only the window's blocks before the hit), cache salts and
    LoRA / multimodal extra keys (tiers for evicted blocks: `kv_tiers.TieredBlockManager`,
    which keeps every block).
    """

    prefix_caching = True

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
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
        self.empty = num_blocks  # free and holding nothing cached
        self.unheld = 0  # cached blocks no request holds (free, evictable)
        self.held: dict[BlockKey, int] = {}  # shared cached block -> requests holding it
        self.lru: OrderedDict[BlockKey, None] = OrderedDict()  # unheld entries, oldest first
        self.runs: dict[int, int] = {}  # own stream -> its leading blocks cached in `lru`
        self.evictions = 0
        self._version = 0  # changes whenever what is cached or held does
        self._probe: tuple[Request, int, list[BlockKey], int, int] | None = None

    @staticmethod
    def key(req: Request, end: int) -> BlockKey:
        """What tokens [0, end) of `req` are: (prefix id, tokens of it, stream, end); the
        stream is -1 while the block lies inside the prefix."""
        size = req.prefix_len
        if end <= size:
            return (req.prefix_id, end, -1, end)
        return (req.prefix_id if size else -1, size, req.stream, end)

    def _shareable(self, req: Request, full: int) -> int:
        """Of `req`'s first `full` full blocks, how many are keyed (all, in a conversation;
        else those inside its shared prefix)."""
        if req.stream < -1:
            limit = req.prefix_len // self.block_size
            return full if full < limit else limit
        return full

    # -- admission ----------------------------------------------------------------------------
    def _lookup(self, req: Request) -> tuple[list[BlockKey], int, int]:
        """The keyed cached blocks `req` could start from, how many of them are unheld, and
        how many blocks of its own run follow them."""
        probe = self._probe
        if probe is not None and probe[0] is req and probe[1] == self._version:
            return probe[2], probe[3], probe[4]
        keys: list[BlockKey] = []
        unheld = run = 0
        if req.num_computed == 0:
            held, lru, size = self.held, self.lru, self.block_size
            cap = (req.prompt_len + req.num_output - 1) // size
            shared = self._shareable(req, cap)
            for i in range(shared):
                key = self.key(req, (i + 1) * size)
                if key in held:
                    keys.append(key)
                elif key in lru:
                    keys.append(key)
                    unheld += 1
                else:
                    break
            if len(keys) == shared < cap:
                run = min(self.runs.get(req.stream, 0), cap - shared)
        self._probe = (req, self._version, keys, unheld, run)
        return keys, unheld, run

    def prefix_hit(self, req: Request) -> int:
        """Tokens of `req` (waiting, nothing computed) that the cache holds now."""
        keys, _, run = self._lookup(req)
        return (len(keys) + run) * self.block_size

    def can_admit(self, req: Request, num_new_tokens: int, *, hit: int = 0) -> bool:
        keys, unheld, run = self._lookup(req) if hit else ([], 0, 0)
        if (len(keys) + run) * self.block_size != hit:
            raise ValueError(f"{req}: hit {hit} is not what the cache holds")
        tokens = req.num_computed + hit + num_new_tokens
        blocks = self.blocks_for(tokens) if self.hold is None else self._windowed(req, tokens)
        # new blocks, plus the cached ones taken out of the free count (unheld keys, the run)
        need = blocks - req.blocks - len(keys) + unheld
        return need <= self.free - self.watermark_blocks

    def take_prefix(self, req: Request, hit: int) -> float:
        """Start `req` from its `hit` cached tokens: hold those blocks, count them computed
        (all in HBM: no load, 0 seconds)."""
        keys, unheld, run = self._lookup(req)
        if (len(keys) + run) * self.block_size != hit or req.blocks:
            raise ValueError(f"{req}: cannot take {hit} cached tokens")
        held, lru = self.held, self.lru
        for key in keys:
            if key in held:
                held[key] += 1
            else:
                del lru[key]
                held[key] = 1
        if run:  # the run leaves the queue; blocks of it past the hit hold nothing now
            whole = self.runs.pop(req.stream)
            del lru[(RUN, req.stream, 0, 0)]
            self.unheld -= whole
            self.empty += whole - run
        self.unheld -= unheld
        self.free -= unheld + run
        self.peak_used = max(self.peak_used, self.num_blocks - self.free)
        req.cache_keys = list(keys)
        req.blocks = len(keys) + run
        req.num_computed = hit
        if not req.preemptions:  # vLLM's num_cached_tokens: the first admission's hit
            req.cached_tokens = hit
        self._version += 1
        return 0.0

    # -- a sliding window ---------------------------------------------------------------------
    def _windowed(self, req: Request, tokens: int) -> int:
        """Blocks `req` holds with `tokens` computed under the window: all of them, less what
        the window frees, which comes out of its own content only (at least its last own
        block stays; a conversation's request keeps every block)."""
        assert self.hold is not None
        size = self.block_size
        full = -(-tokens // size)
        if req.stream >= -1:
            return full
        own = full - min(req.prefix_len // size, full)
        freed = full - -(-self.hold.tokens(tokens, req.prompt_len) // size)
        return full - max(0, min(freed, own - 1))

    def needed(self, req: Request, num_new_tokens: int) -> int:
        if self.hold is None:
            return super().needed(req, num_new_tokens)
        return max(0, self._windowed(req, req.num_computed + num_new_tokens) - req.blocks)

    def _take_windowed(self, req: Request, tokens: int) -> bool:
        """`allocate`'s blocks under a window: the blocks `req` holds with `tokens` computed,
        those the window freed back empty (nothing cached); False, changing nothing, when the
        new ones do not fit."""
        need = self._windowed(req, tokens) - req.blocks
        if need > self.free:
            return False
        if need > 0:
            self._take(need)
        elif need < 0:  # own blocks out of the window
            self.empty -= need
            self.free -= need
        req.blocks += need
        return True

    # -- the block accounting -----------------------------------------------------------------
    # A keyed block costs a few dict operations over its life (register, release, evict);
    # registration is skipped unless a block filled, since these run for every request each step.
    def allocate(self, req: Request, num_new_tokens: int) -> bool:
        tokens = req.num_computed + num_new_tokens
        size = self.block_size
        if self.hold is not None:
            if not self._take_windowed(req, tokens):
                return False
        elif (need := -(-tokens // size) - req.blocks) > 0:
            free = self.free
            if need > free:
                return False
            if need <= self.empty:  # `_take`'s common case, inlined: no eviction
                self.empty -= need
                free -= need
                self.free = free
                if self.num_blocks - free > self.peak_used:
                    self.peak_used = self.num_blocks - free
            else:
                self._take(need)
            req.blocks += need
        # only tokens already known (not speculative slots) are cached, as vLLM's cache_blocks
        known = req.prompt_len + req.num_output
        full, keyed = (tokens if tokens < known else known) // size, len(req.cache_keys)
        # (`_shareable` > keyed, inlined: a request's own stream is keyed within its prefix only)
        if full > keyed and (req.stream >= -1 or req.prefix_len // size > keyed):
            self._register(req, self._shareable(req, full))
        return True

    def extend(self, reqs: list[Request], num_new_tokens: int) -> None:
        """As `BlockManager.extend`, then key the blocks that filled (one pass over `reqs`:
        those with blocks to key are noted, and keyed once the new blocks are taken)."""
        if self.hold is not None:
            for req in reqs:
                if not self.allocate(req, num_new_tokens):
                    raise RuntimeError("KV blocks over-allocated: the caller's fit check was wrong")
            return
        size, need = self.block_size, 0
        filled: list[tuple[Request, int]] = []
        for req in reqs:
            tokens = req.num_computed + num_new_tokens
            full = tokens // size
            # blocks the tokens need: ceil(tokens / size), from the floor already taken
            more = (full if full * size == tokens else full + 1) - req.blocks
            if more > 0:
                req.blocks += more
                need += more
            # decode steps: each token is sampled by the step before its own, so all are known
            keyed = len(req.cache_keys)
            if full > keyed:
                stream = req.stream
                if stream >= -1:
                    filled.append((req, full))  # (`_shareable`, inlined as in `allocate`)
                else:
                    limit = req.prefix_len // size
                    if limit > keyed:
                        filled.append((req, full if full < limit else limit))
        free = self.free
        if need > free:
            raise RuntimeError("KV blocks over-allocated: the caller's fit check was wrong")
        if need and need <= self.empty:  # `_take`'s common case, inlined (as in `allocate`)
            self.empty -= need
            free -= need
            self.free = free
            if self.num_blocks - free > self.peak_used:
                self.peak_used = self.num_blocks - free
        elif need:
            self._take(need)
        for req, full in filled:
            self._register(req, full)

    def release(self, req: Request) -> None:
        """Free `req`'s blocks: its keyed ones to the LRU queue unless others hold them, its
        own run as one entry before them, the rest empty. Blocks registered for tokens it never
        computed (unscheduled in its last step) are not cached."""
        valid = req.num_computed // self.block_size
        private, unheld = req.blocks, 0
        lru = self.lru
        if req.stream < -1 and self.hold is None:
            own = valid - req.prefix_len // self.block_size
            if own > 0:
                unheld += self._queue_run(req.stream, own)
                private -= own
        keys = req.cache_keys
        if keys:
            held = self.held
            for i in range(len(keys) - 1, -1, -1):  # the tail first: evicted first
                key = keys[i]
                if key is None:
                    continue
                count = held.pop(key) - 1
                if count:
                    held[key] = count
                    private -= 1
                elif i < valid:
                    lru[key] = None
                    unheld += 1
                    private -= 1
            req.cache_keys = []
        self.empty += private
        self.unheld += unheld
        self.free += private + unheld
        req.blocks = 0
        self._version += 1

    def _queue_run(self, stream: int, blocks: int) -> int:
        """Queue `blocks` leading blocks of an own stream as one LRU entry; returns how many
        blocks became unheld (a copy left from before a swap-out is dropped: the newer run
        covers it)."""
        old = self.runs.pop(stream, 0)
        if old:
            del self.lru[(RUN, stream, 0, 0)]
            self.unheld -= old
            self.empty += old
        self.runs[stream] = blocks
        self.lru[(RUN, stream, 0, 0)] = None
        return blocks

    def _take(self, need: int) -> None:
        """Use `need` free blocks (the caller checked they exist): empty ones first, then the
        least recently freed cached ones, evicted (a run from its tail)."""
        empty = self.empty
        if need <= empty:
            self.empty = empty - need
        else:
            evict = need - empty
            self.empty, self.unheld = 0, self.unheld - evict
            self.evictions += evict
            self._version += 1
            lru, runs = self.lru, self.runs
            while evict > 0:
                key = next(iter(lru))  # the oldest entry
                if key[0] == RUN:
                    run = runs[key[1]]
                    if run > evict:  # its head stays, still the oldest entry
                        runs[key[1]] = run - evict
                        break
                    del runs[key[1]]
                    evict -= run
                else:
                    evict -= 1
                del lru[key]
        free = self.free - need
        self.free = free
        if self.num_blocks - free > self.peak_used:
            self.peak_used = self.num_blocks - free

    def _register(self, req: Request, full: int) -> None:
        """Key `req`'s first `full` blocks, those not yet keyed (as `key`, inlined)."""
        keys, size = req.cache_keys, self.block_size
        held, lru = self.held, self.lru
        prefix, stream = req.prefix_len, req.stream
        pid = req.prefix_id if prefix else -1
        for i in range(len(keys), full):
            end = (i + 1) * size
            key = (pid, end, -1, end) if end <= prefix else (pid, prefix, stream, end)
            if key in held or key in lru:
                keys.append(None)  # the cache has these tokens already: this copy stays ours
            else:
                held[key] = 1
                keys.append(key)
        self._version += 1
