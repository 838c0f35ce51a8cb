"""Read back what a folder holds for `llmsim report DIR`: a run (`llmsim run --out`), a sweep
(`llmsim sweep --out`) or a plan (`llmsim plan --out`). Anything else is a SpecError naming the
folder and what was expected; a missing or unreadable file is one naming that file.

A run or plan folder must be whole: its `manifest.json` (written last, see `simulator.outputs`)
lists each file with its size and SHA-256, and a folder without one (cut short, or written by an
llmsim before manifests), with a file that differs from it, or with a result file it does not
list (left by another run) is refused. A sweep's results.csv must hold each run once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.errors import SpecError
from simulator.metrics.recorder import STEP_COLUMNS
from simulator.outputs import check_manifest
from simulator.planning.report import PLAN_FILES as PLAN_OUTPUTS
from simulator.report.figures import require
from simulator.runs.runner import RUN_FILES as RUN_OUTPUTS
from simulator.serving.fleet import FLEET_COLUMNS
from simulator.serving.power import POWER_COLUMNS
from simulator.specs.loader import read_yaml, validate
from simulator.specs.scenario import Scenario

RUN_FILES = (
    "summary.json", "requests.csv", "steps.csv", "requests.parquet", "steps.parquet",
)  # fmt: skip
SWEEP_FILE = "results.csv"
PLAN_FILES = ("plan.json", "probes.csv")
REQUEST_COLUMNS = (  # of requests.csv, the ones the report uses
    "replica", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "prompt_tokens",
    "output_tokens",
)  # fmt: skip


@dataclass(frozen=True)
class RunFolder:
    """A run's tables (see `runner.save_run`)."""

    folder: Path
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    itl: pd.DataFrame | None
    scenario: Scenario | None
    memory: list[dict[str, Any]] | None
    fleet: pd.DataFrame | None = None  # an autoscaled run's replica counts over time
    power: pd.DataFrame | None = None  # a power-budgeted run's sampled fleet draw


@dataclass(frozen=True)
class SweepFolder:
    """A sweep's results, the dotted paths it varies and its base scenario's SLOs."""

    folder: Path
    results: pd.DataFrame
    varied: list[str]
    slo: dict[str, Any] | None


@dataclass(frozen=True)
class PlanFolder:
    """A plan's summary (`plan.json`), every simulation of its search, its frontier and its
    ranked candidates."""

    folder: Path
    plan: dict[str, Any]
    probes: pd.DataFrame
    pareto: pd.DataFrame
    candidates: pd.DataFrame | None


Loaded = RunFolder | SweepFolder | PlanFolder


def load(folder: str | Path) -> Loaded:
    """What `folder` holds; see the module docstring."""
    path = Path(folder)
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "no such folder"
        raise SpecError(what, source=str(path))
    if any((path / name).exists() for name in RUN_FILES):
        check_manifest(path, "run", RUN_OUTPUTS)
        return _run(path)
    if (path / SWEEP_FILE).exists():
        return _sweep(path)
    if any((path / name).exists() for name in PLAN_FILES):
        check_manifest(path, "plan", PLAN_OUTPUTS)
        return _plan(path)
    raise SpecError(
        "not a run, sweep or plan folder: expected summary.json, requests and steps (.csv or "
        ".parquet; llmsim run --out), results.csv (llmsim sweep --out), or plan.json and "
        "probes.csv (llmsim plan --out)",
        source=str(path),
    )


