"""The report of a folder: which figures and tables a run, a sweep or a plan gets, and
`write_report`, which writes them as one HTML file (`llmsim report DIR [-o FILE]`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from simulator.errors import SpecError
from simulator.outputs import replace_file
from simulator.planning.report import latency_text
from simulator.report import costfigures as cf
from simulator.report import figures as fg
from simulator.report.html import Section, render, table_html
from simulator.report.labels import value_label
from simulator.report.load import Loaded, PlanFolder, RunFolder, SweepFolder, load
from simulator.report.ops import run_op_costs

REPORT_FILE = "report.html"
MAX_ROOFLINE_GROUPS = 4  # replica groups that get a roofline and a breakdown
MAX_ERROR_ROWS = 20
PLAN_COLUMNS = (
    "layout",
    "max_rate",
    "binding_slo",
    "slo_ratio",
    "replicas",
    "gpus",
    "usd_per_hour",
    "usd_per_million_output_tokens",
)
PLAN_HEADERS = {
    "max_rate": "req/s per replica",
    "binding_slo": "binding SLO",
    "slo_ratio": "SLO use at max rate",
    "usd_per_hour": "$/hour",
    "usd_per_million_output_tokens": "$/M output tokens",
}
SUMMARY_KEYS = (  # key, label, format
    ("completed", "completed requests", "d"),
    ("failed", "failed requests", "d"),
    ("duration", "duration (s)", ".2f"),
    ("request_throughput", "request throughput (req/s)", ".2f"),
    ("request_goodput", "request goodput (req/s)", ".2f"),
    ("output_throughput", "output throughput (tok/s)", ",.1f"),
    ("total_token_throughput", "total token throughput (tok/s)", ",.1f"),
    ("hardware_bound_tok_s", "hardware-limit bound (tok/s, datasheet peaks)", ",.1f"),
    ("hardware_bound_resource", "bound set by", "s"),
    ("bound_share", "share of the bound", ".1%"),
    ("mean_ttft_ms", "mean TTFT (ms)", ".1f"),
    ("p99_ttft_ms", "p99 TTFT (ms)", ".1f"),
    ("mean_tpot_ms", "mean TPOT (ms)", ".2f"),
    ("p99_tpot_ms", "p99 TPOT (ms)", ".2f"),
    ("p99_itl_ms", "p99 ITL (ms)", ".2f"),
    ("p99_e2el_ms", "p99 E2E latency (ms)", ".1f"),
    ("mean_queueing_ms", "mean queueing (ms)", ".1f"),
    ("preemptions", "preemptions", "d"),
    ("kv_cache_peak_fraction", "KV cache peak", ".1%"),
    ("energy_per_output_token_j", "energy per output token (J)", ".3f"),
    ("usd_per_million_output_tokens", "$ per million output tokens", ".3f"),
)


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        return format(int(value) if spec == "d" else float(value), spec)
    except (TypeError, ValueError):
        return str(value)


def _cp(size: int) -> str:
    """The `cp=N` suffix of a context-parallel group's label (nothing without CP)."""
    return f" cp={size}" if size > 1 else ""


def _run(run: RunFolder) -> tuple[str, str, list[Section]]:
    s = run.summary
    rows = [(label, _fmt(s[key], spec)) for key, label, spec in SUMMARY_KEYS if key in s]
    top = Section("Summary", tables=[table_html(rows)])
    scenario = run.scenario
    slo = scenario.slo.model_dump() if scenario and scenario.slo else None
    if scenario:
        groups = "; ".join(
            f"{g.count} x {g.hardware} tp={g.tensor_parallel_size} "
            f"pp={g.pipeline_parallel_size}{_cp(g.context_parallel_size)} ({g.engine})"
            for g in scenario.replicas
        )
        top.text.append(f"{scenario.model} on {groups}.")
    latency = Section(
        "Latency",
        text=[]
        if run.itl is not None
        else ["No ITL sample (itl.csv or .parquet) in the folder: its panel is empty."],
        figures=[fg.latency_cdf(run.requests, itl=run.itl, slo=slo)],
    )
    load_section = Section(
        "Load over time",
        text=["Long runs are averaged into time bins (time-weighted mean, dotted: the peak)."],
        figures=[
            fg.kv_usage(run.steps, capacity_blocks=_kv_capacity(run)),
            fg.batch_size(run.steps),
            fg.queue_length(run.requests),
        ],
    )
    return (
        f"llmsim run: {s.get('scenario', run.folder.name)}",
        str(run.folder),
        [
            top,
            latency,
            load_section,
            *_fleet_sections(run),
            *_power_sections(run),
            *_operator_sections(run),
        ],
    )


