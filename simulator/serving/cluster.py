"""A deployment of identical replicas behind a router, fed by a workload: `simulate`.

The clients send each request at its arrival time (open loop), or, with `max_concurrency`, as
soon as fewer than that many are outstanding (vLLM bench serve's --max-concurrency: the clock
of a request starts when it is sent). Deterministic: the same inputs and seed give identical
results (simpy orders simultaneous events by schedule order; the only randomness, the
power-of-two router, draws from a generator seeded here). Replica groups and how one is built
are in `serving.group` (re-exported here).
"""

from __future__ import annotations

__all__ = [
    "FrontEndQueue",
    "ReplicaGroup",
    "SimResult",
    "build_replica",
    "check_budgets",
    "default_scheduler",
    "replica_group",
    "run_to_end",
    "serve",
    "sim_result",
    "simulate",
]

import dataclasses
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
import pandas as pd
import simpy

from simulator.costmodel.deployment import Deployment
from simulator.errors import SpecError
from simulator.metrics.phases import with_phases
from simulator.metrics.recorder import Recorder
from simulator.serving.dp_group import with_dp_attention
from simulator.serving.fleet import Fleet, FleetScaling
from simulator.serving.group import ReplicaGroup, default_scheduler, replica_group
from simulator.serving.kv_pool import PoolPlan, install
from simulator.serving.kv_tiers import (
    TieredBlockManager,
)
from simulator.serving.lora import AdapterCache, lora_summary
from simulator.serving.pd_partition import split_summary
from simulator.serving.power import PowerBudget, PowerController
from simulator.serving.replica import Replica
from simulator.serving.request import Request
from simulator.serving.result import SimResult
from simulator.serving.router import Router
from simulator.serving.speculative import Acceptance
from simulator.specs.engine import FrontEndCost
from simulator.specs.lora import LoraSpec
from simulator.specs.serving import RouterSpec, SchedulerSpec, SpeculativeSpec
from simulator.workload.requests import RequestTable


def simulate(
    dep: Deployment,
    *,
    requests: RequestTable,
    scheduler: SchedulerSpec | None = None,
    router: RouterSpec | None = None,
    enforce_eager: bool = False,
    gpu_memory_utilization: float | None = None,
    max_concurrency: int | None = None,
    seed: int = 0,
    speculative: SpeculativeSpec | None = None,
    lora: LoraSpec | None = None,
) -> SimResult:
    """Serve `requests` on `layout.dp` replicas of `layout.tp x layout.pp` devices each
    (`speculative`: with speculative decoding; `lora`: vLLM's --enable-lora slots for requests
    naming adapters, `serving.lora`); with wide EP (ep = tp x dp > tp), on one replica of
    `layout.dp` DP-attention ranks (`serving.dp_group`)."""
    wall = time.perf_counter()
    group, plan = replica_group(
        dep,
        requests=requests,
        scheduler=scheduler,
        enforce_eager=enforce_eager,
        gpu_memory_utilization=gpu_memory_utilization,
        speculative=speculative,
        lora=lora,
    )
    if dep.layout.ep > dep.layout.tp:
        if lora is not None:
            raise SpecError("LoRA with DP attention is not modelled", field="lora")
        group = with_dp_attention(
            group,
            dep,
            count=1,
            enforce_eager=enforce_eager,
        )
    result = serve(
        requests, groups=[group], router=router, max_concurrency=max_concurrency, seed=seed
    )
    return dataclasses.replace(result, memory=plan, wall_s=time.perf_counter() - wall)


