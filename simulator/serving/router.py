"""Routing requests across replicas. A closed set of policies chosen by `kind`.

- round_robin: replicas in turn.
- least_outstanding: fewest running + waiting requests (ties: lowest index).
- least_kv: lowest KV-cache usage (ties: fewest outstanding, then lowest index).
- power_of_two: two replicas drawn at random, the one with fewer outstanding requests.
- prefix_affinity: SGLang router's cache-aware policy (sgl-project/sglang, sgl-router
  src/policies/cache_aware.rs). While the replicas' outstanding requests are imbalanced
  (busiest - idlest > balance_abs_threshold and busiest > balance_rel_threshold x idlest), the
  least outstanding one; otherwise the replica whose prefix cache holds the longest start of
  the prompt, if that covers more than cache_threshold of it, else the one with the lowest KV
  usage (SGLang: the smallest tree, the most room to cache). SGLang's router keeps an
  approximate tree of what it sent where; here it asks each replica's cache itself (exact).
- length: a request whose prompt + output exceeds length_threshold goes to the replicas of
  replica group long_group, the others to the other groups (Melange, arXiv 2404.14527), each
  side least outstanding.
Routing is instantaneous and sees each replica's state at the arrival time. Not modelled: the
router's own latency. An autoscaler (`serving.fleet`) sets `replicas` to those taking
requests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from simulator.serving.replica import Replica
from simulator.serving.request import Request
from simulator.specs.serving import RouterSpec


class Router:
    def __init__(
        self,
        spec: RouterSpec,
        replicas: Sequence[Replica],
        rng: np.random.Generator,
        *,
        group_of: Mapping[int, int] | None = None,
    ):
        """`group_of`: each replica's group, by replica index (the length router's sides)."""
        self.spec = spec
        self.replicas = replicas
        self.rng = rng
        self.group_of = group_of or {}
        self._next = 0

    def choose(self, req: Request | None = None) -> Replica:
        """The replica `req` goes to (`req` None: a policy that needs none of its tokens)."""
        reps = self.replicas
        if len(reps) == 1:
            return reps[0]
        match self.spec.kind:
            case "round_robin":
                rep = reps[self._next % len(reps)]
                self._next += 1
                return rep
            case "least_outstanding":
                return _least_outstanding(reps)
            case "least_kv":
                return min(reps, key=lambda r: (r.kv.usage, r.outstanding, r.index))
            case "power_of_two":
                a, b = self.rng.choice(len(reps), size=2, replace=False)
                return min(reps[int(a)], reps[int(b)], key=lambda r: (r.outstanding, r.index))
            case "prefix_affinity":
                return self._prefix_affinity(reps, req)
            case "length":
                return self._by_length(reps, req)

    def _prefix_affinity(self, reps: Sequence[Replica], req: Request | None) -> Replica:
        spec = self.spec
        loads = [r.outstanding for r in reps]
        busiest, idlest = max(loads), min(loads)
        if (
            busiest - idlest > spec.balance_abs_threshold
            and busiest > spec.balance_rel_threshold * idlest
        ):
            return _least_outstanding(reps)
        if req is not None and req.prompt_len > 0:
            hits = [r.kv.prefix_hit(req) if r.kv.prefix_caching else 0 for r in reps]
            best = max(range(len(reps)), key=lambda i: (hits[i], -loads[i], -reps[i].index))
            if hits[best] / req.prompt_len > spec.cache_threshold:
                return reps[best]
        return min(reps, key=lambda r: (r.kv.usage, r.outstanding, r.index))

    def _by_length(self, reps: Sequence[Replica], req: Request | None) -> Replica:
        threshold = self.spec.length_threshold
        if req is None or threshold is None:
            return _least_outstanding(reps)
        long = req.prompt_len + req.output_len > threshold
        side = [r for r in reps if (self.group_of.get(r.index) == self.spec.long_group) == long]
        return _least_outstanding(side or reps)


def _least_outstanding(reps: Sequence[Replica]) -> Replica:
    return min(reps, key=lambda r: (r.outstanding, r.index))
