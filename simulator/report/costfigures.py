"""Figures of where time and money go: an operator roofline and a time breakdown (from
`report.ops.step_op_costs`), and cost against latency from `llmsim plan` (its `probes` and
`pareto` tables). Pure functions, DataFrames in, plotly `Figure`s out.

The roofline places each op of the representative steps at its arithmetic intensity (FLOPs per
DRAM byte) and the FLOP/s it achieves in the cost model, under the device's roofs: the dense
peak of each compute dtype the ops use and the memory bandwidth (both nominal, from the
hardware spec; the gap under a roof is the cost model's efficiencies and fixed latencies).
Ops without FLOPs (norms, activations, collectives) are not on it, only in the breakdown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from simulator.report.figures import COLORS, add_frontier, add_slo, metric_title, require, style
from simulator.specs.hardware import HardwareSpec

PHASE_SYMBOLS = {"prefill": "circle", "decode": "diamond"}
ROOF_DASHES = ("solid", "dash", "dot", "dashdot")


def roofline(op_costs: pd.DataFrame, hardware: HardwareSpec, *, title: str = "") -> go.Figure:
    """Achieved FLOP/s against arithmetic intensity (log-log), one marker per op and phase,
    under the roofs min(peak, intensity x bandwidth) of `hardware` for each compute dtype
    among the ops."""
    require(
        op_costs,
        ("phase", "op", "dtype", "flops", "bytes", "total_s", "bound"),
        what="the op costs",
    )
    ops = op_costs[(op_costs["flops"] > 0) & (op_costs["bytes"] > 0) & (op_costs["total_s"] > 0)]
    intensity = ops["flops"] / ops["bytes"]
    achieved = ops["flops"] / ops["total_s"]
    fig = go.Figure()
    _roofs(fig, hardware, dtypes=set(ops["dtype"]), intensity=intensity.to_numpy(float))
    for j, (phase, rows) in enumerate(ops.groupby("phase", sort=False)):
        hover = [
            f"{r.op} ({phase})<br>{r.flops / 1e9:,.2f} GFLOP, {r.bytes / 2**20:,.1f} MiB"
            f"<br>{r.total_s * 1e6:,.1f} us, {r.bound}-bound"
            for r in rows.itertuples()
        ]
        fig.add_trace(
            go.Scatter(
                x=intensity[rows.index],
                y=achieved[rows.index],
                mode="markers+text",
                name=f"{phase} step",
                text=rows["op"],
                textposition="top center",
                textfont={"size": 9},
                hovertext=hover,
                hoverinfo="text",
                marker={
                    "symbol": PHASE_SYMBOLS.get(str(phase), "square"),
                    "size": 10,
                    "color": COLORS[j % len(COLORS)],
                },
            )
        )
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP / byte of DRAM)")
    fig.update_yaxes(type="log", title_text="achieved FLOP/s")
    return style(fig, title=title or f"Operator roofline on {hardware.name}", height=520)


def _roofs(fig: go.Figure, hw: HardwareSpec, *, dtypes: set[str], intensity: np.ndarray) -> None:
    """A roof per compute dtype the device has a matrix unit for, spanning the ops and the
    ridge points with some room."""
    bw = hw.memory.bandwidth_bytes_per_s
    peaks = {d: hw.peak_flops(d) for d in sorted(dtypes) if hw.peak_flops(d) > 0}
    peaks = peaks or {"bf16": hw.peak_flops("bf16")}
    lo = min([*intensity, min(peaks.values()) / bw]) / 4
    hi = max([*intensity, max(peaks.values()) / bw]) * 4
    x = np.geomspace(lo, hi, 200)
    for i, (dtype, peak) in enumerate(peaks.items()):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=np.minimum(peak, x * bw),
                mode="lines",
                name=f"roof: {dtype} {peak / 1e12:,.0f} TFLOP/s, {bw / 1e12:.2f} TB/s",
                line={"color": "gray", "dash": ROOF_DASHES[i % len(ROOF_DASHES)]},
                hoverinfo="skip",
            )
        )


def op_breakdown(op_costs: pd.DataFrame, *, title: str = "") -> go.Figure:
    """Time of each op in the representative prefill and decode steps, stacked per phase
    (ms; the engine's launch time counts only where it is not hidden under GPU work, so a
    bar adds up to the step's wall time)."""
    require(op_costs, ("phase", "op", "total_s"), what="the op costs")
    hidden = op_costs["hidden_s"] if "hidden_s" in op_costs.columns else 0.0
    df = op_costs.assign(ms=1e3 * (op_costs["total_s"] - hidden))
    table = df.pivot_table(index="op", columns="phase", values="ms", aggfunc="sum", sort=False)
    phases = [p for p in ("prefill", "decode") if p in table.columns]
    phases += [p for p in table.columns if p not in phases]
    table = table[phases].fillna(0.0)
    table = table.loc[table.sum(axis=1).sort_values(ascending=False).index]
    wall = table.sum(axis=0)
    fig = go.Figure()
    for i, (op, row) in enumerate(table.iterrows()):
        fig.add_trace(
            go.Bar(
                x=[f"{p} step ({wall[p]:.2f} ms)" for p in phases],
                y=row.to_numpy(),
                name=str(op),
                marker={"color": COLORS[i % len(COLORS)]} if i < len(COLORS) else None,
                hovertemplate=f"{op}: %{{y:.3f}} ms<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="time per step (ms)")
    return style(fig, title=title or "Time by operator", height=520)


def cost_frontier(
    probes: pd.DataFrame,
    *,
    metric: str = "p99_tpot_ms",
    pareto: pd.DataFrame | None = None,
    slo_ms: float | None = None,
    cost: str = "usd_per_million_output_tokens",
    fleet: Mapping[str, Any] | None = None,
) -> go.Figure:
    """$ per million output tokens (on a log axis: a plan's layouts span decades of cost)
    against a latency (`metric`) for every simulation of a plan (`probes`: one colour per
    layout, filled if it met the SLOs, open if not), the frontier (`pareto`) as a line, the
    SLO on that latency (`slo_ms`), and the chosen fleet (`fleet`: its point prediction `x`,
    its error band `band` as a horizontal error bar, its cost `y`)."""
    require(probes, ("layout", "feasible", metric, cost), what="the plan's probes")
    fig = go.Figure()
    _probe_traces(fig, probes, metric=metric, cost=cost)
    if fleet is not None and fleet.get("y") is not None:
        x, band = float(fleet["x"]), fleet.get("band")
        error = (
            {
                "type": "data",
                "symmetric": False,
                "array": [band[1] - x],
                "arrayminus": [x - band[0]],
            }
            if band
            else None
        )
        fig.add_trace(
            go.Scatter(
                x=[x],
                y=[fleet["y"]],
                mode="markers",
                name="chosen fleet (point prediction" + (" and its error band)" if band else ")"),
                marker={"color": "black", "size": 14, "symbol": "star"},
                error_x=error,
            )
        )
    if pareto is not None and not pareto.empty:
        require(pareto, (metric, cost), what="the plan's frontier")
        add_frontier(fig, pareto, x=metric, y=cost, name="frontier")
    add_slo(fig, slo_ms)
    fig.update_xaxes(title_text=metric_title(metric))
    fig.update_yaxes(title_text="$ per million output tokens (log)", type="log")
    return style(fig, title="Cost against latency (llmsim plan)", height=480)


def _probe_traces(fig: go.Figure, probes: pd.DataFrame, *, metric: str, cost: str) -> None:
    """One colour per layout: filled markers where the probe met the SLOs, open where not."""
    feasible = probes["feasible"].astype(str).str.lower() == "true"
    for i, (layout, rows) in enumerate(probes.groupby("layout", sort=True)):
        ok = feasible[rows.index]
        for met, part in ((True, rows[ok]), (False, rows[~ok])):
            if part.empty:
                continue
            fig.add_trace(
                go.Scatter(
                    x=part[metric],
                    y=part[cost],
                    mode="markers",
                    name=f"{layout}" + ("" if met else " (misses SLOs)"),
                    legendgroup=str(layout),
                    text=[f"{r:.3g} req/s" for r in part.get("rate", pd.Series(dtype=float))],
                    marker={
                        "color": COLORS[i % len(COLORS)],
                        "size": 9,
                        "symbol": "circle" if met else "circle-open",
                    },
                )
            )


def plan_slo_ms(slo: Mapping[str, Any], metric: str) -> float | None:
    """The SLO a plan sets on `metric` (`p99_tpot_ms` -> `slo.tpot_ms.max` when its
    percentile is 99), or None."""
    stat, _, name = metric.removesuffix("_ms").partition("_")
    target = slo.get(f"{name}_ms")
    if isinstance(target, Mapping) and f"p{float(target.get('p', 99)):g}" == stat:
        return float(target["max"])
    return None
