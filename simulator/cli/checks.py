"""`llmsim validate` and `llmsim regress`: the model against measurements and golden values."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from simulator.cli.common import JsonOpt, out, print_json, wide_console
from simulator.units import format_seconds
from simulator.validate.names import SUITE_NAMES


def validate_cmd(
    suite: Annotated[
        list[str] | None,
        typer.Option(
            "--suite",
            help=f"{', '.join(SUITE_NAMES[:-1])} or {SUITE_NAMES[-1]}; repeat the flag for "
            "several (default: all)",
        ),
    ] = None,
    rows: Annotated[
        str | None,
        typer.Option(
            "--rows",
            metavar="FILE.csv",
            help="also write every case of the chosen suites (device, case, predicted_s, "
            "measured_s, ape_pct, fitted, and the suite's own columns) as CSV",
        ),
    ] = None,
    worst: Annotated[
        int,
        typer.Option("--worst", min=0, help="cases listed per suite, largest error first"),
    ] = 5,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="compare each suite with its goal and CI ceiling "
            "(simulator/validate/targets.yaml); exit 1 when one is above its ceiling",
        ),
    ] = False,
    write_bands: Annotated[
        bool,
        typer.Option(
            "--write-bands",
            help="rewrite the error bands' residuals (simulator/data/error_bands.yaml) from "
            "the held-out rows of the end-to-end suites (e2e_throughput, e2e_serving, "
            "e2e_latency, e2e_serving_curve, e2e_energy; run with the chosen suites)",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Error tables of predicted vs measured against the bundled measurements, and the
    held-out coverage of the error bands (with the end-to-end suites)."""
    from simulator.validate import bands, store
    from simulator.validate.summary import (
        STAT_KEYS,
        kind_stats,
        run_validation,
        worst_cases,
        write_rows,
    )

    if write_bands and suite:
        suite = [*suite, *(name for name in bands.E2E_SUITES if name not in suite)]
    summary, df = run_validation(suite, jobs=store.cores())
    if rows:
        write_rows(df, rows)
    current = bands.residuals(df) if bands.has_e2e(df) else None
    if current is not None:
        summary["bands"] = bands.coverage_section(current)
    if write_bands and current is not None:
        path = bands.write_bands(current)
        sys.stderr.write(f"llmsim: wrote {path} ({len(current)} residuals)\n")
    if check:
        _check(summary, current, as_json=as_json)
        return
    if as_json:
        print_json(summary)
        return

    def cells(stats: Any) -> list[str]:
        return [str(stats["n"]), *(f"{float(stats[k]):.1f}%" for k in STAT_KEYS)]

    stat_cols = ("n", "MAPE", "median", "p90", "worst")
    table = Table("suite", "device", *stat_cols, "fitted", title="Absolute % error")
    for name, entry in summary["suites"].items():
        table.add_row(name, "all", *cells(entry), "yes" if entry["fitted"] else "no")
        for device, stats in entry["by_device"].items():
            table.add_row("", device, *cells(stats), "")
    out.print(table)
    kinds = kind_stats(df)
    kinds = kinds[kinds.groupby("suite")["kind"].transform("nunique") > 1]
    if not kinds.empty:
        by_kind = Table("suite", "device", "kind", *stat_cols, title="By kind of case")
        for row in kinds.to_dict(orient="records"):
            by_kind.add_row(str(row["suite"]), str(row["device"]), str(row["kind"]), *cells(row))
        out.print(by_kind)
    for name in summary["suites"] if worst else ():
        table = Table(
            "device", "case", "predicted", "measured", "error", title=f"{name}: worst {worst}"
        )
        for r in worst_cases(df, name, worst).itertuples():
            sign = "+" if r.predicted_s >= r.measured_s else "-"
            if name.startswith("power"):  # fractions of TDP, not times
                times = (f"{r.predicted_s:.2f} TDP", f"{r.measured_s:.2f} TDP")
            else:
                times = (format_seconds(r.predicted_s), format_seconds(r.measured_s))
            case = f"{r.case} (sweep outlier)" if _sweep_outlier(r) else str(r.case)
            table.add_row(str(r.device), case, *times, f"{sign}{r.ape_pct:.0f}%")
        out.print(table)
    if "sweep_outlier" in df:
        flagged = df[df["sweep_outlier"].eq(True)].groupby(["suite", "device"]).size()
        for (name, device), n in flagged.items():
            out.print(
                f"{name} {device}: {n} rows contradicted by their own sweep (more time than a "
                "case with more work, or growing faster than the work): sweep outliers, kept "
                "in every figure",
                markup=False,
            )
    for name, entry in summary["suites"].items():
        if "knees" in entry:
            _render_curves(name, entry)
    e2e = summary.get("end_to_end")
    if e2e:
        out.print(
            f"Held-out end-to-end rows together ({e2e['n']}): signed median "
            f"{e2e['signed_median_pct']:+.1f}% (negative: predicted faster or cheaper), "
            f"{e2e['optimistic_pct']:.0f}% on that side, {e2e['within_25_pct']:.0f}% within 25%",
            markup=False,
        )
    skipped = df.attrs.get("skipped", [])
    if skipped:
        out.print(f"Skipped {len(skipped)} configuration(s):")
        for line in skipped:
            out.print(f"  {line}", markup=False)
    if "bands" in summary:
        bands.render_bands(summary["bands"], wide_console())


