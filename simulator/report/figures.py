"""Figures of a run and of a sweep: pure functions, DataFrames in, plotly `Figure`s out.

A run's tables are `RunResult.sim.requests` / `.steps` (or `requests.csv` / `steps.csv` of
`llmsim run --out`), its ITL sample `itl.csv` (`itl_s`, `weight`: how many tokens came that
long after their previous one). A sweep's table is `results.csv` (`sweep`'s DataFrame).
Times on the x axes are simulated seconds; latencies are in ms.

Long runs are reduced before plotting (`series.MAX_POINTS` points per trace: CDFs at evenly
spaced probabilities, time series as time-weighted means per bin with the bin's peak), so a
figure stays small whatever the run's length. More than `MAX_REPLICA_TRACES` replicas are
drawn as their mean and their maximum rather than one line each.

Not shown: requests that never finished (they have no latency; `summary.json` counts them as
`failed`), and requests waiting again after a preemption (the queue counts each request from
its arrival to its first scheduled step only).
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from simulator.errors import SpecError
from simulator.report.labels import series_columns, series_label
from simulator.report.series import MAX_POINTS, Binned, ecdf, piecewise, waiting
from simulator.serving.power import POWER_COLUMNS

MAX_REPLICA_TRACES = 8
TEMPLATE = "plotly_white"
COLORS = qualitative.Plotly
SLO_LINE = {"color": "crimson", "dash": "dash", "width": 1.5}
LATENCY_PANELS = (  # key, title, x axis
    ("ttft", "TTFT", "time to first token (ms)"),
    ("tpot", "TPOT", "time per output token, after the first (ms)"),
    ("itl", "ITL", "inter-token latency (ms)"),
    ("e2el", "E2E latency", "end-to-end latency (ms)"),
)


def require(frame: pd.DataFrame, columns: Sequence[str], *, what: str) -> None:
    """SpecError naming the first missing column of `frame` (a table called `what`)."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise SpecError(f"{what} lacks column(s) {', '.join(missing)}", field=missing[0])


def style(fig: go.Figure, *, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(
        title=title, template=TEMPLATE, height=height, margin={"t": 70, "b": 50, "l": 60, "r": 20}
    )
    return fig


def legend_below(fig: go.Figure, *, entries: int) -> go.Figure:
    """The legend under the plot, one entry a line, so that long series labels (a sweep's
    replica groups) take height instead of the plot's width; the figure grows to hold it."""
    fig.update_layout(
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "xanchor": "left", "x": 0},
        height=int(fig.layout.height or 420) + 22 * entries,
        margin={"b": 60 + 22 * entries},
    )
    fig.update_yaxes(domain=[0, 1])
    return fig


def slo_target(slo: Mapping[str, Any] | None, key: str) -> float | None:
    """The SLO for `key` (ttft, tpot, e2el) from a mapping keyed `ttft_ms` or `ttft`."""
    if not slo:
        return None
    value = slo.get(f"{key}_ms", slo.get(key))
    return float(value) if value is not None else None


