"""Schedulers: decide which requests compute how many tokens in the next step.

`schedule(...)` returns a StepPlan and changes only the queues and the KV blocks (through the
block manager; a prefix-cache hit also sets the request's computed tokens); the replica applies
the plan and advances time. Three policies (`kind`):

- `continuous`: vLLM V1. Running requests first, in order: each gets min(its remaining tokens,
  the budget left) (1 for a decode; a prompt in chunks when chunked prefill is on). If its KV
  blocks cannot be allocated, the most recently admitted running request is preempted until
  they can. Then waiting requests in queue order while the token budget, max_num_seqs and the
  KV cache (above the watermark) allow; the first that does not fit stops admission
  (head-of-line, as vLLM). No admissions in a step that preempted. Without chunked prefill
  a waiting prompt goes in whole or waits: whole prompts share the step with the running
  decodes (vLLM V1, TensorRT-LLM's in-flight batching; a profile's `unchunked_mixed`).
- `prefill_first`: a step either prefills or decodes every running request, and prefill goes
  first. Without chunked prefill (vLLM V0) it prefills whole prompts of waiting requests, as
  many as the budget holds. With chunked prefill (SGLang without --enable-mixed-chunk) the
  prompt begun in an earlier step continues first, then waiting requests are admitted, the
  last one in a chunk that fills the budget.
- `static`: a batch of up to max_num_seqs requests is admitted when nothing runs, prefilled
  together, and decoded until the last of them finishes; requests arriving meanwhile wait.

Queue order (`policy`): `fcfs` serves arrivals in order and puts preempted requests first;
`priority` (vLLM's --scheduling-policy priority) orders the queue by (priority, arrival) and
preempts the least urgent running request (unscheduling it if this step already had it).

Preemption (`preemption_mode`): `recompute` frees the blocks and restarts the request from zero
tokens computed; `swap` (vLLM V0's --preemption-mode swap) copies its blocks to the host swap
space, if they fit there (else it recomputes), and back when it is admitted again; the replica
charges the copies at the host link's bandwidth before the step.

With speculative decoding (`num_speculative_tokens` k) a decoding request is scheduled 1 + k
tokens (its last sampled token and k proposals), within the token budget.

With prefix caching (a PrefixCachingBlockManager) a request admitted with nothing computed
(new, or readmitted after a preemption by recompute) starts from its longest cached prefix:
those tokens count as computed and the rest is scheduled as usual (`continuous` and
`prefill_first`; `static` batches do not look up the cache). With KV tiers below HBM
(serving/kv_tiers.py) part of the prefix may need loading: the step waits for it (`load_s`),
or, when the tiers load between steps, the request leaves the queue until its blocks are in
(`loads`; the replica puts it back at the front).

Admission by new_token_ratio (`admission`, SGLang's PrefillAdder; `prefill_first` only): the
KV room left for new requests is the pool's free tokens less the running requests' remaining
outputs (each at most `clip_max_new_tokens`) times the ratio; the head of the queue joins only
if its prompt plus its max_new_tokens (clipped) is less than that room, and each request that
joins takes its prompt and full max_new_tokens out of it (a prompt cut into chunks, its chunk
alone). The ratio (`AdmissionState`, one per replica) falls by `decay` every decode step to
`min_ratio` and is `init_ratio` again when nothing runs. A decode step whose tokens do not fit
retracts requests instead of preempting the latest: the ones with the fewest output tokens
(the longest prompt among equals) go back to the end of the queue, recomputed later, until
the pool has `retract_decode_steps` tokens for each one left (0.3, 0.4) or, with
`retract_until_next_step` (0.5), at least one and then until the next decode step fits; the
ratio becomes (tokens decoded
+ retract_decode_steps x requests left) / their max_new_tokens, at most 1. max_new_tokens is
the request's output length here (what the client asks with ignore_eos). With nothing running
the head joins whenever its prompt fits (llmsim's guard, not SGLang's): a retracted request
asking for its prompt, its outputs so far and its full max_new_tokens could otherwise wait for
ever.

Multi-step scheduling (`num_scheduler_steps` N > 1, vLLM V0): the scheduler decides once per N
decode steps, so a request that arrives during a block of decodes waits for its end; the
replica loop keeps the blocks (serving/replica.py), the policies above are unchanged.

Multi-LoRA (`max_loras` > 0, vLLM's --max-loras): a step holds at most max_loras distinct
adapters. A waiting request whose adapter would be one too many is skipped, and the requests
behind it are considered, as vLLM V1's scheduler does (vllm/v1/core/sched/scheduler.py: it
sets such requests aside in `skipped_waiting_requests` and puts them back at the queue's
front); running requests already hold their adapters' slots.

Not modelled: the V1 scheduler's per-step encoder budget, running requests preempted in
favour of more urgent waiting ones.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from dataclasses import dataclass, field

from simulator.serving.kv_cache import BlockManager
from simulator.serving.request import Request
from simulator.specs.serving import NewTokenRatio, SchedulerSpec


@dataclass(slots=True)
class AdmissionState:
    """SGLang's new_token_ratio as it evolves on one replica (see the module doc)."""

    ratio: float

    @classmethod
    def of(cls, spec: SchedulerSpec) -> AdmissionState | None:
        adm = spec.admission
        return None if adm is None else cls(adm.init_ratio)

    def decayed(self, adm: NewTokenRatio, steps: int = 1) -> None:
        """After `steps` decode steps that found room."""
        self.ratio = max(self.ratio - steps * adm.decay, adm.min_ratio)