def _fleet_sections(run: RunFolder) -> list[Section]:
    """An autoscaled run's replicas over time, with its GPU-hours and scale-ups."""
    if run.fleet is None:
        return []
    s = run.summary
    facts = [
        ("fleet_gpu_hours", "GPU-hours", ".3f"),
        ("fleet_replicas_mean", "replicas serving (time-weighted mean)", ".2f"),
        ("fleet_replicas_peak", "replicas serving (peak)", ".0f"),
        ("fleet_scale_ups", "replicas added", ".0f"),
        ("fleet_load_s", "weight load per added replica (s)", ".2f"),
    ]
    rows = [(label, _fmt(s[key], spec)) for key, label, spec in facts if key in s]
    return [
        Section(
            "Autoscaling",
            text=["Each autoscaled group's replicas at each evaluation and change (fleet.csv)."],
            tables=[table_html(rows)] if rows else [],
            figures=[fg.fleet_replicas(run.fleet)],
        )
    ]


def _power_sections(run: RunFolder) -> list[Section]:
    """A power-budgeted run's fleet draw over time, with its budget and caps."""
    if run.power is None:
        return []
    s = run.summary
    facts = [
        ("power_budget_w", "budget (W)", ".0f"),
        ("power_cap_w", "cap of a capped GPU (W)", ".0f"),
        ("power_peak_draw_w", "fleet draw, peak sample (W)", ".0f"),
        ("power_peak_window_w", "fleet draw, peak window (W)", ".0f"),
        ("power_mean_draw_w", "fleet draw, mean (W)", ".0f"),
        ("power_over_budget_share", "windows over budget", ".1%"),
        ("power_capped_share", "replica-time capped", ".1%"),
    ]
    rows = [(label, _fmt(s[key], spec)) for key, label, spec in facts if s.get(key) is not None]
    budget = s.get("power_budget_w")
    return [
        Section(
            "Power budget",
            text=[
                "The fleet's estimated GPU draw at each sample and the replicas capped (power.csv)."
            ],
            tables=[table_html(rows)] if rows else [],
            figures=[fg.power_trace(run.power, budget_w=None if budget is None else float(budget))],
        )
    ]


def _kv_capacity(run: RunFolder) -> dict[int, int] | None:
    """KV capacity in blocks of each replica index, from memory.json and the scenario."""
    if run.scenario is None or run.memory is None:
        return None
    if len(run.memory) != len(run.scenario.replicas):
        return None
    caps: dict[int, int] = {}
    for g, (spec, plan) in enumerate(zip(run.scenario.replicas, run.memory, strict=True)):
        # an autoscaled group is built with max_replicas (serving.fleet)
        scale = run.scenario.autoscaled(g)
        count = scale.max_replicas if scale is not None else spec.num_replicas
        for _ in range(count):  # DP attention: each rank is a replica
            caps[len(caps)] = int(plan["kv_capacity_blocks"])
    return caps


def _operator_sections(run: RunFolder) -> list[Section]:
    if run.scenario is None:
        return [Section("Operators", text=["No scenario.json in the folder: no roofline."])]
    sections = []
    for index, spec in enumerate(run.scenario.replicas[:MAX_ROOFLINE_GROUPS]):
        ops = run_op_costs(run.scenario, run.requests, run.steps, group=index)
        where = f"{spec.hardware} tp={spec.tensor_parallel_size} pp={spec.pipeline_parallel_size}"
        where += _cp(spec.context_parallel_size)
        decode = (
            f"{ops.decode_batch} sequences at {ops.context_len} tokens of context"
            if ops.decode_batch
            else "none: nothing decoded"
        )
        wall = ops.costs.assign(t=ops.costs["total_s"] - ops.costs["hidden_s"])
        times = wall.groupby("phase", sort=False)["t"].sum()
        text = (
            f"The cost model's operators for {run.scenario.model} on {where}: a prefill step "
            f"of one {ops.prompt_tokens}-token prompt and a decode step of {decode} (the "
            "run's median prompt, decode batch and half its median output). Step time: "
            + ", ".join(f"{p} {1e3 * t:.2f} ms" for p, t in times.items())
            + "."
        )
        sections.append(
            Section(
                f"Operators: group {index} ({where})",
                text=[text],
                figures=[
                    cf.roofline(ops.costs, ops.deployment.hardware),
                    cf.op_breakdown(ops.costs),
                ],
            )
        )
    return sections