# -- a run ----------------------------------------------------------------------------------------
def request_latencies(requests: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per completed request, in ms: `ttft`, `tpot` (requests with more than one output token;
    (E2E - TTFT) / (output - 1), as vLLM), `e2el`."""
    require(
        requests,
        ("arrival_s", "first_token_s", "finish_s", "output_tokens"),
        what="the requests table",
    )
    done = requests[requests["first_token_s"].notna() & requests["finish_s"].notna()]
    multi = done[done["output_tokens"] > 1]
    tpot = (multi["finish_s"] - multi["first_token_s"]) / (multi["output_tokens"] - 1)
    return {
        "ttft": 1e3 * (done["first_token_s"] - done["arrival_s"]).to_numpy(float),
        "tpot": 1e3 * tpot.to_numpy(float),
        "e2el": 1e3 * (done["finish_s"] - done["arrival_s"]).to_numpy(float),
    }


def latency_cdf(
    requests: pd.DataFrame,
    *,
    itl: pd.DataFrame | None = None,
    slo: Mapping[str, Any] | None = None,
    max_points: int = MAX_POINTS,
) -> go.Figure:
    """CDFs of TTFT, TPOT, ITL and E2E latency (2 x 2 panels), a dashed line at each SLO given
    (`slo`: `ttft_ms`, `tpot_ms`, `e2el_ms`, as a scenario's `slo`). The ITL panel needs the
    run's ITL sample (`itl`: columns `itl_s`, `weight`); it is left empty without one."""
    per_request = request_latencies(requests)
    samples: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
        k: (v, None) for k, v in per_request.items()
    }
    if itl is not None:
        require(itl, ("itl_s", "weight"), what="the ITL sample")
        samples["itl"] = (1e3 * itl["itl_s"].to_numpy(float), itl["weight"].to_numpy(float))
    fig = make_subplots(rows=2, cols=2, subplot_titles=[p[1] for p in LATENCY_PANELS])
    for i, (key, title, axis) in enumerate(LATENCY_PANELS):
        row, col = divmod(i, 2)
        unit = "tokens" if key == "itl" else "requests"
        fig.update_xaxes(title_text=axis, row=row + 1, col=col + 1)
        fig.update_yaxes(
            title_text=f"fraction of {unit}", range=[0, 1.02], row=row + 1, col=col + 1
        )
        if key not in samples:
            continue
        values, weights = samples[key]
        x, y = ecdf(values, weights=weights, max_points=max_points)
        fig.add_trace(
            go.Scatter(x=x, y=y, mode="lines", line_shape="hv", name=title, showlegend=False),
            row=row + 1,
            col=col + 1,
        )
        target = slo_target(slo, key)
        if target is not None:
            fig.add_vline(
                x=target,
                line=SLO_LINE,
                annotation_text=f"SLO {target:g} ms",
                row=row + 1,
                col=col + 1,
            )
    return style(fig, title="Latency distributions (CDF)", height=700)


def _by_replica(steps: pd.DataFrame) -> Iterator[tuple[int, pd.DataFrame]]:
    for replica, rows in steps.groupby("replica", sort=True):
        yield int(replica), rows


def _signal_traces(
    fig: go.Figure, signals: dict[str, Binned], *, unit: str, many: bool
) -> go.Figure:
    """Lines of per-replica signals; with `many`, their mean and maximum instead."""
    if many:
        stack = np.vstack([s.mean for s in signals.values()])
        peaks = np.vstack([s.peak for s in signals.values()])
        t = next(iter(signals.values())).time_s
        with warnings.catch_warnings():  # a bin where no replica ran is NaN, as it should be
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(stack, axis=0)
            top = np.nanmax(peaks, axis=0)
        fig.add_trace(go.Scatter(x=t, y=mean, mode="lines", name=f"mean of {len(signals)}"))
        fig.add_trace(go.Scatter(x=t, y=top, mode="lines", name="max", line={"dash": "dot"}))
        return fig
    for i, (name, s) in enumerate(signals.items()):
        color = COLORS[i % len(COLORS)]
        shape = "linear" if s.binned else "hv"
        label = f"{name} (mean per bin)" if s.binned else name
        fig.add_trace(
            go.Scatter(
                x=s.time_s,
                y=s.mean,
                mode="lines",
                line={"color": color, "shape": shape},
                name=label,
            )
        )
        if s.binned:
            fig.add_trace(
                go.Scatter(
                    x=s.time_s,
                    y=s.peak,
                    mode="lines",
                    name=f"{name} (max per bin)",
                    line={"color": color, "dash": "dot", "width": 1},
                )
            )
    fig.update_xaxes(title_text="time (s)")
    fig.update_yaxes(title_text=unit)
    return fig


def _step_signals(
    steps: pd.DataFrame, values: pd.Series, *, max_points: int
) -> tuple[dict[str, Binned], bool]:
    counts = steps["replica"].value_counts()
    many = len(counts) > MAX_REPLICA_TRACES
    span = (float(steps["start_s"].min()), float(steps["end_s"].max())) if many else None
    if many:  # common bins, no more than the busiest replica has steps
        max_points = min(max_points, int(counts.max()))
    signals = {
        f"replica {r}": piecewise(
            rows["start_s"], rows["end_s"], values.loc[rows.index], max_points=max_points, span=span
        )
        for r, rows in _by_replica(steps)
    }
    return signals, many


def kv_usage(
    steps: pd.DataFrame,
    *,
    capacity_blocks: int | Mapping[int, int] | None = None,
    max_points: int = MAX_POINTS,
) -> go.Figure:
    """KV-cache blocks in use during each step, per replica: as a percentage of the replica's
    capacity when `capacity_blocks` (one number, or one per replica index) is given, else in
    blocks."""
    require(steps, ("replica", "start_s", "end_s", "kv_used_blocks"), what="the steps table")
    used = steps["kv_used_blocks"].astype(float)
    unit = "KV cache blocks in use"
    if capacity_blocks is not None:
        caps = (
            steps["replica"].map(capacity_blocks)
            if isinstance(capacity_blocks, Mapping)
            else pd.Series(float(capacity_blocks), index=steps.index)
        )
        if caps.isna().any() or (caps <= 0).any():
            raise SpecError("a replica has no positive KV capacity", field="capacity_blocks")
        used, unit = 100.0 * used / caps.astype(float), "KV cache in use (%)"
    signals, many = _step_signals(steps, used, max_points=max_points)
    fig = _signal_traces(go.Figure(), signals, unit=unit, many=many)
    return style(fig, title="KV-cache usage")


def batch_size(steps: pd.DataFrame, *, max_points: int = MAX_POINTS) -> go.Figure:
    """Sequences in each engine step (decoding or computing a prompt chunk), per replica."""
    require(steps, ("replica", "start_s", "end_s", "num_seqs"), what="the steps table")
    signals, many = _step_signals(steps, steps["num_seqs"].astype(float), max_points=max_points)
    fig = _signal_traces(go.Figure(), signals, unit="sequences in the step", many=many)
    return style(fig, title="Batch size")


def queue_length(requests: pd.DataFrame, *, max_points: int = MAX_POINTS) -> go.Figure:
    """Requests waiting (arrived, not yet in a step) over time, all replicas together."""
    require(requests, ("arrival_s", "first_scheduled_s"), what="the requests table")
    times, counts = waiting(requests["arrival_s"], requests["first_scheduled_s"])
    signal = piecewise(times[:-1], times[1:], counts[:-1], max_points=max_points)
    fig = _signal_traces(go.Figure(), {"waiting": signal}, unit="requests waiting", many=False)
    return style(fig, title="Queue length")


FLEET_TRACES: tuple[tuple[str, str, dict[str, Any]], ...] = (  # column, legend, line
    ("serving", "serving", {"width": 2.5}),
    ("loading", "loading weights", {"dash": "dot"}),
    ("draining", "draining", {"dash": "dash"}),
    ("wanted", "wanted by the autoscaler", {"dash": "longdash", "width": 1}),
)


def fleet_replicas(fleet: pd.DataFrame) -> go.Figure:
    """An autoscaled group's replicas over time (`fleet.csv`, `RunResult.sim.fleet`): serving,
    loading their weights, draining, and the autoscaler's want, as steps (each count holds
    from its row until the next). With more than one autoscaled group (a `group` column),
    each group's serving replicas and want, one color a group."""
    require(fleet, ("time_s", *(c for c, _, _ in FLEET_TRACES)), what="the fleet table")
    fig = go.Figure()
    groups = sorted(fleet["group"].unique()) if "group" in fleet else []
    # (rows, column, legend, line style, color) of each trace
    if len(groups) > 1:
        traces = [
            (
                fleet[fleet["group"] == g],
                column,
                f"group {g}: {name}",
                line,
                COLORS[i % len(COLORS)],
            )
            for i, g in enumerate(groups)
            for column, name, line in (FLEET_TRACES[0], FLEET_TRACES[-1])
        ]
    else:
        traces = [(fleet, c, n, line, COLORS[i]) for i, (c, n, line) in enumerate(FLEET_TRACES)]
    for rows, column, name, line, color in traces:
        fig.add_trace(
            go.Scatter(
                x=rows["time_s"],
                y=rows[column],
                name=name,
                mode="lines",
                line={"shape": "hv", "color": color, **line},
            )
        )
    fig.update_xaxes(title_text="time (s)")
    fig.update_yaxes(title_text="replicas", rangemode="tozero", dtick=1)
    return style(fig, title="Autoscaled replicas over time")


def power_trace(power: pd.DataFrame, *, budget_w: float | None = None) -> go.Figure:
    """A power-budgeted fleet's draw over time (`power.csv`, `RunResult.sim.power`): each
    sample and the windowed mean the controller reads, the budget as a line, and below, the
    replicas capped (as steps: a count holds until the next sample)."""
    require(power, POWER_COLUMNS, what="the power table")
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3], vertical_spacing=0.06
    )
    for i, (column, name, line) in enumerate(
        (("draw_w", "fleet draw (sampled)", {"width": 1}), ("window_w", "windowed mean", {}))
    ):
        fig.add_trace(
            go.Scatter(
                x=power["time_s"],
                y=power[column],
                name=name,
                mode="lines",
                line={"color": COLORS[i], **line},
            ),
            row=1,
            col=1,
        )
    if budget_w is not None and len(power):
        times = power["time_s"]
        fig.add_trace(
            go.Scatter(
                x=[float(times.min()), float(times.max())],
                y=[budget_w, budget_w],
                name="budget",
                mode="lines",
                line={"color": "black", "dash": "dash"},
            ),
            row=1,
            col=1,
        )
    fig.add_trace(
        go.Scatter(
            x=power["time_s"],
            y=power["capped_replicas"],
            name="replicas capped",
            mode="lines",
            line={"shape": "hv", "color": COLORS[2]},
        ),
        row=2,
        col=1,
    )
    fig.update_xaxes(title_text="time (s)", row=2, col=1)
    fig.update_yaxes(title_text="W", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="capped", rangemode="tozero", row=2, col=1)
    return style(fig, title="Fleet power draw over time")