@dataclass(slots=True)
class StepPlan:
    """This step's work: (request, tokens to compute) pairs, and who was preempted."""

    entries: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    swapped_out: int = 0  # KV blocks copied to host memory before the step
    swapped_in: int = 0  # KV blocks copied back
    load_s: float = 0.0  # KV tiers: loads the step waits for (serving/kv_tiers.py)
    loads: tuple[tuple[Request, float], ...] = ()  # requests waiting out of the batch for theirs

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.entries)

    @property
    def pure_decode(self) -> bool:
        # from the last entry: admitted requests come last, so most mixed steps stop at once
        return (
            not self.preempted
            and not self.swapped_in
            and all(n == 1 and r.num_output > 0 for r, n in reversed(self.entries))
        )


def queue_key(req: Request) -> tuple[int, float, int]:
    """The priority policy's order: priority (lower first), then arrival."""
    return (req.priority, req.arrival_s, req.id)


def enqueue(req: Request, waiting: deque[Request], spec: SchedulerSpec, *, front: bool) -> None:
    """Add to the waiting queue: FCFS appends arrivals and puts preempted requests first; the
    priority policy keeps the queue in queue_key order."""
    if spec.policy == "priority":
        insort(waiting, req, key=queue_key)
    elif front:
        waiting.appendleft(req)
    else:
        waiting.append(req)


def preempt(
    req: Request, kv: BlockManager, waiting: deque[Request], spec: SchedulerSpec, plan: StepPlan
) -> None:
    """Swap its KV to host memory (if the mode is swap and the swap space has room) or drop it
    to be recomputed; back to the waiting queue either way."""
    if spec.preemption_mode == "swap" and kv.swap_out(req):
        plan.swapped_out += req.swapped_blocks
    else:
        kv.release(req)
        req.num_computed = 0
    req.preemptions += 1
    plan.preempted.append(req)
    enqueue(req, waiting, spec, front=True)


def _victim(running: list[Request], spec: SchedulerSpec) -> tuple[Request, int]:
    """Take out whom to preempt: the most recently admitted (FCFS) or the least urgent
    (priority); returns it and where it was in `running`."""
    at = len(running) - 1
    if spec.policy == "priority":
        at = max(range(len(running)), key=lambda j: queue_key(running[j]))
    return running.pop(at), at


