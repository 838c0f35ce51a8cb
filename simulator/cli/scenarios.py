"""`llmsim run|plan|sweep|report`: scenario files in, summaries, folders and HTML out."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from simulator.cli.bench_flags import PdPartitionOpt
from simulator.cli.common import (
    PLAN_WIDTH,
    IntervalOpt,
    JsonOpt,
    ReportOpt,
    print_json,
    progress_line,
)
from simulator.errors import SpecError, naming


class Outputs(str, Enum):
    summary = "summary"
    requests = "requests"
    steps = "steps"
    all = "all"
    stream = "stream"


class PowerPolicy(str, Enum):
    none = "none"
    static = "static"
    dynamic = "dynamic"


class OutputFormat(str, Enum):
    csv = "csv"
    parquet = "parquet"


def run_cmd(
    scenario: Annotated[str | None, typer.Argument(metavar="SCENARIO.yaml")] = None,
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            help="write summary.json and the tables --outputs names to DIR (and fleet.csv when "
            "autoscaled)",
        ),
    ] = None,
    outputs: Annotated[
        Outputs | None,
        typer.Option(
            "--outputs",
            help="tables --out writes: summary (none), requests, steps (requests, steps) or "
            "all (also the ITL sample); stream: run without rows (running aggregates and "
            "quantile sketches; summary only); default the scenario's outputs, else all",
        ),
    ] = None,
    output_format: Annotated[
        OutputFormat | None,
        typer.Option(
            "--output-format",
            help="the tables' format (parquet needs pyarrow); default the scenario's, else csv",
        ),
    ] = None,
    as_json: JsonOpt = False,
    schema: Annotated[
        bool, typer.Option("--schema", help="print the scenario JSON schema")
    ] = False,
    report: ReportOpt = False,
    interval_coverage: IntervalOpt = 0.8,
    pd_partition: PdPartitionOpt = None,
    power_budget: Annotated[
        float | None,
        typer.Option(
            "--power-budget",
            metavar="W",
            help="the fleet's GPU power budget in watts (replaces the scenario's "
            "power_budget.budget_w; adds a dynamic budget to a scenario without one)",
        ),
    ] = None,
    power_policy: Annotated[
        PowerPolicy | None,
        typer.Option(
            "--power-policy",
            help="none (sample the draw only), static (every GPU capped at budget / GPUs) or "
            "dynamic (POLCA-like caps when the windowed draw nears the budget)",
        ),
    ] = None,
) -> None:
    """A full what-if from a scenario file: replica groups, router, workload, SLOs."""
    from simulator.metrics.summary import format_serve_summary
    from simulator.outputs import check_replaceable
    from simulator.runs import runner
    from simulator.serving.disagg import pool_lines
    from simulator.specs.scenario import Scenario

    if schema:
        print_json(Scenario.model_json_schema())
        return
    if scenario is None:
        raise SpecError("missing SCENARIO.yaml", field="scenario")
    if report and not out:
        raise SpecError("--report needs --out DIR (it writes DIR/report.html)", field="report")
    level = outputs.value if outputs else None
    fmt = output_format.value if output_format else None
    if out:
        check_replaceable(out, runner.RUN_FILES)  # before a long run whose results go there
        given = _scenario_outputs(scenario)  # what the file asks for, checked before the run
        level, fmt = level or given[0], fmt or given[1]
        if fmt == "parquet" and output_format:
            runner.require_parquet("--output-format")
        elif fmt == "parquet":
            with naming(scenario):
                runner.require_parquet("output_format")
        if report and level in ("summary", "requests", "stream"):
            raise SpecError(
                f"--report needs the steps table, which --outputs {level} leaves out "
                "(use --outputs steps or all)",
                field="outputs",
            )
    if pd_partition is not None:  # the flag's own error, before the file is read
        from simulator.specs.serving import parse_pd_partition

        try:
            parse_pd_partition(pd_partition)
        except SpecError as exc:
            raise SpecError(exc.reason, field="--pd-partition") from None
    if power_budget is not None and not power_budget > 0:
        raise SpecError(f"must be above 0 W, got {power_budget:g}", field="--power-budget")
    result = runner.run(
        scenario,
        outputs="stream" if level == "stream" else None,
        pd_partition=pd_partition,
        power_budget_w=power_budget,
        power_policy=power_policy.value if power_policy else None,
    )
    if out:
        runner.save_run(
            result,
            out,
            interval_coverage=interval_coverage,
            outputs=level,  # type: ignore[arg-type]  # a RunOutputs when not None
            output_format=fmt,  # type: ignore[arg-type]
        )
    if out and report:
        sys.stderr.write(_report_line(out) + "\n")  # stdout may be --json
    if as_json:
        print_json(result.as_json(interval_coverage=interval_coverage))
        return
    bands = result.intervals(coverage=interval_coverage)
    sys.stdout.write(format_serve_summary(result.summary | bands) + "\n")
    out_console = Console()
    for g, (spec, plan) in enumerate(zip(result.scenario.replicas, result.memory, strict=True)):
        role = f"{spec.role} pool: " if spec.role != "both" else ""
        scale = result.scenario.autoscaled(g)
        count = f"{scale.min_replicas}-{scale.max_replicas}" if scale else str(spec.count)
        dp = spec.data_parallel_size
        ranks, unit = (f" dp={dp}", "attention rank") if dp > 1 else ("", "replica")
        cp = spec.context_parallel_size
        ranks = (f" cp={cp}" if cp > 1 else "") + ranks
        out_console.print(
            f"{role}{count} x {spec.hardware} tp={spec.tensor_parallel_size} "
            f"pp={spec.pipeline_parallel_size}{ranks} ({spec.engine}): KV "
            f"{plan.kv_capacity_tokens:,} tokens per {unit}"
        )
    out_console.print(
        f"KV cache peak {result.sim.kv_peak_fraction:.1%}; simulated "
        f"{result.simulated_steps:,} steps in {result.sim.wall_s:.2f} s"
    )
    if result.scenario.disaggregated:
        for line in pool_lines(result.scenario, result.deployments, result.summary):
            out_console.print(line, highlight=False, soft_wrap=True)
    e = result.energy
    parked = e["parked_energy_j"] / e["energy_j"] if e["energy_j"] > 0 else 0.0
    out_console.print(
        f"Energy {e['energy_per_output_token_j']:.3f} J/output token; "
        f"{e['avg_power_w_per_gpu']:.0f} W per GPU on average over {e['num_gpus']} GPU(s)"
        + (f", {parked:.0%} of the energy parked between steps" if parked >= 0.01 else "")
    )
    out_console.print(
        f"Cost ${e['cost_usd']:.2f} for {e['gpu_hours']:.3f} GPU-hours: "
        f"${e['usd_per_million_output_tokens']:.2f}/M output tokens, "
        f"${e['usd_per_million_tokens']:.2f}/M tokens"
    )


def _scenario_outputs(path: str) -> tuple[str | None, str | None]:
    """The `outputs` and `output_format` a scenario file gives, read before it is validated
    (None where absent or not a string; validation reports what is wrong with them)."""
    from simulator.specs.loader import read_yaml

    data = read_yaml(Path(path))
    if not isinstance(data, dict):
        return None, None
    level, fmt = data.get("outputs"), data.get("output_format")
    return (
        level if isinstance(level, str) else None,
        fmt if isinstance(fmt, str) else None,
    )


def plan_cmd(
    plan_file: Annotated[str | None, typer.Argument(metavar="PLAN.yaml")] = None,
    out: Annotated[
        str | None,
        typer.Option("--out", help="write plan.json, candidates.csv, pareto.csv, probes.csv"),
    ] = None,
    as_json: JsonOpt = False,
    confidence: Annotated[
        float | None,
        typer.Option(
            "--confidence",
            help="SLOs must hold with the hardware as slow as the upper end of its error band "
            "at this confidence, and in this share of the seeds (plan file's, else 0.9)",
        ),
    ] = None,
    seeds: Annotated[
        int | None,
        typer.Option("--seeds", help="workload seeds the fleet is simulated with (default 5)"),
    ] = None,
    single_layout: Annotated[
        bool, typer.Option("--single-layout", help="fleets of one replica shape only")
    ] = False,
    schema: Annotated[bool, typer.Option("--schema", help="print the plan JSON schema")] = False,
) -> None:
    """The cheapest deployments that meet the SLOs: per layout, and the cheapest mixed fleet."""
    from simulator.outputs import check_replaceable
    from simulator.planning.plan import plan
    from simulator.planning.report import PLAN_FILES, print_plan, save_plan
    from simulator.planning.spec import PlanSpec

    if schema:
        print_json(PlanSpec.model_json_schema())
        return
    if plan_file is None:
        raise SpecError("missing PLAN.yaml", field="plan")
    if out:
        check_replaceable(out, PLAN_FILES)
    err = Console(stderr=True)
    status = err.status("planning") if err.is_terminal else None
    if status:
        status.start()
    try:  # a terminal shows the latest line under a spinner; a log gets every line
        result = plan(
            plan_file,
            confidence=confidence,
            seeds=seeds,
            single_layout=single_layout or None,
            progress=status.update if status else progress_line("plan"),
        )
    finally:
        if status:
            status.stop()
    if out:
        save_plan(result, out)
    if as_json:
        print_json(result.as_json())
        return
    print_plan(result, Console() if sys.stdout.isatty() else Console(width=PLAN_WIDTH))


class Executor(str, Enum):
    local = "local"
    ray = "ray"


def sweep_cmd(
    sweep_file: Annotated[str, typer.Argument(metavar="SWEEP.yaml")],
    out: Annotated[str, typer.Option("--out", help="folder for results.csv and sweep.yaml")],
    executor: Annotated[
        Executor, typer.Option("--executor", help="local process pool, or Ray (llmsim[ray])")
    ] = Executor.local,
    workers: Annotated[
        int | None, typer.Option("--workers", help="processes (default: CPU count)")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bar")] = False,
    report: ReportOpt = False,
) -> None:
    """Run a base scenario over a grid / zip / random sample of values; rerun to resume."""
    from simulator.runs.sweeps import execute_sweep

    done = execute_sweep(
        sweep_file, out, executor=executor.value, workers=workers, progress=not quiet
    )
    sys.stdout.write(f"sweep: {done.line()}\n")
    if report:
        sys.stdout.write(_report_line(out) + "\n")


def report_cmd(
    folder: Annotated[str, typer.Argument(metavar="DIR")],
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="the HTML file (default DIR/report.html)")
    ] = None,
) -> None:
    """One self-contained HTML report (plotly, works offline) of a run, sweep or plan folder."""
    sys.stdout.write(_report_line(folder, output) + "\n")


def _report_line(folder: str, output: str | None = None) -> str:
    from simulator.report import write_report

    path = write_report(folder, output)
    return f"report: {path} ({path.stat().st_size / 1e6:.1f} MB)"
