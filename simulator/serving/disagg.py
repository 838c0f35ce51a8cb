"""Disaggregated prefill/decode serving: `serve_disaggregated`.

Replica groups have a role: `prefill` or `decode` (a deployment with both pools; `both` is
colocated serving, `cluster.serve`). Each pool routes its own requests with the existing
routers. A request's life, as vLLM's P/D connectors, Dynamo and Splitwise run it:

1. the client sends it to a prefill replica (the router over the prefill pool), which computes
   the prompt and samples the first token (TTFT ends here);
2. the prefill replica hands it off (`Replica.on_prefilled`) with its KV blocks still held; a
   decode replica is picked (the router over the decode pool, seeing hand-offs already routed
   there as outstanding) and the request waits, in FIFO order per decode replica, until that
   replica, at a step boundary (`Replica.between_steps`, as vLLM's scheduler takes remote-KV
   requests), has room in its KV cache for prompt + 1 tokens above its watermark and no
   requests it preempted waiting to come back;
3. the decode replica takes those blocks and the KV is transferred
   (`kv_transfer.TransferModel`: link, contention, optional layer-by-layer overlap);
4. when the KV is in place the prefill replica frees its blocks, and at the decode replica's
   next step boundary with a seat free (max_num_seqs) the request joins its batch with
   prompt_len tokens computed and one sampled, and decodes there (a preemption there
   recomputes on the decode replica, as vLLM does).

So decode KV pressure backs up into the prefill pool: hand-offs waiting for room keep their
prefill blocks, and a prefill replica admits no more prompts than its cache holds. A request
of one output token finishes on the prefill replica. Replicas are numbered in group order
(as `cluster.serve` numbers them), so energy and cost read the steps as for colocated runs.
The request rows carry the phase columns (`metrics.phases`). Arrivals pass the prefill group's
API server (`FrontEndQueue`) as on a colocated replica, and the client reads each token its way
back later; the phases count from when the prefill replica sampled the first token.

Not modelled: routing that looks at both pools at once (the decode replica is chosen when the
prefill ends), a decode replica pulling from several prefill replicas in one transfer, moving a
waiting hand-off to another decode replica, the proxy or router's own latency.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import simpy

from simulator.errors import SpecError
from simulator.metrics.phases import phase_summary, with_phases
from simulator.metrics.recorder import Recorder
from simulator.serving.cluster import (
    FrontEndQueue,
    ReplicaGroup,
    SimResult,
    _Clients,
    build_replica,
    check_budgets,
    run_to_end,
    sim_result,
    start_power,
    with_power,
)
from simulator.serving.fleet import Fleet, FleetScaling
from simulator.serving.kv_transfer import TransferModel, transfer_links
from simulator.serving.power import PowerBudget
from simulator.serving.replica import Replica
from simulator.serving.request import Request
from simulator.serving.router import Router
from simulator.specs.scenario import is_disaggregated, role_problem
from simulator.specs.serving import RouterSpec
from simulator.workload.requests import RequestTable

if TYPE_CHECKING:
    from simulator.costmodel.deployment import Deployment
    from simulator.specs.scenario import Scenario

ROLES = ("both", "prefill", "decode")


def prefill_view(requests: RequestTable) -> RequestTable:
    """The requests as a prefill replica holds them: the prompt and the first sampled token."""
    return dataclasses.replace(requests, output_len=np.ones_like(requests.output_len))


def pool_replicas(roles: Sequence[str], counts: Sequence[int]) -> dict[str, list[int]]:
    """Replica indices of each role, replicas numbered in group order."""
    pools: dict[str, list[int]] = {role: [] for role in ROLES}
    first = 0
    for role, count in zip(roles, counts, strict=True):
        pools[role] += range(first, first + count)
        first += count
    return pools


def _decode_copy(req: Request) -> Request:
    """The request as the decode replica's cache sees it: the same counters and times, no
    blocks there yet (the prefill replica's cache keeps the original's until the transfer)."""
    clone = copy.copy(req)
    clone.num_computed = 0
    clone.blocks = 0
    clone.swapped_blocks = 0
    clone.cache_keys = []  # the prefill replica's prefix cache keeps the original's
    return clone


class _Handoff:
    """Moves prefilled requests from the prefill pool to the decode pool (module doc, 2-4)."""

    def __init__(
        self,
        env: simpy.Environment,
        *,
        links: Mapping[tuple[int, int], TransferModel],
        client: _Clients,
        num_requests: int,
    ) -> None:
        self.env = env
        self.links = links
        self.client = client
        self.replicas: list[Replica] = []
        self.group_of: list[int] = []
        self.decode_router: Router | None = None
        self.pending: dict[int, deque[tuple[Request, Request]]] = {}  # waiting for blocks
        self.ready: dict[int, deque[Request]] = {}  # KV in place, waiting for a seat
        self.link_free: list[float] = []  # per replica: when its link is next free
        self.boundary: list[float] = []  # per replica: its last step boundary
        self.prefill_replica = np.full(num_requests, -1, dtype=np.int64)
        self.decode_admit_s = np.full(num_requests, np.nan)
        self.kv_ready_s = np.full(num_requests, np.nan)
        self.prefill_end_s = np.full(num_requests, np.nan)  # first token sampled (engine)

    def bind(self, replicas: list[Replica], group_of: list[int], decode_router: Router) -> None:
        self.replicas, self.group_of, self.decode_router = replicas, group_of, decode_router
        self.pending = {r.index: deque() for r in decode_router.replicas}
        self.ready = {r.index: deque() for r in decode_router.replicas}
        self.link_free = [0.0] * len(replicas)
        self.boundary = [-1.0] * len(replicas)

    def prefilled(self, req: Request) -> None:
        """A prefill replica sampled `req`'s first token: route it to a decode replica."""
        assert self.decode_router is not None  # bound before the run starts
        self.prefill_replica[req.id] = req.replica
        self.prefill_end_s[req.id] = req.first_token_s
        target = self.decode_router.choose(req)
        target.incoming += 1
        self.pending[target.index].append((req, _decode_copy(req)))
        target.wake()  # it takes the blocks at its next step boundary

    def finished(self, req: Request) -> None:
        """Any replica finished `req`."""
        if req.replica not in self.pending:  # one output token: it never left the prefill pool
            self.prefill_replica[req.id] = req.replica
            self.prefill_end_s[req.id] = req.first_token_s
        self.client.finished(req)  # the client reads it after the front-end's way back

    def admit(self, decode: Replica) -> None:
        """At a step boundary of `decode` (only there: a run of decode steps in flight has
        counted on the blocks it found free): requests whose KV is in place join its batch
        while it has seats (max_num_seqs); then, unless requests it preempted wait to be
        readmitted, the hand-offs waiting for it take blocks for prompt + 1 tokens, above the
        watermark, in arrival order, and their transfers start."""
        ready = self.ready[decode.index]
        while ready and len(decode.running) < decode.spec.max_num_seqs:
            decode.running.append(ready.popleft())
            decode.incoming -= 1
        queue = self.pending[decode.index]
        previous, self.boundary[decode.index] = self.boundary[decode.index], self.env.now
        while queue and not decode.waiting:
            req, clone = queue[0]
            if not decode.kv.can_admit(clone, req.prompt_len + 1):
                return
            queue.popleft()
            decode.kv.allocate(clone, req.prompt_len + 1)
            clone.num_computed = req.prompt_len
            self._transfer(req, clone, decode, at_once=req.first_token_s >= previous)

    def _transfer(self, req: Request, clone: Request, decode: Replica, *, at_once: bool) -> None:
        """Schedule the KV's move. Layer by layer, a hand-off admitted at the decode
        replica's first step boundary after its prefill counts as placed when the prefill
        began (kv_transfer's module doc); otherwise the transfer starts now."""
        now = self.env.now
        prefill = self.replicas[req.replica]
        link = self.links[self.group_of[prefill.index], self.group_of[decode.index]]
        free, ready = link.schedule(
            tokens=req.prompt_len,
            prefill_start_s=req.first_scheduled_s,
            prefill_end_s=req.first_token_s,
            admitted_s=req.first_token_s if link.layerwise and at_once else now,
            link_free_s=max(self.link_free[prefill.index], self.link_free[decode.index]),
        )
        ready = max(ready, now)
        self.link_free[prefill.index] = self.link_free[decode.index] = free
        self.decode_admit_s[req.id] = now
        self.kv_ready_s[req.id] = ready
        done = self.env.timeout(ready - now)
        done.callbacks.append(lambda _event: self._arrived(req, clone, prefill, decode))

    def _arrived(self, req: Request, clone: Request, prefill: Replica, decode: Replica) -> None:
        prefill.kv.release(req)
        prefill.wake()
        clone.replica = decode.index
        self.ready[decode.index].append(clone)
        decode.wake()  # it joins at the next step boundary