# -- a sweep --------------------------------------------------------------------------------------
def ok_runs(results: pd.DataFrame) -> pd.DataFrame:
    """The rows of a sweep's results that finished (`status` ok; every row without one)."""
    return results[results["status"] == "ok"] if "status" in results.columns else results


def _series(frame: pd.DataFrame, by: Sequence[str]) -> Iterator[tuple[str, pd.DataFrame]]:
    """The runs of each combination of the `by` values, labelled for a reader (`labels`)."""
    by = series_columns(frame, by)
    if not by:
        yield "", frame
        return
    for key, rows in frame.groupby(list(by), sort=True, dropna=False):
        parts: tuple[Hashable, ...] = key if isinstance(key, tuple) else (key,)
        yield series_label(by, parts), rows


def default_rate(results: pd.DataFrame) -> str:
    """The offered rate if the sweep varies it, else the achieved request throughput."""
    return "workload.request_rate" if "workload.request_rate" in results else "request_throughput"


def rate_latency(
    results: pd.DataFrame,
    *,
    rate: str | None = None,
    by: Sequence[str] = (),
    slo: Mapping[str, Any] | None = None,
    stats: Sequence[str] = ("median", "p99"),
) -> go.Figure:
    """TTFT and TPOT (each `stats` of them: `median_ttft_ms`, `p99_ttft_ms`, ...) against the
    request rate (`rate`, default `default_rate`), one line per value of the `by` columns, and
    a dashed line at each SLO given (`ttft_ms`, `tpot_ms`)."""
    rate = rate or default_rate(results)
    needed = [rate, *by, *(f"{s}_{m}_ms" for s in stats for m in ("ttft", "tpot"))]
    require(results, needed, what="the sweep results")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT", "TPOT"))
    dashes = ("dash", "solid", "dot", "dashdot")
    for i, (label, rows) in enumerate(_series(ok_runs(results), by)):
        rows = rows.sort_values(rate)
        for j, stat in enumerate(stats):
            for col, metric in enumerate(("ttft", "tpot"), start=1):
                fig.add_trace(
                    go.Scatter(
                        x=rows[rate],
                        y=rows[f"{stat}_{metric}_ms"],
                        mode="lines+markers",
                        name=f"{label} {stat}".strip(),
                        legendgroup=f"{label} {stat}",
                        showlegend=col == 1,
                        line={"color": COLORS[i % len(COLORS)], "dash": dashes[j % len(dashes)]},
                    ),
                    row=1,
                    col=col,
                )
    for col, metric in enumerate(("ttft", "tpot"), start=1):
        target = slo_target(slo, metric)
        if target is not None:
            fig.add_hline(
                y=target, line=SLO_LINE, annotation_text=f"SLO {target:g} ms", row=1, col=col
            )
        fig.update_xaxes(title_text=_rate_title(rate), row=1, col=col)
        fig.update_yaxes(title_text=f"{metric.upper()} (ms)", row=1, col=col)
    style(fig, title="Latency against request rate", height=460)
    return legend_below(fig, entries=sum(1 for trace in fig.data if trace.showlegend is not False))


