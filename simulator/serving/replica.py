"""One serving replica (tp x pp GPUs) running the engine loop as a simpy process.

Each iteration: schedule (decide), cost the step, let time pass, apply the results. Runs of
decode-only steps whose batch cannot change (no request finishes, the KV cache has room, no
waiting request could be admitted) are advanced analytically as one segment: their step times
come from the step timer in one vectorised call; an arrival that could be admitted cuts the
segment at the end of the step in progress (engine steps are atomic).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from simulator.metrics.recorder import Recorder
from simulator.serving.kv_cache import BlockManager
from simulator.serving.request import Request
from simulator.serving.scheduler import SchedulerSpec, StepPlan, schedule
from simulator.serving.steptime import StepTimer

MAX_SEGMENT_STEPS = 4096


class Replica:
    def __init__(
        self,
        env: simpy.Environment,
        *,
        index: int,
        scheduler: SchedulerSpec,
        kv: BlockManager,
        timer: StepTimer,
        recorder: Recorder,
        on_finish: Callable[[Request], None],
    ) -> None:
        self.env = env
        self.index = index
        self.spec = scheduler
        self.kv = kv
        self.timer = timer
        self.recorder = recorder
        self.on_finish = on_finish
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self._wakeup = env.event()
        self.process = env.process(self.run())

    # -- the router's view ----------------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return len(self.running) + len(self.waiting)

    def submit(self, req: Request) -> None:
        req.replica = self.index
        self.waiting.append(req)
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, Any, None]:
        while True:
            if not self.running and not self.waiting:
                self._wakeup = self.env.event()
                yield self._wakeup
                continue
            plan = schedule(self.spec, running=self.running, waiting=self.waiting, kv=self.kv)
            if not plan.entries:
                raise RuntimeError(f"replica {self.index}: nothing schedulable ({self.waiting[0]})")
            if plan.pure_decode and not self._admissible():
                yield from self._decode_segment(plan)
            else:
                yield from self._step(plan)

    def _admissible(self) -> bool:
        """Could the next step admit a waiting request (so the batch may change)?"""
        if not self.waiting or len(self.running) >= self.spec.max_num_seqs:
            return False
        if self.spec.kind == "static":
            return False
        head = self.waiting[0]
        return self.kv.can_admit(head, min(head.remaining, self.spec.max_num_batched_tokens))

    def _step(self, plan: StepPlan) -> Generator[simpy.Event, Any, None]:
        start = self.env.now
        chunks, decodes = [], []
        for req, n in plan.entries:
            if req.is_decoding:
                decodes.append(req.num_computed + 1)
            else:
                chunks.append((n, req.num_computed, req.num_computed + n == req.known))
        yield self.env.timeout(self.timer.mixed(chunks=chunks, decode_contexts=decodes))
        end = self.env.now
        gaps = []
        for req, n in plan.entries:
            if math.isnan(req.first_scheduled_s):  # first time on the GPU
                req.first_scheduled_s = start
            req.num_computed += n
            if req.num_computed == req.known:
                if req.num_output > 0:
                    gaps.append(end - req.last_token_s)
                self._sampled(req, end)
        if gaps:
            self.recorder.itl(np.asarray(gaps), 1.0)
        self.recorder.steps(
            replica=self.index,
            start_s=np.array([start]),
            end_s=np.array([end]),
            num_seqs=len(plan.entries),
            prefill_tokens=sum(c[0] for c in chunks),
            decode_tokens=len(decodes),
            kv_used_blocks=self.kv.used,
        )

    def _sampled(self, req: Request, now: float) -> None:
        req.num_output += 1
        req.last_token_s = now
        if req.num_output == 1:
            req.first_token_s = now
        if req.finished:
            req.finish_s = now
            self.kv.release(req)
            self.running.remove(req)
            self.on_finish(req)

    def _decode_segment(self, plan: StepPlan) -> Generator[simpy.Event, Any, None]:
        reqs = [r for r, _ in plan.entries]
        n = len(reqs)
        computed = np.fromiter((r.num_computed for r in reqs), float, n)
        steps = min(
            min(r.output_len - r.num_output for r in reqs),
            MAX_SEGMENT_STEPS,
            self._steps_kv_allows(reqs, computed),
        )
        durations = self.timer.decode_run(
            num_seqs=n, total_context=float(computed.sum() + n), steps=steps
        )
        start = self.env.now
        ends = start + np.cumsum(durations)
        if self.waiting:  # head blocked: arrivals cannot change the batch
            yield self.env.timeout(ends[-1] - start)
            done = steps
        else:
            self._wakeup = self.env.event()
            yield self.env.timeout(ends[-1] - start) | self._wakeup
            done = int(np.searchsorted(ends, self.env.now, side="left")) + 1
            done = min(done, steps)
            if self.env.now < ends[done - 1]:  # finish the step in progress
                yield self.env.timeout(ends[done - 1] - self.env.now)
        self._apply_segment(reqs, done, ends[:done], start)

    def _steps_kv_allows(self, reqs: list[Request], computed: np.ndarray) -> int:
        """Most decode steps before the KV cache runs out (the first is already allocated)."""
        size = self.kv.block_size
        held = np.fromiter((r.blocks for r in reqs), float, len(reqs))

        def need(k: int) -> float:
            return float(np.maximum(0.0, np.ceil((computed + k) / size) - held).sum())

        lo, hi = 1, MAX_SEGMENT_STEPS
        if need(hi) <= self.kv.free:
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if need(mid) <= self.kv.free else (lo, mid)
        return lo

    def _apply_segment(
        self, reqs: list[Request], done: int, ends: np.ndarray, start: float
    ) -> None:
        n = len(reqs)
        first_gaps = np.fromiter((ends[0] - r.last_token_s for r in reqs), float, n)
        self.recorder.itl(first_gaps, 1.0)
        if done > 1:
            self.recorder.itl(np.diff(ends), float(n))
        used_before = self.kv.used
        for req in reqs:
            self.kv.allocate(req, done)  # the blocks these tokens filled (fits by construction)
            req.num_computed += done - 1
            req.num_output += done - 1
        starts = np.concatenate(([start], ends[:-1]))
        growth = np.linspace(used_before, self.kv.used, done) if done > 1 else used_before
        self.recorder.steps(
            replica=self.index,
            start_s=starts,
            end_s=ends,
            num_seqs=n,
            prefill_tokens=0,
            decode_tokens=n,
            kv_used_blocks=np.round(growth),
        )
        for req in reqs:  # the last step: one more token each
            req.num_computed += 1
            self._sampled(req, float(ends[-1]))
