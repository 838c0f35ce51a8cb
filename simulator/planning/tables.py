"""The plan's tables: one row per layout, ranked; the cost/latency frontier; money."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pandas as pd

from simulator.metrics.bands import Margin
from simulator.planning.fleet import single_layout_fleet
from simulator.planning.layouts import Candidate, Layout, Prepared, Searched
from simulator.planning.search import latency_key
from simulator.planning.spec import PlanSpec
from simulator.planning.trials import SeedCheck
from simulator.planning.units import Unit

PARETO_ORDER = ("tpot", "itl", "ttft", "e2el")  # the default frontier latency: first with an SLO
INT_COLUMNS = ("rank", "replicas", "gpus", "probes", "num_prompts")


def usd_per_million_tokens(usd_per_hour: float, *, rate: float, tokens_per_request: float) -> float:
    """What a deployment costing `usd_per_hour` pays per million tokens when it serves `rate`
    requests/s of `tokens_per_request` tokens each."""
    per_hour = rate * tokens_per_request * 3600.0
    return usd_per_hour / per_hour * 1e6 if per_hour > 0 else math.nan


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (NaN -> None, numpy scalars -> Python)."""
    loaded: list[dict[str, Any]] = json.loads(frame.to_json(orient="records"))
    return loaded


def layout_row(layout: Layout) -> dict[str, Any]:
    return {
        "layout": layout.key,
        "mode": "colocated",
        "hardware": layout.hardware,
        "engine": layout.engine,
        "quantization": layout.quantization or "none",
        "kv_cache_dtype": layout.kv_cache_dtype,
        "tp": layout.tp,
        "pp": layout.pp,
        "cp": layout.cp,
        "gpus_per_replica": layout.gpus,
        **dict(layout.knobs),
    }


def candidate_row(p: Candidate) -> dict[str, Any]:
    """The columns that say what a candidate is: its layout, or a unit's two."""
    if isinstance(p, Prepared):
        return layout_row(p.layout)
    assert isinstance(p, Unit)
    return p.row()


def prepared_row(p: Candidate) -> dict[str, Any]:
    return candidate_row(p) | {
        "precision": p.precision,
        "usd_per_gpu_hour": p.usd_per_gpu_hour,
        "ceiling_rate": p.ceiling,
        "num_prompts": p.num_prompts,
    }


def searched_row(
    spec: PlanSpec,
    s: Searched,
    *,
    target: float,
    mean_out: float,
    seeds: SeedCheck | None = None,
) -> dict[str, Any]:
    """A searched layout's row: its max rate (the one that held over the seeds where `seeds`
    checked it) and SLO use there (the seed closest to an SLO), and its own fleet for the
    target (`available` False when the GPU or replica limits forbid it; `reason` says why)."""
    p, rate = s.prepared, s.outcome.max_rate
    row = prepared_row(p) | {"probes": len(s.probes), "converged": s.outcome.converged}
    row |= margin_columns(p.margin)
    if seeds is not None:
        row |= {"searched_rate": rate, "seeds_met": seeds.met, "seeds": seeds.seeds}
        if seeds.rate <= 0:
            why = f"its rate held in {seeds.met} of {seeds.seeds} seeds ({seeds.reason})"
            return row | {"status": "infeasible", "reason": why}
        rate = seeds.rate
    if rate <= 0:
        last = s.probes[-1]["reason"] if s.probes else ""
        return row | {"status": "infeasible", "reason": f"no rate tried met the SLOs ({last})"}
    limits = {h.id: h.max_gpus for h in spec.candidates.hardware}
    replicas = spec.candidates.data_parallel_size
    alone, why_not = single_layout_fleet(
        dataclasses.replace(s.option, rate=rate),
        target_rate=target,
        gpu_limits=limits,
        min_replicas=replicas.min,
        max_replicas=replicas.max,
    )
    verdict = seeds.worst if seeds is not None and seeds.worst is not None else s.verdict
    assert verdict is not None  # a feasible rate has its verdict
    binding, ratio = verdict.binding
    notes = [why_not] if why_not else []
    if seeds is not None and seeds.rate < s.outcome.max_rate:
        notes.append(f"seeds: from {s.outcome.max_rate:.3g}")
    if not s.outcome.converged:
        notes.append(f"search stopped below {s.outcome.upper:.3g} req/s")
    return row | {
        "status": "feasible",
        "reason": "; ".join(notes),
        "available": not why_not,
        "max_rate": rate,
        "replicas": alone.replicas[p.key],
        "gpus": alone.gpus,
        "usd_per_hour": alone.usd_per_hour,
        "usd_per_million_output_tokens": usd_per_million_tokens(
            alone.usd_per_hour, rate=target, tokens_per_request=mean_out
        ),
        "max_rate_usd_per_million_output_tokens": usd_per_million_tokens(
            p.usd_per_hour, rate=rate, tokens_per_request=mean_out
        ),
        "energy_per_output_token_j": s.energy_j,
        "binding_slo": binding,
        "slo_ratio": ratio,
        **verdict.latency_ms,
        "goodput_fraction": verdict.goodput_fraction,
    }


def margin_columns(margin: Margin) -> dict[str, Any]:
    """A candidate's margin as table columns: the capacity and TTFT/TPOT factors, and why its
    bands are pooled (unbacked) if they are."""
    return {
        "margin_capacity": margin.capacity,
        "margin_ttft": margin.latency_factor("ttft"),
        "margin_tpot": margin.latency_factor("tpot"),
        "band_note": margin.note or "",
    }


def rank(frame: pd.DataFrame) -> pd.DataFrame:
    """Feasible layouts by the cost of their own fleet for the target (= $ per million output
    tokens at the target), those that can be had first, ties by $/M at their max rate; then
    infeasible ones, then pruned ones."""
    order = {"feasible": 0, "infeasible": 1, "pruned": 2}
    blocked = frame["available"].eq(False) if "available" in frame.columns else False
    frame = frame.assign(_status=frame["status"].map(order), _blocked=blocked)
    money = ("usd_per_hour", "max_rate_usd_per_million_output_tokens")
    sort = ["_status", "_blocked", *(c for c in money if c in frame.columns), "layout"]
    frame = frame.sort_values(sort, kind="stable").drop(columns=["_status", "_blocked"])
    feasible = (frame["status"] == "feasible").to_numpy()
    frame.insert(0, "rank", np.where(feasible, np.cumsum(feasible), 0))
    ints = {c: "Int64" for c in INT_COLUMNS if c in frame.columns}
    return frame.astype(ints).reset_index(drop=True)


def pareto_metric(spec: PlanSpec) -> str:
    targets = spec.slo.targets()
    metric = next((m for m in PARETO_ORDER if m in targets), "tpot")
    metric = spec.pareto_metric or metric
    return latency_key(metric, targets[metric].p if metric in targets else 99.0)


def pareto_frontier(points: pd.DataFrame, *, cost: str, latency: str) -> pd.DataFrame:
    """Feasible points that no other feasible point beats on both `cost` and `latency`
    (lower is better for both), cheapest first."""
    if points.empty or latency not in points.columns:
        return pd.DataFrame(columns=["layout", "rate", cost, latency])
    ok = points[points["feasible"]].sort_values([cost, latency], kind="stable")
    keep, best = [], math.inf
    for index, value in zip(ok.index, ok[latency], strict=True):
        if value < best:
            keep.append(index)
            best = value
    columns = [
        c for c in ("layout", "hardware", "engine", "quantization", "tp", "pp") if c in ok
    ] + ["rate", cost, latency]
    return ok.loc[keep, columns].reset_index(drop=True)