def _file(folder: Path, name: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise SpecError(f"missing {name} (the folder is incomplete)", source=str(folder))
    return path


def _table(folder: Path, name: str, columns: tuple[str, ...]) -> pd.DataFrame | None:
    """The run's table `name` (.csv, else .parquet); None when neither is there."""
    for suffix in (".csv", ".parquet"):
        path = folder / (name + suffix)
        if path.is_file():
            return _csv(path, columns)
    return None


def _needed_table(folder: Path, name: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """`_table`, or a SpecError naming what the run was saved without."""
    frame = _table(folder, name, columns)
    if frame is not None:
        return frame
    raise SpecError(
        f"no {name}.csv or {name}.parquet: the run was saved without its {name} table "
        "(llmsim run --outputs summary or requests); rerun with --outputs steps or all",
        source=str(folder),
    )


def _csv(path: Path, columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """A CSV file's frame, or a Parquet file's where `path` ends in .parquet (needs pyarrow)."""
    if path.suffix == ".parquet":
        frame = _parquet(path)
    else:
        try:
            frame = pd.read_csv(path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
            reason = "empty" if isinstance(exc, pd.errors.EmptyDataError) else "not a readable CSV"
            raise SpecError(reason, source=str(path)) from None
    try:
        require(frame, columns, what=path.name)
    except SpecError as exc:
        raise SpecError(exc.reason, source=str(path), field=exc.field) from None
    return frame


def _parquet(path: Path) -> pd.DataFrame:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise SpecError(
            "reading Parquet needs pyarrow, which is not installed: pip install 'llmsim[parquet]'",
            source=str(path),
        ) from None
    try:
        return pd.read_parquet(path, engine="pyarrow")
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise SpecError(f"not a readable Parquet file ({exc})", source=str(path)) from None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"not valid JSON ({exc})", source=str(path)) from None


def _optional(folder: Path, name: str) -> Path | None:
    path = folder / name
    return path if path.is_file() else None


def _object(path: Path, keys: tuple[str, ...], what: str) -> dict[str, Any]:
    """The JSON object in `path`, which must hold `keys` (what `what` writes)."""
    data = _json(path)
    if not isinstance(data, dict):
        raise SpecError("expected a JSON object", source=str(path))
    missing = [k for k in keys if k not in data]
    if missing:
        raise SpecError(f"not {what} (no {', '.join(missing)})", source=str(path))
    return data


def _run(folder: Path) -> RunFolder:
    summary = _object(_file(folder, "summary.json"), ("completed",), "a run's summary")
    requests = _needed_table(folder, "requests", REQUEST_COLUMNS)
    steps = _needed_table(folder, "steps", STEP_COLUMNS)
    itl = _table(folder, "itl", ("itl_s", "weight"))
    fleet = _table(folder, "fleet", FLEET_COLUMNS)
    power = _table(folder, "power", POWER_COLUMNS)
    scenario_path = _optional(folder, "scenario.json")
    memory_path = _optional(folder, "memory.json")
    scenario = (
        validate(Scenario, _json(scenario_path), source=str(scenario_path))
        if scenario_path
        else None
    )
    memory = _json(memory_path) if memory_path else None
    if memory is not None and not (
        isinstance(memory, list) and all(isinstance(m, dict) for m in memory)
    ):
        raise SpecError("expected a list of memory plans", source=str(memory_path))
    return RunFolder(
        folder=folder,
        summary=summary,
        requests=requests,
        steps=steps,
        itl=itl,
        scenario=scenario,
        memory=memory,
        fleet=fleet,
        power=power,
    )


def _sweep(folder: Path) -> SweepFolder:
    results = _csv(folder / SWEEP_FILE, ("run_id",))
    repeated = results["run_id"][results["run_id"].duplicated()]
    if len(repeated):
        raise SpecError(
            f"holds run {repeated.iloc[0]} {int((results['run_id'] == repeated.iloc[0]).sum())} "
            "times: two sweeps wrote this folder at once; rerun the sweep into a new folder",
            source=str(folder / SWEEP_FILE),
        )
    columns = list(results.columns)
    # The varied paths: the sweep file's, else the columns between run_id and status.
    end = columns.index("status") if "status" in columns else 1
    varied = columns[1:end]
    slo = None
    spec_path = _optional(folder, "sweep.yaml")
    if spec_path:
        spec = read_yaml(spec_path)
        sections = [spec.get(k) or {} for k in ("grid", "zip", "random")]
        varied = [p for s in sections if isinstance(s, dict) for p in s if p in columns]
        base = spec.get("base")
        slo = base.get("slo") if isinstance(base, dict) else None
    return SweepFolder(
        folder=folder,
        results=results,
        varied=varied,
        slo=slo if isinstance(slo, dict) else None,
    )


def _plan(folder: Path) -> PlanFolder:
    plan = _object(_file(folder, "plan.json"), ("model", "fleet"), "a plan's summary")
    probes_path = _file(folder, "probes.csv")
    # A plan whose layouts were all pruned ran no simulation: its probes.csv is empty.
    probes = _csv(probes_path, ("layout", "feasible")) if probes_path.stat().st_size > 1 else None
    pareto_path = _optional(folder, "pareto.csv")
    pareto = _csv(pareto_path) if pareto_path and pareto_path.stat().st_size > 1 else None
    candidates_path = _optional(folder, "candidates.csv")
    return PlanFolder(
        folder=folder,
        plan=plan,
        probes=probes if probes is not None else pd.DataFrame(),
        pareto=pareto if pareto is not None else pd.DataFrame(),
        candidates=_csv(candidates_path) if candidates_path else None,
    )
