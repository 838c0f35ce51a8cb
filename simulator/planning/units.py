"""Disaggregated candidates of a plan: units of `p` prefill replicas of one layout and `d`
decode replicas of another (or the same), with what is known before any simulation.

A unit is to the fleet what a replica is for colocated serving: its rate is searched by
simulation (`serving.disagg` behind the plan's routers and KV transfer), a fleet holds whole
units, and their pools merge in the fleet's check. Bounds, on the unit's own requests:

- capacity ceiling: min(p x the prefill layout's ceiling on prompts alone, d x the decode
  layout's ceiling on the later tokens alone) (`bounds.capacity_ceiling` by phase): each pool
  must keep up with its share of the work;
- latency floors: TTFT as the prefill layout's prefill alone, TPOT and ITL as the decode
  layout's shortest decode step (the transfer and the decode replica's queue only add), E2EL
  their sum over the tokens. A unit whose floors miss an SLO is hopeless (`bounds.hopeless`).

Pairs whose KV-cache dtypes differ are skipped (the blocks must match); counts are taken in
lowest terms (2 + 2 is two units of 1 + 1). Units are searched cheapest ceiling per dollar
first, at most `disaggregated.max_units`; the rest are listed as pruned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.metrics.bands import Margin
from simulator.planning.bounds import (
    FLOOR_CONTEXT_POINTS,
    LatencyFloors,
    decode_floor,
    hopeless,
    prefill_chunks,
)
from simulator.planning.layouts import Prepared, Traffic
from simulator.planning.margins import plan_margin
from simulator.planning.spec import PlanSpec
from simulator.specs.scenario import ReplicaGroupSpec


@dataclass(frozen=True)
class Unit:
    """`prefill_replicas` of `prefill` and `decode_replicas` of `decode`, with the unit's
    bounds on the `num_prompts` requests it is tried with."""

    prefill: Prepared
    decode: Prepared
    prefill_replicas: int
    decode_replicas: int
    num_prompts: int
    ceiling: float
    floors: LatencyFloors
    margin: Margin

    @property
    def key(self) -> str:
        p, d = self.prefill_replicas, self.decode_replicas
        if self.prefill.key == self.decode.key:
            return f"{p}P+{d}D {self.prefill.key}"
        return f"{p}P {self.prefill.key} + {d}D {self.decode.key}"

    @property
    def gpus(self) -> int:
        return self.prefill_replicas * self.prefill.gpus + self.decode_replicas * self.decode.gpus

    @property
    def usd_per_hour(self) -> float:
        p, d = self.prefill_replicas, self.decode_replicas
        return p * self.prefill.usd_per_hour + d * self.decode.usd_per_hour

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.gpus

    @property
    def gpus_by_hardware(self) -> tuple[tuple[str, int], ...]:
        counts: dict[str, int] = {}
        for part, n in ((self.prefill, self.prefill_replicas), (self.decode, self.decode_replicas)):
            hw = part.layout.hardware
            counts[hw] = counts.get(hw, 0) + n * part.gpus
        return tuple(counts.items())

    @property
    def precision(self) -> str:
        a, b = self.prefill.precision, self.decode.precision
        return a if a == b else f"{a} / {b}"

    def groups(self, spec: PlanSpec, *, count: int = 1) -> list[ReplicaGroupSpec]:
        """The prefill and decode groups of `count` units."""
        return [
            part.layout.replica_group(spec, count=count * n).model_copy(update={"role": role})
            for part, n, role in (
                (self.prefill, self.prefill_replicas, "prefill"),
                (self.decode, self.decode_replicas, "decode"),
            )
        ]

    def row(self) -> dict[str, Any]:
        """The unit's columns of the plan's tables."""
        a, b = self.prefill.layout, self.decode.layout

        def both(x: object, y: object) -> object:
            return x if x == y else f"{x} + {y}"

        return {
            "layout": self.key,
            "mode": "disaggregated",
            "hardware": both(a.hardware, b.hardware),
            "engine": both(a.engine, b.engine),
            "quantization": both(a.quantization or "none", b.quantization or "none"),
            "kv_cache_dtype": a.kv_cache_dtype,
            "tp": None,
            "pp": None,
            "cp": None,
            "gpus_per_replica": self.gpus,
            "prefill_layout": a.key,
            "decode_layout": b.key,
            "prefill_replicas": self.prefill_replicas,
            "decode_replicas": self.decode_replicas,
        }


class _RoleFloors:
    """One layout's floors as a pool: TTFT per prompt length (its prefill alone), and the
    shortest decode step holding a context, on a grid up to `top` tokens (a longer context
    takes the floor at the top: steps never shorten as contexts grow)."""

    def __init__(self, p: Prepared, *, top: float) -> None:
        self.p = p
        sched = p.scheduler
        self.chunk = sched.max_num_batched_tokens if sched.chunked_prefill else 2**62
        self.grid = np.unique(np.round(np.geomspace(1.0, max(top, 2.0), FLOOR_CONTEXT_POINTS)))
        self.floor = decode_floor(p.timer, max_num_seqs=sched.max_num_seqs, contexts=self.grid)
        self._ttft: dict[int, float] = {}

    def ttft(self, prompt_len: np.ndarray) -> np.ndarray:
        for n in np.unique(prompt_len).tolist():
            if n not in self._ttft:
                chunks = prefill_chunks(n, self.chunk)
                self._ttft[n] = sum(
                    self.p.timer.mixed(chunks=[c], decode_contexts=[]) for c in chunks
                )
        return np.array([self._ttft[int(n)] for n in prompt_len])

    def tpot(self, prompt_len: np.ndarray, output_len: np.ndarray) -> np.ndarray:
        below = np.searchsorted(self.grid, prompt_len + 1, side="right") - 1
        return np.where(output_len > 1, self.floor[below], 0.0)


def _ratios(spec: PlanSpec) -> list[tuple[int, int]]:
    d = spec.disaggregated
    pairs = {
        (p // math.gcd(p, q), q // math.gcd(p, q))
        for p in d.prefill_replicas
        for q in d.decode_replicas
    }
    return sorted(pairs)


def build_units(
    spec: PlanSpec, layouts: list[Prepared], flow: Traffic
) -> tuple[list[Unit], list[dict[str, Any]]]:
    """The units to search (cheapest ceiling per dollar first) and rows for those pruned."""
    search = spec.search
    wide = flow.requests(flow.clamp(search.max_prompts))
    top = float(np.max(wide.prompt_len + wide.output_len))
    prefill_cap = {p.key: p.pool_ceiling(wide, phase="prefill") for p in layouts}
    decode_cap = {p.key: p.pool_ceiling(wide, phase="decode") for p in layouts}
    options = [
        (a, b, n_p, n_d, min(n_p * prefill_cap[a.key], n_d * decode_cap[b.key]))
        for a in layouts
        for b in layouts
        if a.deployment.precision.kv_cache == b.deployment.precision.kv_cache
        for n_p, n_d in _ratios(spec)
    ]
    options.sort(key=lambda o: (o[2] * o[0].usd_per_hour + o[3] * o[1].usd_per_hour) / o[4])
    floors = {p.key: _RoleFloors(p, top=top) for p in layouts}
    units: list[Unit] = []
    pruned: list[dict[str, Any]] = []
    for a, b, n_p, n_d, cap in options:
        wanted = math.ceil(search.duration_s * cap / 2)
        n = flow.clamp(min(max(wanted, search.min_prompts), search.max_prompts))
        sample = flow.requests(n)
        ttft = floors[a.key].ttft(sample.prompt_len)
        tpot = floors[b.key].tpot(sample.prompt_len, sample.output_len)
        e2el = ttft + np.maximum(sample.output_len - 1, 0) * tpot
        bound = LatencyFloors(ttft, tpot, e2el, float(floors[b.key].floor[0]), sample.output_len)
        both = plan_margin(spec, [a.deployment, b.deployment], disaggregated=True)
        unit = Unit(a, b, n_p, n_d, n, cap, bound, both)
        reason = hopeless(bound, spec.slo, margin=search.prescreen_margin, scale=both.scale())
        if reason:
            pruned.append(unit.row() | {"status": "pruned", "reason": f"hopeless: {reason}"})
        elif len(units) >= spec.disaggregated.max_units:
            why = f"not searched: beyond disaggregated.max_units ({len(units)})"
            pruned.append(unit.row() | {"status": "pruned", "reason": why})
        else:
            units.append(unit)
    return units, pruned