def serve(
    requests: RequestTable,
    *,
    groups: Sequence[ReplicaGroup],
    router: RouterSpec | None = None,
    max_concurrency: int | None = None,
    seed: int = 0,
    autoscale: Sequence[FleetScaling] = (),
    recorder: Recorder | None = None,
    kv_pool: PoolPlan | None = None,
    power: PowerBudget | None = None,
) -> SimResult:
    """The event simulation itself: `requests` routed over the replicas of all `groups`;
    with `autoscale`, each of its groups (`spec.group`) built with max_replicas replicas,
    scaled over the run (`serving.fleet`); with `power`, the fleet's draw sampled and its replicas
    capped by the budget's policy (`serving.power`). `recorder`: what records the rows (a
    fresh `Recorder` when None; a `metrics.stream.StreamRecorder` folds them into aggregates
    instead). `kv_pool`: the replicas' KV caches pooled (`serving.kv_pool`; None: each its
    own)."""
    if max_concurrency is not None and max_concurrency < 1:
        raise SpecError(f"must be at least 1, got {max_concurrency}", field="max_concurrency")
    check_budgets(requests, groups)
    wall = time.perf_counter()
    env = simpy.Environment()
    recorder = Recorder() if recorder is None else recorder
    client = _Clients(env, max_concurrency, recorder)
    replicas: list[Replica] = []
    group_of: dict[int, int] = {}
    scaled = {s.spec.group: s.spec for s in autoscale}
    for g, group in enumerate(groups):
        count = group.count
        if g in scaled:
            if group.loop is not None:
                raise SpecError("an autoscaled group is of plain replicas", field="autoscale.group")
            count = scaled[g].max_replicas
        for _ in range(count):
            first = len(replicas)
            if group.loop is not None:
                replicas += group.loop.build(
                    env,
                    group=group,
                    index=len(replicas),
                    recorder=recorder,
                    on_finish=client.finished,
                )
            else:
                replicas.append(
                    build_replica(
                        env,
                        group,
                        index=len(replicas),
                        recorder=recorder,
                        on_finish=client.finished,
                        seed=seed,
                    )
                )
            for replica in replicas[first:]:
                group_of[replica.index] = g
                if group.frontend is not None:
                    client.frontends[replica.index] = FrontEndQueue(group.frontend)
    pool = None
    if kv_pool is not None:
        longest = int((requests.prompt_len + requests.output_len).max()) if len(requests) else 0
        pool = install(kv_pool, replicas, groups, group_of, longest=longest)
    route = Router(router or RouterSpec(), replicas, np.random.default_rng(seed), group_of=group_of)
    fleet = None
    if autoscale:
        fleet = Fleet(
            env,
            autoscale,
            routers=[route],
            replicas=replicas,
            group_of=group_of,
            finished=lambda: client.completed == len(requests),
        )
    controller = start_power(
        env,
        power,
        replicas=replicas,
        group_of=group_of,
        finished=lambda: client.completed == len(requests),
        fleet=fleet,
    )
    env.process(client.send(requests, route))
    run_to_end(env, client, replicas)
    result = sim_result(
        recorder, replicas, requests=with_phases(recorder.request_frame()), wall=wall
    )
    if pool is not None:
        result = dataclasses.replace(result, kv_pool=pool.summary())
    split = split_summary(replicas)
    if split is not None:
        result = dataclasses.replace(result, pd_partition=split)
    result = with_power(result, controller)
    if fleet is None:
        return result
    fleet.close(client.last_done_s)
    return dataclasses.replace(result, fleet=fleet.frame(), fleet_gpu_seconds=fleet.gpu_seconds())


def start_power(
    env: simpy.Environment,
    power: PowerBudget | None,
    *,
    replicas: Sequence[Replica],
    group_of: dict[int, int],
    finished: Callable[[], bool],
    fleet: Fleet | None,
) -> PowerController | None:
    """The power budget's controller over `replicas`, started (None without a budget); with
    a `fleet`, it samples and caps only the replicas that are on."""
    if power is None:
        return None
    controller = PowerController(
        env,
        power,
        replicas=replicas,
        group_of=group_of,
        finished=finished,
        on=None if fleet is None else fleet.is_on,
    )
    env.process(controller.run())
    return controller


def with_power(result: SimResult, controller: PowerController | None) -> SimResult:
    """`result` with the power controller's samples, capped replica-seconds and cap events."""
    if controller is None:
        return result
    return dataclasses.replace(
        result,
        power=controller.frame(),
        power_capped_replica_s=controller.capped_replica_s,
        power_caps=controller.caps(),
    )


def run_to_end(env: simpy.Environment, client: _Clients, replicas: Sequence[Replica]) -> None:
    """Run the simulation until no event is left; every request must have finished. Then
    record the KV tiers' final state."""
    env.run()
    if client.outstanding:
        raise RuntimeError(f"{client.outstanding} requests never finished")
    for replica in replicas:
        if isinstance(replica.kv, TieredBlockManager):
            client.recorder.kv_tiers(
                replica=replica.index, time_s=env.now, row=replica.kv.tier_row()
            )


def sim_result(
    recorder: Recorder, replicas: Sequence[Replica], *, requests: pd.DataFrame, wall: float
) -> SimResult:
    """What a finished run produced (`requests`: the request rows, with their phase columns;
    `wall`: when the run started, from time.perf_counter)."""
    itl_s, itl_weight = recorder.itl_sample()
    result = SimResult(
        requests=requests,
        steps=recorder.step_frame(),
        itl_s=itl_s,
        itl_weight=itl_weight,
        memory=None,
        kv_peak_fraction=max(r.kv.peak_used / r.kv.num_blocks for r in replicas),
        num_replicas=len(replicas),
        wall_s=time.perf_counter() - wall,
        kv_tiers=recorder.kv_tier_frame(),
        lora=lora_summary([r.lora for r in replicas if r.lora is not None]) or None,
    )
    # The recorder is held in reference cycles (replicas, simpy processes) that only the
    # garbage collector frees: let its buffers go now, not whenever that runs.
    recorder.release()
    return result