def _rate_title(rate: str) -> str:
    if rate == "workload.request_rate":
        return "offered request rate (req/s)"
    return "achieved request throughput (req/s)" if rate == "request_throughput" else rate


def pareto_mask(throughput: np.ndarray, latency: np.ndarray) -> np.ndarray:
    """Points no other point beats on both (higher throughput, lower latency)."""
    order = np.lexsort((-throughput, latency))
    best, keep = -np.inf, np.zeros(throughput.size, dtype=bool)
    for i in order:
        if throughput[i] > best:
            keep[i], best = True, throughput[i]
    return keep


def throughput_latency_pareto(
    results: pd.DataFrame,
    *,
    latency: str = "p99_tpot_ms",
    throughput: str = "output_throughput",
    by: Sequence[str] = (),
    slo_ms: float | None = None,
) -> go.Figure:
    """Each finished run as a point (throughput against latency, one colour per value of the
    `by` columns), and the Pareto frontier: the runs no other run beats on both."""
    require(results, [latency, throughput, *by], what="the sweep results")
    ok = ok_runs(results).dropna(subset=[latency, throughput])
    fig = go.Figure()
    for i, (label, rows) in enumerate(_series(ok, by)):
        hover = rows["run_id"].astype(str) if "run_id" in rows else None
        fig.add_trace(
            go.Scatter(
                x=rows[latency],
                y=rows[throughput],
                mode="markers",
                name=label or "runs",
                text=hover,
                marker={"color": COLORS[i % len(COLORS)], "size": 9},
            )
        )
    keep = pareto_mask(ok[throughput].to_numpy(float), ok[latency].to_numpy(float))
    add_frontier(fig, ok[keep], x=latency, y=throughput, name="Pareto frontier")
    add_slo(fig, slo_ms)
    fig.update_xaxes(title_text=metric_title(latency))
    fig.update_yaxes(title_text=metric_title(throughput))
    style(fig, title="Throughput against latency")
    return legend_below(fig, entries=sum(1 for trace in fig.data if trace.showlegend is not False))


