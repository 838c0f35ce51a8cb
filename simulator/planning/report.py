"""A plan's outputs: the readable tables of `llmsim plan`, and the files of `--out DIR`
(plan.json, candidates.csv, pareto.csv, probes.csv)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table

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


def _num(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "-"
    return format(value, spec)


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
    for name in ("req/s/replica", "replicas", "GPUs", "$/hour", "$/M out", "$/M @max", "J/tok"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("binding SLO", no_wrap=True)
    for row in frame[frame["status"] == "feasible"].to_dict("records"):
        binding = f"{row['binding_slo']} at {_num(row['slo_ratio'], '.0%')}"
        note = f" ({row['reason']})" if row["reason"] else ""
        table.add_row(
            str(row["rank"]),
            row["layout"] + note,
            row["precision"],
            _num(row["max_rate"], ".2f"),
            str(row["replicas"]),
            str(row["gpus"]),
            _num(row["usd_per_hour"], ".2f"),
            _num(row["usd_per_million_output_tokens"], ".3f"),
            _num(row["max_rate_usd_per_million_output_tokens"], ".3f"),
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
        metrics = ", ".join(
            f"{key.split('_')[0]} {key.split('_')[1].upper()} {check[key]:.1f} ms"
            for key in check
            if key.startswith("p") and key.endswith("_ms")
        )
        verdict = "meets the SLOs" if check["meets_slos"] else f"MISSES: {check['reason']}"
        lines.append(
            f"  simulated at {check['rate']:.4g} req/s ({check['num_prompts']} requests, "
            f"{result.spec.router.kind} router): {metrics}: {verdict}"
        )
    return lines


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
    console.print(f"{len(result.probes)} simulations in {result.wall_s:.1f} s", highlight=False)
