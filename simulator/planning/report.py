"""A plan's outputs: the readable tables of `llmsim plan`, and the files of `--out DIR`
(plan.json, candidates.csv, pareto.csv, probes.csv)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table

from simulator.metrics.bands import band_lines, band_text
from simulator.outputs import atomic_folder

if TYPE_CHECKING:
    from simulator.planning.plan import PlanResult

PLAN_FILES = ("plan.json", "candidates.csv", "pareto.csv", "probes.csv")  # beside manifest.json


def save_plan(result: PlanResult, out: str | Path) -> Path:
    """Write plan.json, candidates.csv, pareto.csv, probes.csv and manifest.json as the folder
    `out`, whole or not at all (`simulator.outputs.atomic_folder`); returns it."""
    with atomic_folder(out, "plan", PLAN_FILES) as folder:
        (folder / "plan.json").write_text(json.dumps(result.as_json(), indent=2) + "\n")
        result.candidates.to_csv(folder / "candidates.csv", index=False)
        result.pareto.to_csv(folder / "pareto.csv", index=False)
        result.probes.to_csv(folder / "probes.csv", index=False)
    return Path(out)


def _given(value: Any) -> bool:
    """Whether a table cell holds a value (not None, NA or NaN)."""
    return (
        value is not None
        and value is not pd.NA
        and not (isinstance(value, float) and math.isnan(value))
    )


def _num(value: Any, spec: str) -> str:
    return format(value, spec) if _given(value) else "-"


def _slo_line(result: PlanResult) -> str:
    slo = result.spec.slo
    parts = [f"p{t.p:g} {m.upper()} <= {t.max:g} ms" for m, t in slo.targets().items()]
    if slo.goodput is not None:
        parts.append(f"goodput >= {slo.goodput:.0%}")
    return ", ".join(parts) or "none (the most each layout keeps up with)"


def _candidates_table(frame: pd.DataFrame) -> Table:
    table = Table(
        title="Candidates (cheapest fleet for the target first)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("layout", overflow="fold")
    table.add_column("precision", no_wrap=True)
    names = ("req/s/replica", "seeds", "replicas", "GPUs", "$/hour", "$/M out")
    for name in (*names, "J/tok"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("binding SLO", no_wrap=True)
    for row in frame[frame["status"] == "feasible"].to_dict("records"):
        binding = f"{row['binding_slo']} at {_num(row['slo_ratio'], '.0%')}"
        note = f" ({row['reason']})" if row["reason"] else ""
        seeds = row.get("seeds_met")
        checked = f"{seeds:.0f}/{row['seeds']:.0f}" if _given(seeds) else "-"
        table.add_row(
            str(row["rank"]),
            row["layout"] + note,
            row["precision"],
            _num(row["max_rate"], ".2f"),
            checked,
            str(row["replicas"]),
            str(row["gpus"]),
            _num(row["usd_per_hour"], ".2f"),
            _num(row["usd_per_million_output_tokens"], ".3f"),
            _num(row.get("energy_per_output_token_j"), ".3f"),
            binding,
        )
    return table


def _fleet_lines(result: PlanResult) -> list[str]:
    summary = result.fleet_summary
    if not summary.get("found"):
        return [f"Cheapest fleet: none ({summary.get('reason', '')})"]
    mix = " + ".join(f"{r['replicas']} x {r['layout']}" for r in result.fleet.to_dict("records"))
    lines = [
        f"Cheapest fleet: {mix}: {summary['gpus']} GPU{'s' if summary['gpus'] != 1 else ''}, "
        f"{summary['rate']:.2f} req/s capacity, ${summary['usd_per_hour']:.2f}/hour, "
        f"${summary['usd_per_million_output_tokens']:.3f}/M output tokens"
    ]
    for rejected in summary.get("rejected", []):
        mix = " + ".join(f"{n} x {key}" for key, n in rejected["replicas"].items())
        lines.append(
            f"  (cheaper but rejected after simulation: {mix}, "
            f"${rejected['usd_per_hour']:.2f}/hour: {rejected['reason']})"
        )
    check = summary.get("verification")
    if check:
        verdict = "meets the SLOs" if check["meets_slos"] else f"MISSES: {check['reason']}"
        edge = _edge_words(result)
        seeds = ""
        if "seeds" in check:
            seeds = f" in {check['seeds_met']} of {check['seeds']} seeds"
        lines.append(
            f"  simulated at {check['rate']:.4g} req/s{edge} ({check['num_prompts']} requests, "
            f"{result.spec.router.kind} router, median of the seeds): {latency_text(check)}: "
            f"{verdict}{seeds}"
        )
        if check.get("binding_slo"):
            lines.append(
                f"  binding SLO: {check['binding_slo']} at {check['binding_slo_ratio']:.0%} of "
                f"its target; headroom: {summary['headroom']:+.0%} load ({summary['rate']:.2f} "
                "req/s, the sum of its replicas' rates)"
            )
    prediction = summary.get("prediction")
    if prediction and any(k.endswith("_ms") for k in prediction):
        lines.append(
            f"  point prediction at {prediction['rate']:.4g} req/s: "
            f"{latency_text(prediction, bands=True)}"
        )
        lines += [f"  {line}" for line in band_lines(prediction)]
    return lines


def latency_text(data: Mapping[str, Any], *, bands: bool = False) -> str:
    """`p99 TTFT 162.0 ms, ...` for the latency keys of `data` (with their bands): the plan's
    fleet check and point prediction, on the terminal and in the report."""
    keys = [k for k in data if k.startswith("p") and k.endswith("_ms")]
    return ", ".join(
        f"{key.split('_')[0]} {key.split('_')[1].upper()} {data[key]:.1f} ms"
        + (f" {band_text(data, key, '.1f') or ''}".rstrip() if bands else "")
        for key in keys
    )


def _edge_words(result: PlanResult) -> str:
    """` at the edge of the error bands (90%)` when the plan judges with a margin."""
    margin = result.fleet_summary.get("margin") or {}
    if not result.spec.search.band_margin or margin.get("capacity_factor", 1.0) == 1.0:
        return ""
    return f" at the {result.spec.confidence:.0%} edge of the error bands"


def _margin_line(result: PlanResult) -> str:
    """What the margin does, for the header: the factors by hardware, and which are pooled."""
    spec = result.spec
    if not spec.search.band_margin:
        return f"Judged at the point predictions (no error-band margin), over {spec.seeds} seeds."
    frame = result.candidates
    by_hardware: dict[str, str] = {}
    if "margin_capacity" in frame.columns:
        for row in frame[frame["margin_capacity"].notna()].to_dict("records"):
            pooled = "*" if row.get("band_note") else ""
            by_hardware.setdefault(
                str(row["hardware"]),
                f"{row['hardware']} x{row['margin_capacity']:.2f} (TTFT x{row['margin_ttft']:.2f},"
                f" TPOT x{row['margin_tpot']:.2f}){pooled}",
            )
    column = frame.get("band_note", pd.Series(dtype=str))
    notes = sorted({str(n) for n in column if _given(n) and n})
    line = (
        f"Judged at the {spec.confidence:.0%} edge of the error bands (docs/error-bands.md), as "
        f"if the hardware ran slower: {'; '.join(by_hardware.values()) or 'none'}. A fleet must "
        f"meet the SLOs in {spec.confidence:.0%} of {spec.seeds} seeds."
    )
    if notes:
        line += f" *Pooled bands: {'; '.join(notes)}."
    return line


def _pareto_table(result: PlanResult) -> Table:
    metric = result.pareto_metric
    label = metric.removesuffix("_ms").replace("_", " ").upper()
    table = Table(
        title=f"Cost vs {label} (Pareto frontier of the rates tried)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for name in ("layout", "req/s/replica", "$/M out", f"{label} ms"):
        table.add_column(name, justify="left" if name == "layout" else "right", no_wrap=True)
    for row in result.pareto.to_dict("records"):
        table.add_row(
            row["layout"],
            _num(row["rate"], ".2f"),
            _num(row["usd_per_million_output_tokens"], ".3f"),
            _num(row[metric], ".1f"),
        )
    return table


def print_plan(result: PlanResult, console: Console) -> None:
    """The readable report: header, candidates, what was left out and why, the fleet, the
    frontier."""
    spec = result.spec
    console.print(
        f"[bold]Plan {spec.name}[/bold]: {spec.model} at {result.target_rate:.4g} req/s "
        f"(mean {result.mean_output_tokens:.0f} output tokens); SLOs: {_slo_line(result)}"
    )
    console.print(_margin_line(result), highlight=False)
    frame = result.candidates
    if (frame["status"] == "feasible").any():
        console.print(_candidates_table(frame))
    unsearched = frame["reason"].astype(str).str.startswith("not searched")
    for row in frame[(frame["status"] != "feasible") & ~unsearched].to_dict("records"):
        console.print(f"  {row['status']}: {row['layout']}: {row['reason']}", highlight=False)
    if unsearched.any():
        console.print(
            f"  pruned: {int(unsearched.sum())} more disaggregated units, not searched (beyond "
            f"disaggregated.max_units = {result.spec.disaggregated.max_units}; candidates.csv "
            "lists them)",
            highlight=False,
        )
    for line in _fleet_lines(result):
        console.print(line, highlight=False)
    if not result.pareto.empty:
        console.print(_pareto_table(result))
    console.print(f"{result.simulations} simulations in {result.wall_s:.1f} s", highlight=False)