def serve_disaggregated(
    requests: RequestTable,
    *,
    groups: Sequence[ReplicaGroup],
    roles: Sequence[str],
    links: Mapping[tuple[int, int], TransferModel],
    router: RouterSpec | None = None,
    decode_router: RouterSpec | None = None,
    max_concurrency: int | None = None,
    seed: int = 0,
    autoscale: Sequence[FleetScaling] = (),
    power: PowerBudget | None = None,
) -> SimResult:
    """Serve `requests` on the prefill and decode pools (`roles[i]` of `groups[i]`); `links`
    maps (prefill group, decode group) indices to their KV transfer. `router` routes arrivals
    over the prefill pool, `decode_router` (default: `router`) hand-offs over the decode pool.
    `autoscale`: groups built with max_replicas replicas and scaled over the run, each pool's
    router sending to its serving ones (`serving.fleet`). `power`: a power budget over the
    replicas of both pools (`serving.power`)."""
    problem = role_problem(roles)
    if problem or not is_disaggregated(roles):
        raise SpecError(problem or "no prefill/decode groups", field="replicas")
    if max_concurrency is not None and max_concurrency < 1:
        raise SpecError(f"must be at least 1, got {max_concurrency}", field="max_concurrency")
    role_groups = {
        role: [g for g, r in zip(groups, roles, strict=True) if r == role] for role in ROLES
    }
    check_budgets(prefill_view(requests), role_groups["prefill"])
    check_budgets(requests, role_groups["decode"])
    wall = time.perf_counter()
    env = simpy.Environment()
    recorder = Recorder()
    client = _Clients(env, max_concurrency, recorder)
    handoff = _Handoff(env, links=links, client=client, num_requests=len(requests))
    replicas: list[Replica] = []
    group_of: list[int] = []
    scaled = {s.spec.group: s.spec.max_replicas for s in autoscale}
    counts = [scaled.get(g, group.count) for g, group in enumerate(groups)]
    for g, (group, role) in enumerate(zip(groups, roles, strict=True)):
        for _ in range(counts[g]):
            replicas.append(
                build_replica(
                    env,
                    group,
                    index=len(replicas),
                    recorder=recorder,
                    on_finish=handoff.finished,
                    on_prefilled=handoff.prefilled if role == "prefill" else None,
                    between_steps=handoff.admit if role == "decode" else None,
                    seed=seed,
                )
            )
            group_of.append(g)
            if role == "prefill" and group.frontend is not None:  # arrivals enter here
                client.frontends[len(replicas) - 1] = FrontEndQueue(group.frontend)
    pools = pool_replicas(roles, counts)
    rng = np.random.default_rng(seed)
    prefill_router = Router(router or RouterSpec(), [replicas[i] for i in pools["prefill"]], rng)
    decode = [replicas[i] for i in pools["decode"]]
    decode_route = Router(decode_router or router or RouterSpec(), decode, rng)
    handoff.bind(replicas, group_of, decode_route)  # every decode replica, off ones too
    fleet = None
    if autoscale:
        fleet = Fleet(
            env,
            autoscale,
            routers=[prefill_router, decode_route],
            replicas=replicas,
            group_of=group_of,
            finished=lambda: client.completed == len(requests),
        )
    controller = start_power(
        env,
        power,
        replicas=replicas,
        group_of=dict(enumerate(group_of)),
        finished=lambda: client.completed == len(requests),
        fleet=fleet,
    )
    env.process(client.send(requests, prefill_router))
    run_to_end(env, client, replicas)
    frame = with_phases(
        recorder.request_frame(),
        prefill_replica=handoff.prefill_replica,
        decode_admit_s=handoff.decode_admit_s,
        kv_ready_s=handoff.kv_ready_s,
        prefill_end_s=handoff.prefill_end_s,
    )
    result = with_power(sim_result(recorder, replicas, requests=frame, wall=wall), controller)
    if fleet is None:
        return result
    fleet.close(client.last_done_s)
    return dataclasses.replace(result, fleet=fleet.frame(), fleet_gpu_seconds=fleet.gpu_seconds())


