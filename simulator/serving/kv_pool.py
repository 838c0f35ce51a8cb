"""A cluster's KV caches pooled across its replicas: Infinite-LLM's distributed KV cache.

Infinite-LLM (Lin et al., "Infinite-LLM: Efficient LLM Service for Long Context with
DistAttention and Distributed KVCache", arXiv 2401.02669) lets an instance whose KV cache is
full borrow free blocks of other instances instead of queueing or preempting: each instance's
rManager keeps its blocks, a gManager matches debtors (instances short of room) with creditors
(instances with room to spare), and attention over the borrowed blocks runs on the creditor
(DistAttention: the query goes out, the partial attention output and its softmax statistics
come back, and the debtor merges them with its local part).

Here (`KvPoolSpec`, `mode: distributed`):

- Each replica's cache is a `PooledBlockManager`: its own blocks first; when they run out,
  `free` also counts what the other replicas can lend, and `allocate` borrows the rest from the
  creditors on its own node first, then from those with the most room to spare (greedy, the
  gManager's choice in miniature; replicas fill nodes in scenario order, `replica_nodes`). A
  replica lends what it has free above its watermark and above what its own running requests
  will still grow into, at most `max_lend_fraction` of its blocks; one borrowing does not lend
  and one lending does not borrow (the paper's debtor and creditor roles). Lent blocks count
  as used on the creditor: its admission sees less room, and it waits (rather than fails)
  when its room is out on loan. A request gives its borrowed blocks back when it finishes or
  is preempted; every other replica is then woken to look again.
- Admission (`PooledBlockManager.can_admit`): a request whose whole KV fits its replica's
  cache is admitted by vLLM's rule on that cache alone; its growth may then borrow where vLLM
  would preempt. Any other starts only when all its KV fits beside the running requests'
  growth with what replicas without a queue (or idle) can lend: one started on room it cannot
  finish in would be preempted and recomputed over and over.
- A step of a debtor pays the query/result exchange with its creditors (`PoolLink.exchange_s`):
  per layer, each query token of a request with borrowed blocks sends its query (heads x head
  dim in the activation dtype) and receives its partial output (heads x value dim) and two
  fp32 softmax statistics per head (running max and sum), each GPU its TP share on its own
  link, plus a round trip of the link's latency per layer. With the link `auto` and a pool
  over several nodes, creditors on the debtor's node are reached over the GPU fabric (NVLink;
  PCIe without one) and the others over the scale-out network, the two at once (a step pays
  the longer); one node, or a link named in the spec, prices every creditor alike.
- The creditor's attention over the borrowed tokens is priced by the creditor's own step timer
  (the step's GPU time with the borrowed context, less the same step without it) and added to
  the creditor's next step.
- The debtor's own step is priced as if it attended every token of its requests: its local
  part and the creditor's run at once, so on identical devices that is an upper bound on the
  longer of the two.

Not modelled: the paper's migration of blocks back when room frees (its debt graph: here a
debtor never lends, so no circle of debts forms), overlap of the exchange with the debtor's
other layers. Decode runs are stepped one
by one in a pool (no analytic segments): another replica's admission may take the room a run
would need.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.costmodel.deployment import Deployment
from simulator.errors import SpecError
from simulator.serving.kv_cache import BlockManager
from simulator.serving.kv_transfer import (
    LinkFactors,
    device_link,
    fabric_kind,
    link_factors,
    resolve_link_kind,
)
from simulator.serving.request import Request
from simulator.specs.model import MLAttention
from simulator.specs.serving import KvPoolSpec

if TYPE_CHECKING:
    from simulator.serving.group import ReplicaGroup
    from simulator.serving.replica import Replica
    from simulator.serving.scheduler import StepPlan

__all__ = [
    "KvPool",
    "PoolLink",
    "PoolPlan",
    "PooledBlockManager",
    "install",
    "pool_link",
    "pool_plan",
    "query_bytes_per_token",
    "replica_nodes",
]

ACT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
STAT_BYTES_PER_HEAD = 2 * 4  # DistAttention's softmax statistics: a max and a sum, fp32


def query_bytes_per_token(dep: Deployment) -> float:
    """Bytes one query token exchanges with a creditor per layer and per GPU: its query out,
    its partial output and softmax statistics back (TP ranks each send their heads)."""
    att = dep.model.attention
    act = ACT_BYTES[dep.precision.activations]
    if isinstance(att, MLAttention):  # the absorbed path: queries and outputs in the latent
        q = att.kv_lora_rank + att.qk_rope_head_dim
        out = att.kv_lora_rank
    else:
        q = out = att.head_dim
    per_head = (q + out) * act + STAT_BYTES_PER_HEAD
    return att.num_heads * per_head / dep.layout.tp


@dataclass(frozen=True)
class PoolLink:
    """What joins one replica group to the pool: the achieved bandwidth per GPU and direction,
    the latency, and the bytes a query token exchanges per layer and GPU."""

    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float
    bytes_per_token_layer: float
    num_layers: int

    def exchange_s(self, query_tokens: int) -> float:
        """Seconds a step's `query_tokens` (those of requests with borrowed blocks) spend
        going out and coming back, layer after layer."""
        if not query_tokens:
            return 0.0
        wire = query_tokens * self.bytes_per_token_layer / self.bandwidth_bytes_per_s
        return self.num_layers * (2.0 * self.latency_s + wire)


def pool_link(spec: KvPoolSpec, deps: Sequence[tuple[Deployment, int]]) -> list[PoolLink]:
    """Each replica group's link to the pool (`deps`: each group's deployment and replica
    count). The slower end sets the bandwidth as `kv_transfer` resolves its links."""
    try:
        kind = resolve_link_kind(spec.link, deps)
    except SpecError as exc:
        raise SpecError(exc.reason, field="kv_pool.link") from None
    factors = link_factors()
    ends = [device_link(kind, dep.hardware, factors) for dep, _ in deps]
    return [_link(kind, ends, dep) for dep, _ in deps]


def _link(kind: str, ends: Sequence[tuple[float, float]], dep: Deployment) -> PoolLink:
    """`dep`'s PoolLink over `kind` whose ends are `ends` (bandwidth, latency): the slower end
    sets the bandwidth, the longer the latency."""
    return PoolLink(
        kind=kind,
        bandwidth_bytes_per_s=min(bw for bw, _ in ends),
        latency_s=max(lat for _, lat in ends),
        bytes_per_token_layer=query_bytes_per_token(dep),
        num_layers=dep.model.num_layers,
    )


def _fabric_link(dep: Deployment, factors: LinkFactors) -> PoolLink:
    """`dep`'s PoolLink to creditors on its own node: the node's GPU fabric."""
    kind = fabric_kind(dep.hardware)
    return _link(kind, [device_link(kind, dep.hardware, factors)], dep)


class PooledBlockManager(BlockManager):
    """A replica's KV cache in a pool (see the module doc). `free` is the room this replica
    may use now: its own free blocks, plus what the others can lend unless it is lending."""

    pooled = True

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        watermark: float,
        host_blocks: int,
        pool: KvPool,
        link: PoolLink,
        node: int = 0,
        local_link: PoolLink | None = None,
    ) -> None:
        self.pool = pool
        self.link = link  # to the creditors (on other nodes, where `local_link` is set)
        self.node = node
        self.local_link = local_link  # to creditors on its own node (None: `link`)
        self.lent = 0  # blocks of this cache other replicas hold
        self.borrowed = 0  # blocks of other caches this replica's requests hold
        self.loans: dict[int, dict[int, int]] = {}  # request id -> {creditor member: blocks}
        self.pending_s = 0.0  # creditor attention owed to debtors, added to the next step
        super().__init__(
            num_blocks=num_blocks,
            block_size=block_size,
            watermark=watermark,
            host_blocks=host_blocks,
        )
        self.member = pool.join(self)

    # `free` is read by the scheduler, the replica and the router as "room to use"; only this
    # class writes the cache's own count (`_own`), so the setter serves __init__ alone.
    @property
    def free(self) -> int:
        return self._own + self.pool.room_for(self)

    @free.setter
    def free(self, value: int) -> None:
        self._own = value

    def can_admit(self, req: Request, num_new_tokens: int, *, hit: int = 0) -> bool:
        """As `BlockManager.can_admit` on this cache alone (vLLM's rule) for a request whose
        whole KV could fit it; otherwise (or when its next blocks do not fit here) a request
        starts only if all its KV fits here beside what the running requests will grow into,
        with what replicas with empty queues can lend now: a request started on borrowed room
        it cannot finish in would be preempted and recomputed over and over."""
        room = self._own - self.watermark_blocks
        whole = self.blocks_for(req.prompt_len + req.output_len) - req.blocks
        fits_here = whole + req.blocks <= self.num_blocks - self.watermark_blocks
        if fits_here and self.needed(req, hit + num_new_tokens) <= room:
            return True
        home = room - self.pool.growth(self)
        return whole <= home + self.pool.room_for(self, admitting=True)

    @property
    def own_free(self) -> int:
        """Blocks of this cache no request holds."""
        return self._own

    @property
    def used(self) -> int:
        """This cache's blocks in use: its own requests' and those lent out."""
        return self.num_blocks - self._own

    def awaits_pool(self) -> bool:
        """Whether a replica with nothing it can schedule should wait for blocks to come back:
        some replica of the pool holds blocks, which its requests will free."""
        return self.pool.busy()

    def allocate(self, req: Request, num_new_tokens: int) -> bool:
        need = self.blocks_for(req.num_computed + num_new_tokens) - req.blocks
        if need <= 0:
            return True
        if need > self.free:
            return False
        self._take(req, need)
        return True

    def extend(self, reqs: list[Request], num_new_tokens: int) -> None:
        for req in reqs:
            if not self.allocate(req, num_new_tokens):
                raise RuntimeError("KV blocks over-allocated: the caller's fit check was wrong")

    def _take(self, req: Request, need: int) -> None:
        """`need` more blocks for `req`: its own first, the rest borrowed."""
        own = min(need, self._own)
        self._own -= own
        if need > own:
            self.pool.borrow(self, req, need - own)
        req.blocks += need
        used = self.num_blocks - self._own
        if used > self.peak_used:
            self.peak_used = used

    def release(self, req: Request) -> None:
        loans = self.loans.pop(req.id, None)
        back = 0
        if loans:
            back = self.pool.repay(self, loans)
        self._own += req.blocks - back
        req.blocks = 0
        self.pool.wake(self)  # room came back: here, on creditors, or to lend

    def borrowed_tokens(self, req: Request) -> dict[int, int]:
        """Tokens of `req` held on each creditor (by member index): its last blocks."""
        loans = self.loans.get(req.id)
        if not loans:
            return {}
        size = self.block_size
        return {m: n * size for m, n in loans.items()}


class KvPool:
    """The pool's members (one `PooledBlockManager` per replica) and their loans."""

    def __init__(self, spec: KvPoolSpec) -> None:
        self.spec = spec
        self.members: list[PooledBlockManager] = []
        self.replicas: list[Replica | None] = []
        # what the run did: peak blocks on loan, requests that borrowed, seconds spent
        self.peak_lent = 0
        self.borrowers: set[tuple[int, int]] = set()
        self.exchange_s = 0.0
        self.remote_s = 0.0
        self.on_loan = 0

    def join(self, kv: PooledBlockManager) -> int:
        self.members.append(kv)
        self.replicas.append(None)
        return len(self.members) - 1

    def attach(self, replica: Replica) -> None:
        """Bind a built replica to its cache's membership (for waking and pricing)."""
        kv = replica.kv
        if not isinstance(kv, PooledBlockManager) or kv.pool is not self:
            raise ValueError("the replica's cache is not in this pool")
        self.replicas[kv.member] = replica

    # -- room -----------------------------------------------------------------------------------
    def lendable(self, kv: PooledBlockManager, *, admitting: bool = False) -> int:
        """Blocks `kv` can lend now: free above its watermark, within its lending cap; none
        while it borrows. To admit a new request (`admitting`), none either while requests
        wait in its queue (it needs its room itself); a running request may still grow into
        it, so that the requests holding loans finish and give them back."""
        if kv.borrowed:
            return 0
        if admitting:  # (an idle replica whose queue waits for room lends all the same)
            replica = self.replicas[kv.member]
            if replica is not None and replica.waiting and replica.running:
                return 0
        cap = int(self.spec.max_lend_fraction * kv.num_blocks) - kv.lent
        spare = kv._own - kv.watermark_blocks
        spare -= self.growth(kv)  # what its running requests still grow into stays home
        return max(0, min(spare, cap))

    def growth(self, kv: PooledBlockManager) -> int:
        """Blocks the running requests of `kv`'s replica still need to finish."""
        replica = self.replicas[kv.member]
        if replica is None:
            return 0
        size, total = kv.block_size, 0
        for r in replica.running:
            more = -(-(r.prompt_len + r.output_len) // size) - r.blocks
            if more > 0:
                total += more
        return total

    def room_for(self, debtor: PooledBlockManager, *, admitting: bool = False) -> int:
        """Blocks `debtor` could borrow now (none while it lends)."""
        if debtor.lent:
            return 0
        return sum([self.lendable(m, admitting=admitting) for m in self.members if m is not debtor])

    def busy(self) -> bool:
        return any(m.used for m in self.members)

    def borrow(self, debtor: PooledBlockManager, req: Request, blocks: int) -> None:
        """Lend `blocks` to `req` of `debtor`, from the creditors on its node first, then from
        those with the most room."""
        creditors = sorted(
            (m for m in self.members if m is not debtor),
            key=lambda m: (m.node != debtor.node, -self.lendable(m), m.member),
        )
        loans = debtor.loans.setdefault(req.id, {})
        left = blocks
        for creditor in creditors:
            if not left:
                break
            take = min(left, self.lendable(creditor))
            if take <= 0:  # (one on its node with nothing to lend: the next)
                continue
            creditor._own -= take
            creditor.lent += take
            creditor.peak_used = max(creditor.peak_used, creditor.num_blocks - creditor._own)
            loans[creditor.member] = loans.get(creditor.member, 0) + take
            left -= take
        if left:
            raise RuntimeError("KV pool over-lent: the caller's fit check was wrong")
        debtor.borrowed += blocks
        self.on_loan += blocks
        self.peak_lent = max(self.peak_lent, self.on_loan)
        self.borrowers.add((debtor.member, req.id))

    def repay(self, debtor: PooledBlockManager, loans: dict[int, int]) -> int:
        """Give `loans` (creditor member -> blocks) back; returns the blocks repaid."""
        total = 0
        for member, blocks in loans.items():
            creditor = self.members[member]
            creditor._own += blocks
            creditor.lent -= blocks
            total += blocks
        debtor.borrowed -= total
        self.on_loan -= total
        return total

    def wake(self, kv: PooledBlockManager) -> None:
        """Room came back: let the other replicas look again."""
        for replica in self.replicas:
            if replica is not None and replica.kv is not kv:
                replica.wake()

    # -- pricing --------------------------------------------------------------------------------
    def step_s(self, replica: Replica, plan: StepPlan) -> float:
        """Seconds the pool adds to `replica`'s step of `plan`: its exchange with the creditors
        of its requests' borrowed blocks, and the attention it owes as a creditor (queued by
        other replicas' steps). Queues this step's remote attention on its creditors."""
        kv = replica.kv
        if not isinstance(kv, PooledBlockManager):
            return 0.0
        extra = kv.pending_s
        kv.pending_s = 0.0
        self.remote_s += extra
        if not kv.borrowed:
            return extra
        # query tokens sent out: in all, to creditors on its node, to those elsewhere
        queried = local = remote = 0
        work: dict[int, tuple[list[tuple[int, int, bool]], list[int]]] = {}
        for req, n in plan.entries:
            held = kv.borrowed_tokens(req)
            if not held:
                continue
            queried += n
            near = {self.members[member].node == kv.node for member in held}
            local += n if True in near else 0
            remote += n if False in near else 0
            for member, tokens in held.items():
                chunks, decodes = work.setdefault(member, ([], []))
                if n == 1:
                    decodes.append(tokens + 1)
                else:
                    chunks.append((n, tokens, False))
        for member, (chunks, decodes) in work.items():
            creditor = self.replicas[member]
            if creditor is None:
                continue
            timer = creditor.timer
            with_context = timer.kernel_s(chunks=chunks, decode_contexts=decodes)
            bare = timer.kernel_s(
                chunks=[(n, 0, last) for n, _, last in chunks], decode_contexts=[1] * len(decodes)
            )
            self.members[member].pending_s += max(0.0, with_context - bare)
        if kv.local_link is None:  # one link to every creditor: each token goes out once
            exchange = kv.link.exchange_s(queried)
        else:  # the fabric and the network at once
            exchange = max(kv.local_link.exchange_s(local), kv.link.exchange_s(remote))
        self.exchange_s += exchange
        return extra + exchange

    def summary(self) -> dict[str, float]:
        """What the pool did over the run."""
        return {
            "requests_borrowing": float(len(self.borrowers)),
            "peak_blocks_on_loan": float(self.peak_lent),
            "exchange_s": self.exchange_s,
            "remote_attention_s": self.remote_s,
        }


@dataclass(frozen=True)
class PoolPlan:
    """A distributed pool as `serving.cluster.serve` takes it: the spec, each replica group's
    link (`pool_link`) and link to creditors on its own node (None: the same), and each
    replica's node (`replica_nodes`, by replica index)."""

    spec: KvPoolSpec
    links: tuple[PoolLink, ...]
    local_links: tuple[PoolLink | None, ...] = ()
    nodes: tuple[int, ...] = ()


def replica_nodes(deps: Sequence[tuple[Deployment, int]]) -> list[int]:
    """The node of each replica (in scenario order), replicas filling nodes in turn: one that
    does not fit what is left of a node starts the next, one of several nodes takes them
    whole, and a group of another hardware type starts a node of its own."""
    nodes: list[int] = []
    node, used, hardware = 0, 0, None
    for dep, count in deps:
        per_node = dep.hardware.interconnect.gpus_per_node
        gpus = dep.layout.devices_per_replica
        if hardware is not None and dep.hardware.id != hardware and used:
            node, used = node + 1, 0
        hardware = dep.hardware.id
        for _ in range(count):
            if used and used + gpus > per_node:
                node, used = node + 1, 0
            nodes.append(node)
            if gpus >= per_node:  # whole nodes of its own
                node, used = node + -(-gpus // per_node), 0
            else:
                used += gpus
    return nodes


def pool_plan(spec: KvPoolSpec | None, deps: Sequence[tuple[Deployment, int]]) -> PoolPlan | None:
    """The pool a scenario's `kv_pool` asks for over its groups (`deps`: deployment, replica
    count); None when off. With the link `auto` over several nodes, creditors on a debtor's
    node are priced over the GPU fabric (`local_links`), the others over the network."""
    if spec is None or spec.mode == "off":
        return None
    links = tuple(pool_link(spec, deps))
    nodes = tuple(replica_nodes(deps))
    local: tuple[PoolLink | None, ...] = (None,) * len(links)
    if spec.link == "auto" and len(set(nodes)) > 1:
        factors = link_factors()
        local = tuple(_fabric_link(dep, factors) for dep, _ in deps)
    return PoolPlan(spec=spec, links=links, local_links=local, nodes=nodes)


def install(
    plan: PoolPlan,
    replicas: Sequence[Replica],
    groups: Sequence[ReplicaGroup],
    group_of: dict[int, int],
    *,
    longest: int = 0,
) -> KvPool:
    """Put every replica's KV cache in one pool (before the simulation runs): each gets an
    empty `PooledBlockManager` of its group's size, steps one decode at a time, and has the
    pool price its steps. SpecError for a group whose cache cannot be pooled, or when the
    `longest` request (prompt + output tokens) would not fit a replica's cache with all the
    others lend."""
    if len(plan.links) != len(groups):
        raise ValueError(f"{len(plan.links)} pool links for {len(groups)} replica groups")
    for g, group in enumerate(groups):
        why = ""
        if group.loop is not None:
            why, field = "DP-attention ranks or pipeline micro-batches", "data_parallel_size"
        elif group.kv_tiers is not None:
            why, field = "KV offload tiers", "kv_offload"
        elif group.enable_prefix_caching:
            why, field = "prefix caching (shared blocks)", "enable_prefix_caching"
        elif group.kv_hold is not None:
            why, field = "sliding windows or a KV budget (held blocks)", "kv_budget"
        if why:
            raise SpecError(
                f"a distributed kv_pool lends plain KV blocks, not those of {why}",
                field=f"replicas.{g}.{field}",
            )
    _check_room(plan.spec, replicas, groups, group_of, longest)
    pool = KvPool(plan.spec)
    for replica in replicas:
        group = groups[group_of[replica.index]]
        replica.kv = PooledBlockManager(
            num_blocks=group.num_blocks,
            block_size=group.block_size,
            watermark=group.scheduler.watermark,
            host_blocks=group.host_blocks,
            pool=pool,
            link=plan.links[group_of[replica.index]],
            node=plan.nodes[replica.index] if plan.nodes else 0,
            local_link=plan.local_links[group_of[replica.index]] if plan.local_links else None,
        )
        replica._segments = False
        replica.pool_step = pool.step_s
        pool.attach(replica)
    return pool


def _check_room(
    spec: KvPoolSpec,
    replicas: Sequence[Replica],
    groups: Sequence[ReplicaGroup],
    group_of: dict[int, int],
    longest: int,
) -> None:
    """SpecError unless a request of `longest` tokens fits on every replica with what all
    the others can lend (their blocks above the watermark, within the lending cap)."""

    def lends(group: ReplicaGroup) -> int:
        spare = group.num_blocks - int(group.scheduler.watermark * group.num_blocks)
        return min(spare, int(spec.max_lend_fraction * group.num_blocks))

    everyone = sum(lends(groups[group_of[r.index]]) for r in replicas)
    for g, group in enumerate(groups):
        if not any(group_of[r.index] == g for r in replicas):
            continue
        own = group.num_blocks - int(group.scheduler.watermark * group.num_blocks)
        room = own + everyone - lends(group)
        need = -(-longest // group.block_size)
        if need > room:
            raise SpecError(
                f"the longest request needs {need} KV blocks, a replica of group {g} holds "
                f"{room} with what the pool lends it",
                field="workload",
            )