def _sweep(sweep: SweepFolder) -> tuple[str, str, list[Section]]:
    results = sweep.results
    ok = fg.ok_runs(results)
    errors = results[results["status"] != "ok"] if "status" in results.columns else ok.iloc[:0]
    top = Section(
        "Summary",
        text=[
            f"{len(ok)} finished run(s), {len(errors)} error(s); varied: "
            + (", ".join(sweep.varied) or "nothing")
            + "."
        ],
    )
    if len(errors):
        cells = [
            (
                str(r["run_id"]),
                *(value_label(c, r[c]) for c in sweep.varied),
                str(r.get("error", "")),
            )
            for _, r in errors.head(MAX_ERROR_ROWS).iterrows()
        ]
        top.tables.append(table_html(cells, header=("run_id", *sweep.varied, "error")))
    if ok.empty:
        top.text.append("No run finished: nothing to plot.")
        return "llmsim sweep", str(sweep.folder), [top]
    rate = fg.default_rate(results)
    # The other varied values name the lines (one that takes a single value names nothing).
    by = [c for c in sweep.varied if c != rate and results[c].nunique(dropna=False) > 1]
    slo = sweep.slo or {}
    figures = [fg.rate_latency(results, rate=rate, by=by, slo=slo)]
    if {"p99_tpot_ms", "output_throughput"} <= set(results.columns):
        tpot_slo = fg.slo_target(slo, "tpot")
        figures.append(fg.throughput_latency_pareto(results, by=by, slo_ms=tpot_slo))
    return "llmsim sweep", str(sweep.folder), [top, Section("Rate and latency", figures=figures)]


def _plan(plan: PlanFolder) -> tuple[str, str, list[Section]]:
    p = plan.plan
    fleet = p.get("fleet", {})
    lines = [f"{p.get('model', '?')} at {_fmt(p.get('target_rate'), '.4g')} req/s target."]
    if fleet.get("found"):
        mix = " + ".join(f"{r['replicas']} x {r['layout']}" for r in fleet.get("replicas", []))
        lines.append(
            f"Cheapest fleet: {mix}: {fleet.get('gpus')} GPU(s), "
            f"${_fmt(fleet.get('usd_per_hour'), '.2f')}/hour, "
            f"${_fmt(fleet.get('usd_per_million_output_tokens'), '.3f')}/M output tokens."
        )
        lines += _plan_margin_lines(p)
    else:
        lines.append(f"Cheapest fleet: none ({fleet.get('reason', '')}).")
    top = Section("Summary", text=lines)
    sections = [top]
    backing = p.get("backing") or []
    if backing:
        backed = [
            (
                str(b.get("hardware")),
                str(b.get("engine")),
                f"{b.get('validation_rows', 0)} ({', '.join(b.get('suites') or []) or 'none'})",
                f"x{_fmt(b.get('margin_capacity'), '.2f')}",
                f"x{_fmt(b.get('margin_ttft'), '.2f')} / x{_fmt(b.get('margin_tpot'), '.2f')}",
                str(b.get("note") or ""),
            )
            for b in backing
        ]
        header = ("hardware", "engine", "validation rows (suites)", "slower by", "TTFT / TPOT")
        sections.append(
            Section(
                "What backs each device",
                text=[
                    "The held-out validation rows behind each device and engine, and the margin "
                    "the plan judged it with (the upper edge of its error bands, "
                    "docs/error-bands.md). A device without rows takes the bands of all devices."
                ],
                tables=[table_html(backed, header=(*header, "note"))],
            )
        )
    if plan.candidates is not None and "status" in plan.candidates.columns:
        feasible = plan.candidates[plan.candidates["status"] == "feasible"]
        shown = [c for c in PLAN_COLUMNS if c in feasible.columns]
        cells = [[_fmt(v, ".3g") for v in row] for row in feasible[shown].itertuples(index=False)]
        top.tables.append(table_html(cells, header=[PLAN_HEADERS.get(c, c) for c in shown]))
        pruned = plan.candidates[plan.candidates["status"] != "feasible"]
        if len(pruned) and {"layout", "reason"} <= set(pruned.columns):
            cells = [
                [str(r.layout), str(r.status), r.reason if isinstance(r.reason, str) else ""]
                for r in pruned.itertuples(index=False)
            ]
            dropped = Section(
                "Dropped candidates",
                text=[f"{len(pruned)} candidate(s) the plan did not keep, and why."],
                tables=[table_html(cells, header=("layout", "status", "reason"))],
            )
            sections.append(dropped)
    metric = str(p.get("pareto_metric", "p99_tpot_ms"))
    if plan.probes.empty or metric not in plan.probes.columns:
        top.text.append("No simulation in probes.csv: nothing to plot.")
        return f"llmsim plan: {p.get('name', '')}", str(plan.folder), sections
    slo = cf.plan_slo_ms(p.get("slo") or {}, metric)
    figure = cf.cost_frontier(
        plan.probes, metric=metric, pareto=plan.pareto, slo_ms=slo, fleet=_fleet_point(p, metric)
    )
    frontier = Section("Cost against latency", figures=[figure])
    return f"llmsim plan: {p.get('name', '')}", str(plan.folder), [*sections, frontier]


