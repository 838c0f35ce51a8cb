"""One serving replica (tp x pp GPUs) running the engine loop as a simpy process.

Each iteration: schedule (decide), cost the step, let time pass, apply the results. Runs of
decode-only steps whose batch cannot change (no request finishes, the KV cache has room, no
waiting request could be admitted) are advanced analytically as one segment: their step times
come from the step timer in one vectorised call; an arrival that could be admitted cuts the
segment at the end of the step in progress (engine steps are atomic). With speculative
decoding (a `speculator`) a step yields a varying number of tokens per request, so every step
goes through the scheduler (`_accepted` is the hook). With KV tiers below HBM
(`serving.kv_tiers`) a step first waits for the loads its plan carries (`load_s`), or requests
wait out of the batch while their blocks load over the host link (`loads`, one at a time) and
rejoin the queue's front when they are in.

Multi-step scheduling (`num_scheduler_steps` N > 1, vLLM V0): decode steps come in blocks of N
per scheduler call. Within a block no request is admitted (an arrival waits for the block's
end, not the step's), and the engine's scheduling CPU time (`StepTimer.cpu_s`) is paid by the
block's first step only. A request that finishes mid-block leaves the batch at once and the
block runs on with the rest; tokens are timed per step, as vLLM streams them with
--multi-step-stream-outputs (on by default from 0.6.2). vLLM 0.6.0 and 0.6.1 returned a block's
outputs at its end (`LLMEngine.step` processes them only once no step is left in the block):
with `multi_step_stream_outputs` off a request that reaches its length inside a block rides on
with the batch to the block's end (its steps cost as the others', they are neither outputs nor
context), and finishes there; the inter-token sample keeps each output's step time.

Scheduling one batch ahead (`SchedulerSpec.schedule_ahead`, SGLang's overlap scheduler): the
engine forms batch N+1 while step N runs, so a request that arrives during a step is held out
of the queue until the step after it has started (`_held`), and can join the batch after that;
a decode run it cuts goes on one step more. An idle replica (nothing running or queued) takes
it at once. The loop's CPU work running under the GPU's is the step timer's
(`EngineSpec.overhead`), not this.

Multi-LoRA (an `AdapterCache`, serving/lora.py): the scheduler keeps the running requests
within max_loras distinct adapters; a step first waits for the adapters it lacks to load into
their GPU slots, and its batched LoRA kernels (`costmodel.lora`) add to its time, in decode
segments too (their adapters do not change).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Generator, Iterable
from functools import partial
from typing import Any

import numpy as np
import simpy

from simulator.metrics.recorder import Recorder
from simulator.serving.kv_cache import BlockManager
from simulator.serving.kv_tiers import TieredBlockManager
from simulator.serving.lora import AdapterCache
from simulator.serving.request import Request
from simulator.serving.scheduler import AdmissionState, StepPlan, enqueue, schedule
from simulator.serving.speculative import Acceptance
from simulator.serving.steptime import Timer
from simulator.specs.serving import SchedulerSpec

MAX_SEGMENT_STEPS = 4096
Chunk = tuple[int, int, bool]  # prefill tokens, cached offset, is the prompt's last chunk


class Replica:
    def __init__(
        self,
        env: simpy.Environment,
        *,
        index: int,
        scheduler: SchedulerSpec,
        kv: BlockManager,
        timer: Timer,
        recorder: Recorder,
        on_finish: Callable[[Request], None],
        swap_s_per_block: float = 0.0,
        on_prefilled: Callable[[Request], None] | None = None,
        between_steps: Callable[[Replica], None] | None = None,
        speculator: Acceptance | None = None,
        lora: AdapterCache | None = None,
    ) -> None:
        self.env = env
        self.lora = lora  # multi-LoRA: the adapters' GPU slots and CPU cache (None: off)
        self._max_loras = 0 if lora is None else lora.max_loras
        self.index = index
        self.spec = scheduler
        self.kv = kv
        # a KV token budget: decodes attend to what their sequence keeps
        self._eviction = None if kv.hold is None else kv.hold.eviction
        self._timer = timer
        self.recorder = recorder
        self.on_finish = on_finish
        self.swap_s_per_block = swap_s_per_block  # host <-> GPU copy of one KV block
        # Disaggregated prefill: a request leaves `running` after its first token, its KV
        # blocks still held, and goes to `on_prefilled` (serving.disagg releases the blocks).
        self.on_prefilled = on_prefilled
        self.incoming = 0  # hand-offs routed here, not yet submitted (disaggregated decode)
        # Called at every step boundary, where no step counts on blocks it has yet to take
        # (disaggregated decode: hand-offs take their blocks, and join `running` once their KV
        # is in place, here).
        self.between_steps = between_steps
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        # Scheduling one batch ahead: arrivals during a step, with their arrival times, and
        # when the last step started (the batch after it was formed then)
        self._ahead = scheduler.schedule_ahead
        self._held: deque[tuple[float, Request]] = deque()
        self._last_start = -math.inf
        self._wakeup = env.event()
        self._decoding = False  # every running request is decoding (no prompt left)
        # Speculative decoding: decodes verify 1 + k tokens and accept a random number of them,
        # so decode runs cannot be advanced as segments of one token per step.
        self.speculator = speculator
        self._verify = 1 + scheduler.num_speculative_tokens
        self._segments = speculator is None
        self._last_end = math.nan  # when the last step ended
        # The step (or decode run) in progress, for a fleet power budget (serving.power):
        # (start_s, end_s, one step's seconds, num_seqs, prefill_tokens, decode_tokens)
        self.activity: tuple[float, float, float, int, int, int] | None = None
        # KV tiers loading between steps: requests whose blocks are on the way, and when the
        # host link is next free (loads queue on it)
        self._loading = 0
        self._link_free = 0.0
        # Multi-step scheduling: steps per scheduler call, and steps left in the current
        # decode block (0 at a block boundary, where the scheduler runs)
        self._multi_step = scheduler.num_scheduler_steps
        self._block_left = 0
        # vLLM 0.6.0-0.6.1: a block's tokens are returned at its end, and a request that
        # reaches its length inside the block computes on to it (`multi_step_stream_outputs`)
        self._block_outputs = self._multi_step > 1 and not scheduler.multi_step_stream_outputs
        # SGLang's new_token_ratio admission: the ratio, which every decode step moves
        self.admission = AdmissionState.of(scheduler)
        # A cluster's KV pool (serving/kv_pool.py): seconds it adds to a step (the exchange
        # with creditors, attention owed to debtors); None: not pooled
        self.pool_step: Callable[[Replica, StepPlan], float] | None = None
        self.process = env.process(self.run())

    # A property, not an attribute, because a stream of a partitioned replica asks its split
    # for the timer of the moment (serving/pd_partition.py; as `BlockManager.free`).
    @property
    def timer(self) -> Timer:
        return self._timer

    @timer.setter
    def timer(self, value: Timer) -> None:
        self._timer = value

    # -- the router's view ----------------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return (
            len(self.running) + len(self.waiting) + len(self._held) + self.incoming + self._loading
        )

    def wake(self) -> None:
        """Let an idle loop look again (blocks were freed from outside it)."""
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    def submit(self, req: Request) -> None:
        req.replica = self.index
        step = self.activity  # the step in flight, if any
        if self._ahead and step is not None and step[0] < self.env.now < step[1]:
            self._held.append((self.env.now, req))  # the next batch is formed: the one after
        else:
            enqueue(req, self.waiting, self.spec, front=False)
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    def _release_held(self) -> None:
        """Queue the held arrivals the next batch is formed with: those that came before the
        last step started, or all of them when nothing runs or waits (an idle engine forms
        its batch at once)."""
        held = self._held
        idle = not self.running and not self.waiting
        while held and (idle or held[0][0] <= self._last_start):
            enqueue(held.popleft()[1], self.waiting, self.spec, front=False)

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, Any, None]:
        while True:
            if self.between_steps is not None:
                self.between_steps(self)
            if self._held:
                self._release_held()
            if not self.running and not self.waiting:
                self._wakeup = self.env.event()
                yield self._wakeup
                continue
            if self._decoding and self.running and not self._admissible():
                # Every running request decodes and none can join: the scheduler would only
                # give each its next token. Skip it unless the cache cannot hold one more step.
                steps = self._segment_steps(self.running)
                if steps:
                    self.kv.extend(self.running, 1)  # the first step's slots, as scheduled
                    yield from self._decode_segment(list(self.running), steps)
                    continue
            plan = schedule(
                self.spec,
                running=self.running,
                waiting=self.waiting,
                kv=self.kv,
                state=self.admission,
                max_loras=self._max_loras,
            )
            if plan.loads:
                self._start_loads(plan.loads)
            if not plan.entries and (self._loading or (plan.preempted and self.kv.async_loads)):
                # KV tiers loading between steps: wait for a load; or the queue holds loaded
                # blocks, which the next pass frees if the preempted request needs them
                if not plan.preempted:
                    self._wakeup = self.env.event()
                    yield self._wakeup
                continue
            if not plan.entries and self.kv.used and (self.on_prefilled or self.between_steps):
                if not plan.preempted:  # the blocks are held by KV transfers in flight
                    self._wakeup = self.env.event()
                    yield self._wakeup
                continue
            if not plan.entries and self.kv.awaits_pool():  # room on loan or held elsewhere
                if not plan.preempted:
                    self._wakeup = self.env.event()
                    yield self._wakeup
                continue
            if not plan.entries:
                raise RuntimeError(f"replica {self.index}: nothing schedulable ({self.waiting[0]})")
            if plan.pure_decode and self._segments and not self._admissible():
                reqs = [r for r, _ in plan.entries]
                yield from self._decode_segment(reqs, self._segment_steps(reqs))
            else:
                yield from self._step(plan)
                self._decoding = self._segments and all(  # r.is_decoding, inlined
                    r.num_output and r.prompt_len + r.num_output - r.num_computed == 1
                    for r in self.running
                )

    def _admissible(self) -> bool:
        """Could the next step admit a waiting request (so the batch may change)? Never inside
        a multi-step block."""
        if self._block_left or not self.waiting or len(self.running) >= self.spec.max_num_seqs:
            return False
        if self.spec.kind == "static":
            return False
        if self.admission is not None:  # its room changes every step: ask the scheduler
            return True
        head = self.waiting[0]
        hit = self.kv.prefix_hit(head) if self.kv.prefix_caching else 0
        budget = self.spec.max_num_batched_tokens
        return self.kv.can_admit(head, min(head.remaining - hit, budget), hit=hit)

    def _step(self, plan: StepPlan) -> Generator[simpy.Event, Any, None]:
        self._block_left = 0  # a step the scheduler planned: the next decodes start a block
        start = self._last_start = self.env.now
        chunks, decodes = self.batch_of(plan)
        swaps = (plan.swapped_out + plan.swapped_in) * self.swap_s_per_block + plan.load_s
        # the sampler's host work for penalties grows with the output tokens
        outputs = _outputs(r for r, _ in plan.entries) if self.timer.penalises else (0, 0)
        step_s = self.timer.mixed(chunks=chunks, decode_contexts=decodes, outputs=outputs)
        if self.pool_step is not None:
            step_s += self.pool_step(self, plan)
        if self.lora is not None:
            swaps += self.lora.activate([r.adapter for r in self.running])
            tokens = sum([n for r, n in plan.entries if r.adapter >= 0])
            distinct = len({r.adapter for r, _ in plan.entries if r.adapter >= 0})
            step_s += self.lora.step_s(tokens, distinct)
            self.lora.count(distinct)
        prefill = sum([c[0] for c in chunks])
        self.activity = (
            start,
            start + swaps + step_s,
            step_s,
            len(plan.entries),
            prefill,
            len(decodes),
        )
        yield self.env.timeout(swaps + step_s)
        self.apply(plan, chunks=chunks, decodes=decodes, start=start, end=self.env.now)

    def batch_of(self, plan: StepPlan) -> tuple[list[Chunk], list[int]]:
        """The plan as the cost model prices it: prefill chunks and the KV lengths of the
        decodes (a decode: one token after the last sampled one, plus k proposals to verify
        when speculating); under a KV token budget, the KV a decode's sequence keeps."""
        chunks: list[Chunk] = []
        decodes: list[int] = []
        verify = self._verify  # tokens a decode computes: 1, or 1 + k when speculating
        eviction = self._eviction
        for req, n in plan.entries:
            computed = req.num_computed
            known = req.prompt_len + req.num_output  # req.known, inlined: every request
            if n == verify and computed + 1 == known and req.num_output > 0:
                if eviction is not None:
                    decodes.append(eviction.held(computed + 1, req.prompt_len))
                    continue
                decodes.append(computed + 1)
            else:
                chunks.append((n, computed, computed + n >= known))
        return chunks, decodes

    def apply(
        self,
        plan: StepPlan,
        *,
        chunks: list[Chunk],
        decodes: list[int],
        start: float,
        end: float,
    ) -> None:
        """The batch of `plan` (priced as `chunks` and `decodes`) ran from `start` to `end`:
        advance its requests' counters, sample where a prompt or a decode completed, record
        the step and the inter-token gaps. The step's KV blocks in use are counted before
        requests it finished free theirs."""
        kv_used = self.kv.used
        gaps: list[float] = []
        speculating = self.speculator is not None  # (the loop runs for every request)
        sampled, gap = self._sampled, gaps.append  # (locals, for the same reason)
        for req, n in plan.entries:
            if req.first_scheduled_s != req.first_scheduled_s:  # NaN: first time on the GPU
                req.first_scheduled_s = start
            computed = req.num_computed = req.num_computed + n
            proposals = computed - req.prompt_len - req.num_output
            if proposals >= 0:  # a token to sample, after verifying `proposals` speculated
                if req.num_output > 0:
                    gap(req.last_token_s)
                if speculating and proposals:
                    sampled(req, end, tokens=1 + self._accepted(req, proposals))
                else:
                    sampled(req, end)
        self._record_gaps(gaps, end)
        self.recorder.step(
            replica=self.index,
            start_s=start,
            end_s=end,
            num_seqs=len(plan.entries),
            prefill_tokens=sum(c[0] for c in chunks),
            decode_tokens=len(decodes) * self._verify,
            kv_used_blocks=kv_used,
        )
        if isinstance(self.kv, TieredBlockManager):
            self.recorder.kv_tiers(replica=self.index, time_s=end, row=self.kv.tier_row())

    def _start_loads(self, loads: tuple[tuple[Request, float], ...]) -> None:
        """KV tiers loading between steps: each request's blocks come over the host link,
        one load after another; it rejoins the queue's front when they are in."""
        for req, seconds in loads:
            self._link_free = max(self._link_free, self.env.now) + seconds
            self._loading += 1
            self.env.process(self._loaded(req, self._link_free))

    def _loaded(self, req: Request, at: float) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(at - self.env.now)
        self._loading -= 1
        enqueue(req, self.waiting, self.spec, front=True)
        self.wake()

    def _record_gaps(self, previous: list[float], now: float) -> None:
        """Inter-token gaps of tokens sampled at `now` whose previous tokens came at
        `previous`; those that came at the last step's end (most) are recorded as one gap."""
        last = self._last_end
        same = previous.count(last)
        if same:
            self.recorder.itl_weighted(now - last, same)
        if same < len(previous):
            self.recorder.itl([now - t for t in previous if t != last])
        self._last_end = now

    def _accepted(self, req: Request, proposals: int) -> int:
        """Speculative decoding: how many of the `proposals` tokens `req` just verified are
        accepted; the rejected ones are rolled back (their KV slots stay allocated)."""
        if not proposals or self.speculator is None:
            return 0
        accepted = self.speculator.accept(proposals)
        req.num_computed -= proposals - accepted
        return accepted

    def _sampled(self, req: Request, now: float, *, tokens: int = 1) -> None:
        """`tokens` more sampled at `now` (as one streamed chunk), capped at the output length."""
        num_output = req.num_output + tokens
        req.num_output = num_output if num_output < req.output_len else req.output_len
        req.last_token_s = now
        if req.num_output == 1:
            req.first_token_s = now
        if req.num_output >= req.output_len:
            self._finish(req, now)
        elif self.on_prefilled is not None:  # the KV moves to a decode replica
            self.running.remove(req)
            self.on_prefilled(req)

    def _finish(self, req: Request, now: float) -> None:
        req.finish_s = now
        self.kv.release(req)
        self.running.remove(req)
        self.on_finish(req)

    def _segment_steps(self, reqs: list[Request]) -> int:
        """How many decode steps `reqs` can run as they are: until the first finishes (with
        block outputs, the end of the block it finishes in), at most MAX_SEGMENT_STEPS, and as
        far as the KV cache holds (0 if not even one step)."""
        if self._block_outputs:  # requests past their length ride to the block's end
            left = [r.output_len - r.num_output for r in reqs if r.num_output < r.output_len]
            first = min(left) if left else MAX_SEGMENT_STEPS
            if len(left) < len(reqs):
                first = min(first, self._block_left or self._multi_step)
        else:
            first = min([r.output_len - r.num_output for r in reqs])
        return self._steps_kv_allows(reqs, min(MAX_SEGMENT_STEPS, first))

    def _decode_segment(self, reqs: list[Request], steps: int) -> Generator[simpy.Event, Any, None]:
        n = len(reqs)
        block = self._multi_step
        left = self._block_left or block  # steps to the end of the block in progress
        if block > 1 and self.waiting:  # the block's end is the next chance to admit
            steps = min(steps, left)
        if self._held:  # formed without the held arrivals: one step, then they may join
            steps = 1
        total = sum([r.num_computed for r in reqs]) + n
        if self._eviction is not None:  # what the sequences keep (the timer caps its growth)
            total = sum([self._eviction.held(r.num_computed + 1, r.prompt_len) for r in reqs])
        start = self.env.now
        plain = self.lora is None and block == 1  # durations as the timer gives them
        ends = (
            self.timer.decode_ends(start=start, num_seqs=n, total_context=float(total), steps=steps)
            if plain
            else None
        )
        if ends is None:
            outputs = _outputs(reqs) if self.timer.penalises else (0, 0)
            durations = self.timer.decode_run(
                num_seqs=n, total_context=float(total), steps=steps, outputs=outputs
            )
            if self.lora is not None:  # the same adapters every step (resident: no loads)
                lora = [r.adapter for r in reqs if r.adapter >= 0]
                durations = durations + self.lora.step_s(len(lora), len(set(lora)))
                durations[0] += self.lora.activate(lora)
            if block > 1:  # the scheduler's CPU time only where a block starts
                starts = np.zeros(steps, dtype=bool)
                starts[left % block :: block] = True  # index 0 when a block starts with it
                durations = durations - np.where(starts, 0.0, self.timer.cpu_s(n))
            ends = (start + np.cumsum(durations)).tolist()  # floats: the rest is Python
        last = ends[-1]
        self.activity = (start, last, (last - start) / steps, n, 0, n)
        if self.waiting and not self._loading:  # head blocked: arrivals cannot change it
            yield self.env.timeout(last - start)
            done = steps
        else:
            # the segment's end or an arrival, whichever comes first: the end's timeout
            # triggers the wakeup an arrival would (cheaper than a Condition of both)
            wake = self._wakeup = self.env.event()
            self.env.timeout(last - start).callbacks.append(partial(_trigger, wake))
            yield wake
            done = steps
            if self.env.now < last:  # cut short: finish the step (or block) in progress
                done = min(bisect_left(ends, self.env.now) + 1, steps)
                done = min(done + (left - done) % block, steps)
                if self.env.now < ends[done - 1]:
                    yield self.env.timeout(ends[done - 1] - self.env.now)
        self._block_left = (left - done) % block
        self._last_start = ends[done - 2] if done > 1 else start
        if self.lora is not None:
            self.lora.count(len({r.adapter for r in reqs if r.adapter >= 0}), done)
        if self.admission is not None and self.spec.admission is not None:
            self.admission.decayed(self.spec.admission, done)
        self._apply_segment(reqs, done, ends[:done], start)

    def _steps_kv_allows(self, reqs: list[Request], steps: int) -> int:
        """Most decode steps of `reqs`, up to `steps`, whose KV blocks the cache can hold
        (blocks already allocated count; 0 if not even one step fits)."""
        size = self.kv.block_size
        free = self.kv.free
        if free >= len(reqs) * (steps // size + 1):  # room for any growth
            return steps
        computed = np.fromiter((r.num_computed for r in reqs), float, len(reqs))
        held = np.fromiter((r.blocks for r in reqs), float, len(reqs))
        kv, hold = self.kv, self.kv.hold
        prompts = np.fromiter((r.prompt_len for r in reqs), float, len(reqs))

        def fits(k: int) -> bool:
            if hold is not None and kv.prefix_caching:  # a window frees own blocks only
                return sum([kv.needed(r, k) for r in reqs]) <= free
            tokens = computed + k if hold is None else hold.tokens_of(computed + k, prompts)
            return float(np.maximum(0.0, np.ceil(tokens / size) - held).sum()) <= free

        if fits(steps):
            return steps
        if not fits(1):
            return 0
        lo, hi = 1, steps
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    def _apply_segment(
        self, reqs: list[Request], done: int, ends: list[float], start: float
    ) -> None:
        n = len(reqs)
        first, last = ends[0], ends[-1]
        kv = self.kv
        used_before = kv.used
        kv.extend(reqs, done)  # the blocks these tokens filled (fits by construction)
        producing = reqs
        if self._block_outputs:  # those past their length compute on to the block's end
            producing = [r for r in reqs if r.num_output < r.output_len]
        gaps = [req.last_token_s for req in producing]
        finished = []
        for req in producing:
            req.num_computed += done
            num_output = req.num_output = req.num_output + done
            req.last_token_s = last
            if num_output >= req.output_len:
                finished.append(req)
        self._record_gaps(gaps, first)
        self._last_end = last
        self.recorder.decode_run(
            replica=self.index,
            start_s=start,
            end_s=ends,
            num_seqs=n,
            kv_before=used_before,
            kv_after=kv.used,
            outputs=len(producing),
        )
        if self._block_outputs:  # a block's outputs come at its end, with its riders
            if self._block_left:
                return
            finished = [r for r in reqs if r.num_output >= r.output_len]
        for req in finished:
            self._finish(req, last)


def _outputs(reqs: Iterable[Request]) -> tuple[int, int]:
    """The output tokens of `reqs` so far, summed, and the most any has (penalties' host work)."""
    counts = [r.num_output for r in reqs]
    return sum(counts), max(counts, default=0)


def _trigger(event: simpy.Event, _: simpy.Event) -> None:
    """Succeed `event` unless something else has (a timeout's callback)."""
    if not event.triggered:
        event.succeed()