def add_frontier(fig: go.Figure, front: pd.DataFrame, *, x: str, y: str, name: str) -> None:
    """The frontier through the rows of `front` (sorted by `x`) as a black step line."""
    front = front.sort_values(x)
    line = {"color": "black", "shape": "hv", "width": 1.5}
    fig.add_trace(go.Scatter(x=front[x], y=front[y], mode="lines", name=name, line=line))


def add_slo(fig: go.Figure, slo_ms: float | None) -> None:
    """The SLO on the x axis (`slo_ms`; None: none) as a vertical line."""
    if slo_ms is not None:
        fig.add_vline(x=slo_ms, line=SLO_LINE, annotation_text=f"SLO {slo_ms:g} ms")


METRIC_UNITS = {
    "output_throughput": "output tokens/s",
    "total_token_throughput": "tokens/s",
    "request_throughput": "requests/s",
    "request_goodput": "requests/s",
}


def metric_title(column: str) -> str:
    """`p99_tpot_ms` -> `p99 TPOT (ms)`; `output_throughput` -> `output throughput (output
    tokens/s)`."""
    if column.endswith("_ms"):
        stat, _, metric = column.removesuffix("_ms").partition("_")
        return f"{stat} {metric.upper()} (ms)"
    unit = METRIC_UNITS.get(column)
    return f"{column.replace('_', ' ')} ({unit})" if unit else column