def serve_scenario(
    scenario: Scenario,
    requests: RequestTable,
    *,
    groups: Sequence[ReplicaGroup],
    deployments: Sequence[Deployment],
    autoscale: Sequence[FleetScaling] = (),
    power: PowerBudget | None = None,
) -> SimResult:
    """`serve_disaggregated` as a disaggregated scenario describes it (groups and their
    deployments built in scenario order; `autoscale`: its autoscaled groups; `power`: its
    power budget over both pools)."""
    specs = scenario.replicas
    links = transfer_links(
        scenario.kv_transfer,
        pools=[(s.role, dep, s.count) for s, dep in zip(specs, deployments, strict=True)],
    )
    return serve_disaggregated(
        requests,
        groups=groups,
        roles=[s.role for s in specs],
        links=links,
        router=scenario.router,
        decode_router=scenario.decode_router,
        max_concurrency=scenario.max_concurrency,
        seed=scenario.seed,
        autoscale=autoscale,
        power=power,
    )


def pool_summary(scenario: Scenario, sim: SimResult) -> dict[str, float]:
    """The summary keys of a disaggregated run: `metrics.phases.phase_summary` over its pools."""
    pools = pool_replicas([s.role for s in scenario.replicas], scenario.most_replicas())
    return phase_summary(
        sim.requests,
        sim.steps,
        prefill_replicas=pools["prefill"],
        decode_replicas=pools["decode"],
    )