def build_replica(
    env: simpy.Environment,
    group: ReplicaGroup,
    *,
    index: int,
    recorder: Recorder,
    on_finish: Callable[[Request], None],
    on_prefilled: Callable[[Request], None] | None = None,
    between_steps: Callable[[Replica], None] | None = None,
    seed: int = 0,
) -> Replica:
    """One replica of `group` with its own KV cache, numbered `index`; with speculative
    decoding, its own acceptance draws from a generator seeded by (`seed`, `index`)."""
    return Replica(
        env,
        index=index,
        scheduler=group.scheduler,
        timer=group.timer,
        recorder=recorder,
        kv=group.new_kv(),
        on_finish=on_finish,
        swap_s_per_block=group.swap_s_per_block,
        on_prefilled=on_prefilled,
        between_steps=between_steps,
        speculator=None
        if group.speculative is None
        else Acceptance(rates=group.speculative.rates, rng=np.random.default_rng((seed, index))),
        lora=None if group.lora is None else AdapterCache(group.lora),
    )


def check_budgets(requests: RequestTable, groups: Sequence[ReplicaGroup]) -> None:
    """Without chunked prefill a step must hold the longest request: a prompt is prefilled in
    one step, and a request preempted by recompute re-prefills its prompt and the output so far
    in one step. A shorter budget would leave a request that can never be scheduled.

    vLLM refuses such a configuration when it starts (SchedulerConfig._verify_args in
    vllm/config/scheduler.py; vllm/config.py before 0.10): `max_num_batched_tokens <
    max_model_len and not chunked_prefill_enabled` raises "max_num_batched_tokens (B) is
    smaller than max_model_len (L). This effectively limits the maximum sequence length to
    max_num_batched_tokens and makes vLLM reject longer sequences. Please increase
    max_num_batched_tokens or decrease max_model_len." Here the rule is the requests given
    (their longest prompt + output), not max_model_len: published runs (the validation rows)
    set a small budget with a max_model_len they do not record, and other engines
    (TensorRT-LLM's max_num_tokens) have no such start-up check. A static batch prefills its
    batch whole, whatever the budget."""
    total = requests.prompt_len + requests.output_len
    longest = int(total.max()) if len(requests) else 0
    for group in groups:
        spec = group.scheduler
        budget = spec.max_num_batched_tokens
        if spec.kind != "static" and not spec.chunked_prefill and longest > budget:
            raise SpecError(
                f"{budget} is below the longest request's prompt + output ({longest} tokens), "
                "which a step must hold without chunked prefill (a preempted request "
                "re-prefills both; vLLM refuses a budget below max_model_len for this "
                "reason): raise max_num_batched_tokens or turn chunked_prefill on",
                field="max_num_batched_tokens",
            )


class FrontEndQueue:
    """The API server in front of one replica (`FrontEndCost`): a request spends `request_s`
    on its own, then waits for the one tokenizer thread, which takes `tokenize_s_per_token`
    per prompt token, one request after another; then it reaches the replica's scheduler.
    Its tokens reach the client `first_token_s` after the step that sampled them."""

    __slots__ = ("cost", "tokenizer_free_s")

    def __init__(self, cost: FrontEndCost) -> None:
        self.cost = cost
        self.tokenizer_free_s = 0.0  # when the tokenizer thread is next idle

    def enter(self, env: simpy.Environment, req: Request, replica: Replica) -> None:
        """Send `req` through the front-end into `replica` (counted as incoming meanwhile).
        Its two waits are plain timeouts with callbacks, not a process of its own: the same
        times, computed the same way, for two events instead of four."""
        cost = self.cost
        req.return_s = cost.first_token_s
        replica.incoming += 1  # the router sees it as the replica's
        if cost.request_s > 0:
            env.timeout(cost.request_s).callbacks.append(
                lambda _: self._tokenize(env, req, replica)
            )
        else:
            self._tokenize(env, req, replica)

    def _tokenize(self, env: simpy.Environment, req: Request, replica: Replica) -> None:
        """`req` reached the tokenizer thread: it waits its turn, then goes to `replica`."""
        cost = self.cost
        if cost.tokenize_s_per_token > 0:
            start = max(env.now, self.tokenizer_free_s)
            self.tokenizer_free_s = start + cost.tokenize_s_per_token * req.prompt_len
            env.timeout(self.tokenizer_free_s - env.now).callbacks.append(
                lambda _: _submitted(req, replica)
            )
        else:
            _submitted(req, replica)


