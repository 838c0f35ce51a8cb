"""Routing requests across replicas. A closed set of policies chosen by `kind`.

- round_robin: replicas in turn.
- least_outstanding: fewest running + waiting requests (ties: lowest index).
- least_kv: lowest KV-cache usage (ties: fewest outstanding, then lowest index).
- power_of_two: two replicas drawn at random, the one with fewer outstanding requests.
Routing is instantaneous and sees each replica's state at the arrival time. Not modelled: the
router's own latency, prefix-aware (cache-affinity) routing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simulator.serving.replica import Replica
from simulator.specs.serving import RouterSpec


class Router:
    def __init__(self, spec: RouterSpec, replicas: Sequence[Replica], rng: np.random.Generator):
        self.spec = spec
        self.replicas = replicas
        self.rng = rng
        self._next = 0

    def choose(self) -> Replica:
        reps = self.replicas
        if len(reps) == 1:
            return reps[0]
        match self.spec.kind:
            case "round_robin":
                rep = reps[self._next % len(reps)]
                self._next += 1
                return rep
            case "least_outstanding":
                return min(reps, key=lambda r: (r.outstanding, r.index))
            case "least_kv":
                return min(reps, key=lambda r: (r.kv.usage, r.outstanding, r.index))
            case "power_of_two":
                a, b = self.rng.choice(len(reps), size=2, replace=False)
                return min(reps[int(a)], reps[int(b)], key=lambda r: (r.outstanding, r.index))