def _schedule_running(
    spec: SchedulerSpec,
    running: list[Request],
    kv: BlockManager,
    waiting: deque[Request],
    budget: int,
    plan: StepPlan,
) -> int:
    entries = plan.entries
    speculated = spec.num_speculative_tokens
    allocate, append = kv.allocate, entries.append  # (locals: a call per running request)
    i = 0
    while i < len(running) and budget > 0:
        req = running[i]
        n = req.prompt_len + req.num_output - req.num_computed  # req.remaining
        if speculated and n == 1 and req.num_output:  # decoding: verify the proposals with it
            n += speculated
        if n > budget:
            n = budget
        while not allocate(req, n):
            victim, at = _victim(running, spec)
            if at < i:  # scheduled earlier in this step: unschedule it
                i -= 1
                k = next(j for j, (r, _) in enumerate(entries) if r is victim)
                budget += entries.pop(k)[1]
            preempt(victim, kv, waiting, spec, plan)
            if victim is req:
                break
        else:
            append((req, n))
            budget -= n
            i += 1
    return budget


def _admit(
    spec: SchedulerSpec,
    running: list[Request],
    waiting: deque[Request],
    kv: BlockManager,
    budget: int,
    plan: StepPlan,
    *,
    chunked: bool,
    room: float | None = None,
    max_loras: int = 0,
) -> int:
    """Admit waiting requests in queue order while the budget, max_num_seqs and the KV cache
    allow and, with `room` (new_token_ratio admission), while their prompt and clipped output
    stay below it; with `max_loras`, skipping those whose adapter would exceed it."""
    clip = spec.admission.clip_max_new_tokens if spec.admission is not None else 0
    adapters = {r.adapter for r in running if r.adapter >= 0} if max_loras else set()
    skipped: list[Request] = []
    while waiting and budget > 0 and len(running) < spec.max_num_seqs:
        req = waiting[0]
        if max_loras and req.adapter >= 0 and _one_too_many(req.adapter, adapters, max_loras):
            skipped.append(waiting.popleft())  # vLLM V1 skips it, and looks at the next
            continue
        hit = kv.prefix_hit(req) if kv.prefix_caching else 0  # cached tokens to start from
        remaining = req.remaining - hit
        if not chunked and remaining > budget:
            break
        max_new = min(req.output_len, clip)
        if room is not None and running and remaining + max_new >= room:
            break  # with nothing running the head joins if its prompt fits (see above)
        n = min(remaining, budget)
        if not kv.can_admit(req, n, hit=hit):
            if not running and kv.async_loads and _drop_loaded(waiting, kv):
                continue
            break
        if hit:
            load_s = kv.take_prefix(req, hit)
            if load_s and kv.async_loads:  # vLLM's offloading connector: loads between steps
                waiting.popleft()
                plan.loads += ((req, load_s),)
                continue
            plan.load_s += load_s
        kv.allocate(req, n)
        if req.swapped_blocks:
            plan.swapped_in += kv.swap_in(req)
        waiting.popleft()
        running.append(req)
        plan.entries.append((req, n))
        budget -= n
        if room is not None:
            room -= n + (max_new if n == remaining else 0)
        if req.adapter >= 0:
            adapters.add(req.adapter)
    waiting.extendleft(reversed(skipped))  # back at the front, in their order
    return budget


def _one_too_many(adapter: int, adapters: set[int], max_loras: int) -> bool:
    """Would a request of `adapter` take the step past `max_loras` distinct adapters?"""
    return adapter not in adapters and len(adapters) >= max_loras


def _room(spec: SchedulerSpec, running: list[Request], kv: BlockManager, ratio: float) -> float:
    """KV tokens left for new requests under new_token_ratio admission: the free (and
    evictable) pool less the running requests' remaining outputs x the ratio."""
    assert spec.admission is not None
    clip = spec.admission.clip_max_new_tokens
    reserved = sum([min(r.output_len - r.num_output, clip) for r in running]) * ratio
    return kv.free * kv.block_size - reserved