def _render_curves(name: str, entry: dict[str, Any]) -> None:
    """A serving-curve suite's TTFT and ITL errors with their signed medians (+: predicted
    slower), and each curve's knee, measured and predicted (docs/validation.md)."""
    signed = Table("kind", "n", "MAPE", "median", "signed median", title=f"{name}: by metric")
    for kind, s in entry["by_kind"].items():
        signed.add_row(
            kind,
            str(s["n"]),
            f"{s['mape_pct']:.1f}%",
            f"{s['median_ape_pct']:.1f}%",
            f"{s['signed_median_pct']:+.1f}%",
        )
    out.print(signed)
    pct = 100 * entry["knee_fraction"]
    knees = Table(
        "curve", "engine", "device", "load", "measured knee", "predicted knee", "error",
        title=f"{name}: knee (the load at {pct:g}% of the sweep's most throughput)",
    )  # fmt: skip

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.3g}"

    for k in entry["knees"]:
        error = k["skipped"] if k["error_pct"] is None else f"{k['error_pct']:+.1f}%"
        knees.add_row(
            k["curve"], k["engine"], k["device"], k["load_kind"],
            num(k["measured_knee"]), num(k["predicted_knee"]), error,
        )  # fmt: skip
    out.print(knees)


def _sweep_outlier(row: Any) -> bool:
    """Whether a validation row is marked as contradicted by its own sweep (ops and layers
    rows; other suites have no such column, or NaN in it)."""
    import numpy as np

    value = getattr(row, "sweep_outlier", False)
    return isinstance(value, bool | np.bool_) and bool(value)


def _check(summary: dict[str, Any], current: Any, *, as_json: bool) -> None:
    """The suites against their targets and, with the end-to-end suites, the error bands
    against the committed file and their coverage range; exit 1 when either fails."""
    from simulator.metrics.bands import load_residuals
    from simulator.validate import bands
    from simulator.validate.targets import check_targets, load_targets, render_check

    result = check_targets(summary, load_targets())
    verdict = None
    if current is not None:
        verdict = bands.bands_check(current, load_residuals(), summary["bands"])
    if as_json:
        extra = {} if verdict is None else {"bands_check": verdict}
        print_json({**summary, "check": result.as_json(), **extra})
    else:
        render_check(result, wide_console())
        if verdict is not None:
            bands.render_bands_check(verdict, wide_console())
    if not result.ok or (verdict is not None and not verdict["ok"]):
        raise typer.Exit(1)


def regress_cmd(
    golden: Annotated[
        str | None,
        typer.Argument(
            metavar="GOLDEN.yaml",
            help="golden file (default: ./regress.yaml, else the project's regress/golden.yaml)",
        ),
    ] = None,
    update: Annotated[
        bool, typer.Option("--update", help="rewrite the golden values with today's predictions")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Recompute golden predictions; exit 1 when one leaves its tolerance band."""
    from simulator import regress
    from simulator.cli import inprocess

    path = golden or regress.default_golden()
    run = inprocess.run_command
    report = regress.update(path, run=run) if update else regress.check(path, run=run)
    if as_json:
        print_json(report.as_json())
    else:
        regress.render(report, wide_console())
    if not report.ok and not update:
        raise typer.Exit(1)