def pool_lines(
    scenario: Scenario, deployments: Sequence[Deployment], summary: Mapping[str, object]
) -> list[str]:
    """What `llmsim run` prints of a disaggregated run: pools, links, phase times."""
    specs = scenario.replicas
    built = scenario.most_replicas()
    sizes = {}
    for role in ROLES:  # an autoscaled pool: the most replicas it may have
        mine = [g for g, s in enumerate(specs) if s.role == role]
        scaled = any(scenario.autoscaled(g) is not None for g in mine)
        sizes[role] = f"{'up to ' if scaled else ''}{sum(built[g] for g in mine)}"
    lines = [
        f"Prefill pool: {sizes['prefill']} replica(s), "
        f"{summary['prefill_pool_utilization']:.1%} busy; decode pool: {sizes['decode']} "
        f"replica(s), {summary['decode_pool_utilization']:.1%} busy"
    ]
    links = transfer_links(
        scenario.kv_transfer,
        pools=[(s.role, dep, s.count) for s, dep in zip(specs, deployments, strict=True)],
    )
    lines += [f"KV transfer, group {i} -> {j}: {link.describe()}" for (i, j), link in links.items()]
    phases = ", ".join(
        f"{label} {summary[f'mean_{key}_ms']:.2f} / {summary[f'p99_{key}_ms']:.2f}"
        for key, label in (
            ("prefill_queue", "prefill queue"),
            ("prefill", "prefill"),
            ("decode_queue", "decode queue"),
            ("transfer", "transfer"),
        )
    )
    return [*lines, f"Phases, mean / p99 ms: {phases}"]