def _retract(
    spec: SchedulerSpec,
    running: list[Request],
    waiting: deque[Request],
    kv: BlockManager,
    plan: StepPlan,
    state: AdmissionState,
) -> None:
    """SGLang's decode step: if the pool has no room for every running request's next token,
    retract requests (see the module doc) and re-estimate the ratio; else decay it."""
    adm = spec.admission
    assert adm is not None
    if sum([kv.needed(r, 1) for r in running]) <= kv.free:
        state.decayed(adm)
        return
    keep = sorted(running, key=lambda r: (r.num_output, -r.prompt_len), reverse=True)

    def short(first: bool) -> bool:
        if adm.retract_until_next_step:  # 0.5: one at least, then until the next step fits
            return first or sum([kv.needed(r, 1) for r in keep]) > kv.free
        return kv.free * kv.block_size < len(keep) * adm.retract_decode_steps

    first = True
    while len(keep) > 1 and short(first):
        first = False
        victim = keep.pop()
        running.remove(victim)
        kv.release(victim)
        victim.num_computed = 0
        victim.preemptions += 1
        plan.preempted.append(victim)
        enqueue(victim, waiting, spec, front=False)  # to the end of the queue
    decoded = sum([r.num_output for r in running])
    asked = sum([r.output_len for r in running])
    state.ratio = min(1.0, (decoded + adm.retract_decode_steps * len(running)) / max(asked, 1))


def _continue_prompts(running: list[Request], kv: BlockManager, budget: int, plan: StepPlan) -> int:
    """Prefill-first with chunks: running requests whose prompt (or recomputation) is not
    done yet take their next chunk, in order, while the budget and KV blocks allow."""
    for req in running:
        if budget <= 0:
            break
        if req.is_decoding:  # waits for a decode step
            continue
        n = min(req.remaining, budget)
        if not kv.allocate(req, n):
            break
        plan.entries.append((req, n))
        budget -= n
    return budget


def _drop_loaded(waiting: deque[Request], kv: BlockManager) -> bool:
    """Nothing runs and the head does not fit: free the blocks of the last waiting request
    holding any (KV tiers: its loaded blocks, back to the cache, looked up again on admission)
    so that the head can start. False if no waiting request but the head holds blocks."""
    for req in reversed(waiting):
        if req is waiting[0]:
            return False
        if req.blocks:
            kv.release(req)
            req.num_computed = 0
            return True
    return False


def schedule(
    spec: SchedulerSpec,
    *,
    running: list[Request],
    waiting: deque[Request],
    kv: BlockManager,
    state: AdmissionState | None = None,
    max_loras: int = 0,
) -> StepPlan:
    """Decide the next step (mutating the queues and KV blocks; token counters only to start a
    request from its cached prefix). `state`: the replica's new_token_ratio where the spec
    admits by it (None: a fresh one at its initial ratio). `max_loras`: the most distinct LoRA
    adapters a step may hold (0: no adapters, no bound)."""
    plan = StepPlan()
    budget = spec.max_num_batched_tokens
    match spec.kind:
        case "continuous":
            budget = _schedule_running(spec, running, kv, waiting, budget, plan)
            if not plan.preempted:
                _admit(
                    spec,
                    running,
                    waiting,
                    kv,
                    budget,
                    plan,
                    chunked=spec.chunked_prefill,
                    max_loras=max_loras,
                )
        case "prefill_first":
            if spec.admission is not None and state is None:
                state = AdmissionState(spec.admission.init_ratio)
            if state is not None and not running:  # an idle server starts over (SGLang)
                assert spec.admission is not None
                state.ratio = spec.admission.init_ratio
            if spec.chunked_prefill:
                budget = _continue_prompts(running, kv, budget, plan)
            room = None if state is None else _room(spec, running, kv, state.ratio)
            if room is not None:
                room -= sum([n for _, n in plan.entries])  # the chunks continuing
            _admit(
                spec,
                running,
                waiting,
                kv,
                budget,
                plan,
                chunked=spec.chunked_prefill,
                room=room,
                max_loras=max_loras,
            )
            if not plan.entries:
                if state is not None and running:
                    _retract(spec, running, waiting, kv, plan, state)
                _schedule_running(spec, running, kv, waiting, budget, plan)
        case "static":
            if not running:  # the next batch joins together, then runs to completion
                adapters: set[int] = set()
                while (
                    waiting
                    and len(running) < spec.max_num_seqs
                    and kv.can_admit(waiting[0], waiting[0].remaining)
                ):
                    a = waiting[0].adapter
                    if max_loras and a >= 0 and a not in adapters:
                        if len(adapters) >= max_loras:
                            break  # the batch is full of adapters: the rest wait for the next
                        adapters.add(a)
                    running.append(waiting.popleft())
            _schedule_running(spec, running, kv, waiting, budget, plan)
    return plan