def _submitted(req: Request, replica: Replica) -> None:
    """`req` leaves the front-end for `replica`'s scheduler."""
    replica.incoming -= 1
    replica.submit(req)


class _Clients:
    """The benchmark clients: send at arrival times, at most `limit` outstanding. A follow-up
    turn of a conversation is sent `think_s` after the turn it follows finished (vLLM's
    multi-turn benchmark client); it too waits for a slot under the limit. A request routed
    to a replica with a front-end (`frontends`, by replica index) goes through it first, and
    its tokens come back `first_token_s` later: the client records it, frees its slot and
    sends the next turn then."""

    def __init__(self, env: simpy.Environment, limit: int | None, recorder: Recorder) -> None:
        self.env = env
        self.recorder = recorder
        self.limit = limit
        self.outstanding = 0
        self.completed = 0  # requests recorded
        self.last_done_s = 0.0  # when the last was
        self._slot = env.event()
        self._next_turn: dict[int, int] = {}  # request id -> the turn sent after it finishes
        self.frontends: dict[int, FrontEndQueue] = {}

    def _deliver(self, replica: Replica, req: Request) -> None:
        """Hand `req` to the replica the router chose, through its front-end if it has one."""
        queue = self.frontends.get(replica.index)
        if queue is None:
            replica.submit(req)
        else:
            queue.enter(self.env, req, replica)

    def finished(self, req: Request) -> None:
        delay = req.return_s
        if delay > 0:  # the client sees every token `delay` after the engine sampled it
            req.first_token_s += delay
            req.last_token_s += delay
            req.finish_s += delay
            # a timeout with a callback, not a process: one event instead of three
            self.env.timeout(delay).callbacks.append(lambda _: self._done(req))
            return
        self._done(req)

    def _done(self, req: Request) -> None:
        self.recorder.request(req)
        self.outstanding -= 1
        self.completed += 1
        self.last_done_s = self.env.now
        if not self._slot.triggered:
            self._slot.succeed()
        if req.id in self._next_turn:
            self.env.process(self._send_next_turn(self._next_turn.pop(req.id)))

    def _wait_for_slot(self) -> Generator[simpy.Event, Any, None]:
        while self.limit is not None and self.outstanding >= self.limit:
            if self._slot.triggered:  # every waiter shares the one pending event
                self._slot = self.env.event()
            yield self._slot

    def send(self, table: RequestTable, router: Router) -> Generator[simpy.Event, Any, None]:
        self._table, self._router = table, router
        arrivals = table.arrival_s.tolist()
        prompts = table.prompt_len.tolist()
        outputs = table.output_len.tolist()
        priorities = table.priority.tolist()
        adapters = table.adapter.tolist()
        first_turns: Sequence[int] = range(len(arrivals))
        if table.has_turns:
            follows = table.follows.tolist()
            self._next_turn = {prev: i for i, prev in enumerate(follows) if prev >= 0}
            first_turns = [i for i, prev in enumerate(follows) if prev < 0]
        shared = table.shares_content
        for i in first_turns:
            arrival = arrivals[i]
            if arrival > self.env.now:
                yield self.env.timeout(arrival - self.env.now)
            yield from self._wait_for_slot()
            if shared:
                self._submit(i)
                continue
            req = Request(
                id=i,
                arrival_s=self.env.now,
                prompt_len=int(prompts[i]),
                output_len=int(outputs[i]),
                priority=int(priorities[i]),
                adapter=int(adapters[i]),
            )
            self.outstanding += 1
            self._deliver(router.choose(req), req)

    def _send_next_turn(self, i: int) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(float(self._table.think_s[i]))
        yield from self._wait_for_slot()
        self._submit(i)

    def _submit(self, i: int) -> None:
        """Send row `i` of the table now, with what its prompt shares."""
        t = self._table
        req = Request(
            id=i,
            arrival_s=self.env.now,
            prompt_len=int(t.prompt_len[i]),
            output_len=int(t.output_len[i]),
            priority=int(t.priority[i]),
            prefix_id=int(t.prefix_id[i]),
            prefix_len=int(t.prefix_len[i]),
            session_id=int(t.session_id[i]),
            adapter=int(t.adapter[i]),
        )
        self.outstanding += 1
        self._deliver(self._router.choose(req), req)