def _plan_margin_lines(p: dict[str, Any]) -> list[str]:
    """The fleet's check over seeds, binding SLO, headroom and point prediction with bands."""
    fleet = p.get("fleet", {})
    check = fleet.get("verification") or {}
    lines = []
    if "seeds" in check:
        edge = (
            f"at the {p['confidence']:.0%} edge of the error bands" if p.get("confidence") else ""
        )
        lines.append(
            f"Checked by simulation at the target {edge}: meets the SLOs in "
            f"{check.get('seeds_met')} of {check.get('seeds')} seeds "
            f"({_fmt(fleet.get('slo_attainment'), '.0%')})."
        )
    if fleet.get("binding_slo"):
        lines.append(
            f"Binding SLO: {fleet['binding_slo']} at {_fmt(fleet.get('binding_slo_ratio'), '.0%')}"
            f" of its target; headroom {_fmt(fleet.get('headroom'), '+.0%')} load."
        )
    prediction = fleet.get("prediction") or {}
    if any(k.startswith("p") and k.endswith("_ms") for k in prediction):
        coverage = prediction.get("interval_coverage")
        where = (
            f" (bands at {coverage:.0%})"
            if coverage
            else f" (no bands: {prediction.get('interval_note', '')})"
        )
        text = latency_text(prediction, bands=True)
        lines.append(f"Point prediction at the target: {text}{where}.")
    return lines


def _fleet_point(p: dict[str, Any], metric: str) -> dict[str, Any] | None:
    """The chosen fleet on the cost frontier: its point prediction of `metric`, the band as an
    error bar, and its cost per million output tokens."""
    fleet = p.get("fleet", {})
    prediction = fleet.get("prediction") or {}
    if not fleet.get("found") or metric not in prediction:
        return None
    return {
        "x": prediction[metric],
        "band": prediction.get(f"{metric}_interval"),
        "y": fleet.get("usd_per_million_output_tokens"),
    }


def build(loaded: Loaded) -> tuple[str, str, list[Section]]:
    """(title, subtitle, sections) of a loaded folder."""
    match loaded:
        case RunFolder():
            return _run(loaded)
        case SweepFolder():
            return _sweep(loaded)
        case PlanFolder():
            return _plan(loaded)


def write_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of a run, sweep or plan folder to `out` (default DIR/report.html);
    returns its path. SpecError for a folder that is none of these (or one cut short or mixing
    two results) or a file it cannot write."""
    title, subtitle, sections = build(load(folder))
    path = Path(out) if out is not None else Path(folder) / REPORT_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        html = render(title, subtitle, sections)
        if out is None:  # into the result folder: never through a link planted there
            replace_file(path, html)
        else:
            path.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot write the report ({exc.strerror})", source=str(path)) from None
    return path
