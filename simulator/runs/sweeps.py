"""Sweeps: many runs of one base scenario with some values varied, resumable. The sweep file
and its runs are `simulator.specs.sweep`'s (re-exported here); this module runs them and keeps
their results.

Output: `DIR/results.csv` gets one row per run as it finishes: `run_id`, the varied values (one
column per path; lists and mappings as JSON), `status` (ok | error), `error`, then
`RunResult.as_json()` flattened (nested keys joined by dots). A rerun with the same command skips
ids already present (ok or error) and drops a last line cut short by a kill. A run whose scenario
fails validation or whose simulation raises is an error row; the others go on. `DIR/sweep.yaml`
holds the sweep as run, the base scenario inlined. A sweep holds `DIR/.llmsim.lock` while it
writes: a second sweep into the same folder is refused, naming the first one's pid and host (the
lock dies with its holder, however it dies). No file of the folder is written through a symbolic
link: sweep.yaml and a rewritten results.csv are written beside and renamed over a link, and a
link at results.csv is refused.

Executors: a local process pool (`spawn` workers, each caching loaded specs for all its runs;
`workers=1` runs in this process; a worker exits when the sweep's process dies, even by
`kill -9`) or Ray (`RAY_ADDRESS` if set, checked to answer within RAY_CONNECT_TIMEOUT_S, else a
local Ray; the workers must be able to import `simulator`). Not done: adaptive search (each
sweep is fixed up front), parquet output, retrying failed runs (delete their rows to rerun them).
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, Any, Literal

import pandas as pd
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from simulator.errors import SpecError, output_folder
from simulator.outputs import (
    folder_lock,
    held_fd,
    open_append,
    refuse_link,
    remove_leftovers,
    replacing,
)
from simulator.runs import runner
from simulator.specs.scenario import Scenario
from simulator.specs.sweep import (
    RandomRange,
    SweepRun,
    SweepSpec,
    assign,
    expand,
    load_sweep,
    num_points,
    varied_paths,
    write_sweep,
)

__all__ = [
    "RandomRange",
    "SweepReport",
    "SweepRun",
    "SweepSpec",
    "assign",
    "execute_sweep",
    "expand",
    "load_sweep",
    "sweep",
]

RESULTS_FILE = "results.csv"
SPEC_FILE = "sweep.yaml"
# Runs in flight per worker: enough to keep workers busy, few enough that Ctrl-C stops soon.
IN_FLIGHT_PER_WORKER = 2
MAX_ERROR_CHARS = 500
# How long a cluster at RAY_ADDRESS has to accept a connection, and then `ray.init` to connect,
# before the sweep gives up (each; LLMSIM_RAY_CONNECT_TIMEOUT_S overrides it).
RAY_CONNECT_TIMEOUT_S = 30.0
PARENT_POLL_S = 0.5  # a pool worker checks this often that the sweep's process lives


# -- running --------------------------------------------------------------------------------------
Outcome = tuple[str, str, str, dict[str, Any]]  # run_id, status, error, metrics
Job = tuple[str, dict[str, Any]]  # run_id, resolved scenario


def execute(run_id: str, scenario: dict[str, Any]) -> Outcome:
    """One run (in a worker): never raises; a failure is an error outcome."""
    try:
        result = runner.run(Scenario.model_validate(scenario))
        return run_id, "ok", "", _flatten(result.as_json(interval_coverage=None))
    except SpecError as exc:
        return run_id, "error", _one_line(exc.line()), {}
    except Exception as exc:  # any failure of one run is recorded; the sweep goes on
        return run_id, "error", _one_line(f"{type(exc).__name__}: {exc}"), {}


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 3] + "..."


def _serial(jobs: list[Job]) -> Iterator[Outcome]:
    for job in jobs:
        yield execute(*job)


def _pool(jobs: list[Job], workers: int) -> Iterator[Outcome]:
    """Runs on a process pool, yielded as they finish. `spawn` rather than `fork`: safe beside
    threads (the progress bar's), and the same on every platform."""
    queue = iter(jobs)
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    )
    in_flight: set[Future[Outcome]] = set()
    try:
        while True:
            for job in itertools.islice(queue, workers * IN_FLIGHT_PER_WORKER - len(in_flight)):
                in_flight.add(pool.submit(execute, *job))
            if not in_flight:
                return
            done, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()
    except BrokenProcessPool:
        raise SpecError(
            "a worker process died (out of memory? fewer --workers may help; from a script, "
            "call sweep under `if __name__ == '__main__':`); rerun to resume",
            field="workers",
        ) from None
    finally:
        pool.shutdown(cancel_futures=True)


def die_with_parent(parent: int) -> None:
    """In a pool worker: exit as soon as the process `parent` (the sweep's) dies, however it
    dies (`kill -9` included), rather than live on holding memory. On Linux the kernel sends
    the worker SIGKILL (prctl PR_SET_PDEATHSIG: it follows the thread that started the worker,
    the sweep's, which outlives its pool); everywhere a daemon thread also polls the parent's
    pid every PARENT_POLL_S (a worker whose parent died is re-parented)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass  # the thread below still watches
    if os.getppid() != parent:  # died before the watch was set
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="llmsim-parent-watch", daemon=True).start()


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise SpecError(
            "the ray executor needs Ray: pip install 'llmsim[ray]'", field="executor"
        ) from None
    return ray


def _ray(jobs: list[Job], workers: int | None) -> Iterator[Outcome]:
    """Runs as Ray tasks on the cluster at RAY_ADDRESS, else on a local Ray started here (with
    `workers` CPUs) and shut down after. A task Ray itself fails (a worker died) is an error row."""
    ray = import_ray()
    started = not ray.is_initialized()
    address = os.environ.get("RAY_ADDRESS", "")
    if started and address:
        _connect_ray(ray, address, connect_timeout_s())
    elif started:
        try:
            ray.init(num_cpus=workers, include_dashboard=False, logging_level=logging.WARNING)
        except Exception as exc:
            raise SpecError(
                f"cannot start a local Ray: {_one_line(f'{type(exc).__name__}: {exc}')}",
                field="executor",
            ) from None
    task = ray.remote(execute)
    limit = IN_FLIGHT_PER_WORKER * max(1, int(ray.cluster_resources().get("CPU", 1)))
    queue = iter(jobs)
    in_flight: dict[Any, str] = {}
    try:
        while True:
            for run_id, scenario in itertools.islice(queue, limit - len(in_flight)):
                in_flight[task.remote(run_id, scenario)] = run_id
            if not in_flight:
                return
            done, _ = ray.wait(list(in_flight), num_returns=1)
            run_id = in_flight.pop(done[0])
            try:
                outcome: Outcome = ray.get(done[0])
            except ray.exceptions.RayError as exc:
                outcome = run_id, "error", _one_line(f"{type(exc).__name__}: {exc}"), {}
            yield outcome
    finally:
        if started:
            ray.shutdown()


def connect_timeout_s() -> float:
    """RAY_CONNECT_TIMEOUT_S, or the seconds in LLMSIM_RAY_CONNECT_TIMEOUT_S."""
    text = os.environ.get("LLMSIM_RAY_CONNECT_TIMEOUT_S", "")
    try:
        value = float(text) if text else RAY_CONNECT_TIMEOUT_S
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise SpecError(
            f"must be a positive number of seconds (got {text!r})",
            field="LLMSIM_RAY_CONNECT_TIMEOUT_S",
        )
    return value


def _connect_ray(ray: ModuleType, address: str, timeout_s: float) -> None:
    """`ray.init(address)` within `timeout_s`: a SpecError if it fails (refused, an
    authentication error, a version mismatch) or has not returned by then (something that is
    not a Ray cluster answers there: Ray would retry for many minutes). It runs in a daemon
    thread, left behind on a timeout."""
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except BaseException as exc:  # reported by the caller
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=connect, name="llmsim-ray-connect", daemon=True)
    with held_fd(2) as held:  # Ray's retries log there (C++): kept for a success only
        thread.start()
        thread.join(timeout_s)
        held.replay = bool(outcome) and outcome[0] is None
    if not outcome:
        raise SpecError(
            f"the Ray cluster at {address} did not answer within {timeout_s:g} s (is a Ray "
            "head there? LLMSIM_RAY_CONNECT_TIMEOUT_S sets the wait)",
            field="RAY_ADDRESS",
        )
    if outcome[0] is not None:
        exc = outcome[0]
        raise SpecError(
            f"cannot connect to the Ray cluster at {address}: "
            f"{_one_line(f'{type(exc).__name__}: {exc}')}",
            field="RAY_ADDRESS",
        )


def reach_ray(address: str, timeout_s: float | None = None) -> None:
    """A SpecError unless the Ray cluster at `address` (host:port, or ray://host:port for Ray
    Client) accepts a TCP connection within `timeout_s` (default `connect_timeout_s()`):
    `ray.init` would retry an unreachable one for minutes. "auto" and "local" (found by Ray
    itself) are not checked."""
    timeout_s = connect_timeout_s() if timeout_s is None else timeout_s
    target = address.removeprefix("ray://").rstrip("/")
    host, _, port = target.rpartition(":")
    if address in ("auto", "local") or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise SpecError(
            f"cannot reach the Ray cluster at {address} within {timeout_s:g} s ({reason}); "
            "check the address, or unset RAY_ADDRESS to run a local Ray",
            field="RAY_ADDRESS",
        ) from None


# -- results --------------------------------------------------------------------------------------
class ResultsFile:
    """`results.csv`: what an earlier invocation left (a last line cut short by a kill is
    dropped), then one row per finished run, flushed at once. A row with new columns rewrites
    the file under the wider header (a temporary file, then renamed: a kill leaves one or the
    other)."""

    def __init__(self, path: Path, varied: list[str] | None = None) -> None:
        self.path = path
        self.columns: list[str] = []
        self.done: set[str] = set()
        self._fh: IO[str] | None = None
        refuse_link(path)
        remove_leftovers(path)  # a rewrite's temporary file, left by a kill
        if path.exists():
            self._recover(varied)

    def _recover(self, varied: list[str] | None) -> None:
        """Read what an earlier invocation left; refuse a file that is not a sweep's results, or
        holds another sweep's (other varied paths: its rows would not line up with these), before
        touching it."""
        raw = self.path.read_bytes()
        end = raw.rfind(b"\n") + 1
        try:
            text = raw[:end].decode("utf-8")
        except UnicodeDecodeError:
            text = ""
        reader = csv.DictReader(io.StringIO(text))
        columns = list(reader.fieldnames or [])
        if (raw and not columns) or (columns and not {"run_id", "status"} <= set(columns)):
            raise SpecError(
                "not a sweep's results (no run_id and status columns); choose another --out",
                source=str(self.path),
            )
        before = columns[1 : columns.index("status")] if columns else []
        if varied is not None and columns and set(before) != set(varied):
            raise SpecError(
                f"holds the results of a sweep over {', '.join(before) or 'nothing'}, not "
                f"{', '.join(varied) or 'nothing'}; choose another --out",
                source=str(self.path),
            )
        if end < len(raw):
            with self.path.open("r+b") as fh:
                fh.truncate(end)
        self.columns = columns
        self.done = {row["run_id"] for row in reader}

    def append(self, row: dict[str, Any]) -> None:
        """Add a row; an OSError (a full disk) names the file, and what an earlier invocation
        left stays whole (a row cut short is dropped on resume)."""
        cells = {key: _cell(value) for key, value in row.items()}
        new = [key for key in cells if key not in self.columns]
        try:
            if new or not self.columns:
                self._rewrite([*self.columns, *new], cells)
            else:
                if self._fh is None:
                    self._fh = open_append(self.path)
                _writer(self._fh, self.columns).writerow(cells)
                self._fh.flush()
        except OSError as exc:
            self._drop()
            raise OSError(exc.errno, exc.strerror or str(exc), str(self.path)) from None
        self.done.add(str(row["run_id"]))

    def _rewrite(self, columns: list[str], cells: dict[str, str]) -> None:
        self.close()
        rows: list[dict[str, str]] = []
        if self.path.exists():
            with self.path.open(newline="", encoding="utf-8") as fh:
                rows = list(csv.DictReader(fh))
        with replacing(self.path, newline="") as fh:
            writer = _writer(fh, columns)
            writer.writeheader()
            writer.writerows([*rows, cells])
        self.columns = columns

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _drop(self) -> None:
        """Close after a failed write without flushing again (the disk is full: what did not
        fit is a line cut short, dropped on resume)."""
        if self._fh is not None:
            with contextlib.suppress(OSError):
                os.close(self._fh.fileno())
            with contextlib.suppress(OSError, ValueError):
                self._fh.close()
            self._fh = None


def _writer(fh: Any, columns: list[str]) -> csv.DictWriter[str]:
    return csv.DictWriter(fh, columns, restval="", lineterminator="\n")


def _cell(value: Any) -> str:
    """One line of text: None is empty, lists and mappings are JSON."""
    if value is None:
        return ""
    if isinstance(value, list | dict | tuple):
        return json.dumps(value, sort_keys=True, default=str)
    return " ".join(str(value).splitlines())


# -- the sweep ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepReport:
    """What one invocation did: the full results table, runs done now (ok, error) and runs
    skipped as already in results.csv."""

    table: pd.DataFrame
    ok: int
    error: int
    skipped: int
    path: Path
    repeats: int = 0  # points that resolve to the scenario of another point: run once

    def line(self) -> str:
        same = f", {self.repeats} repeated points run once" if self.repeats else ""
        return (
            f"{self.ok} ok, {self.error} error, {self.skipped} skipped (done before)"
            f"{same}; {self.path}"
        )


def execute_sweep(
    path_or_spec: str | Path | SweepSpec,
    out: str | Path,
    *,
    executor: Literal["local", "ray"] = "local",
    workers: int | None = None,
    progress: bool = True,
) -> SweepReport:
    """Run a sweep's missing runs into `out`; see the module docstring. `workers`: processes
    (local; default the CPU count) or CPUs of a local Ray (default all)."""
    spec = path_or_spec if isinstance(path_or_spec, SweepSpec) else load_sweep(path_or_spec)
    if workers is not None and workers < 1:
        raise SpecError(f"must be at least 1 (got {workers})", field="workers")
    if executor == "ray":
        ray = import_ray()
        if os.environ.get("RAY_ADDRESS") and not ray.is_initialized():
            reach_ray(os.environ["RAY_ADDRESS"])  # before anything is written
    elif executor != "local":
        raise SpecError(f"unknown executor '{executor}' (local or ray)", field="executor")
    runs = expand(spec)
    folder = output_folder(out)
    with folder_lock(folder, "llmsim sweep"):
        return _execute(spec, runs, folder, executor=executor, workers=workers, progress=progress)


def _execute(
    spec: SweepSpec,
    runs: list[SweepRun],
    folder: Path,
    *,
    executor: str,
    workers: int | None,
    progress: bool,
) -> SweepReport:
    """The sweep's missing runs into `folder`, whose lock this process holds."""
    results = ResultsFile(folder / RESULTS_FILE, varied=varied_paths(spec))
    remove_leftovers(folder / SPEC_FILE)
    try:
        write_sweep(spec, folder / SPEC_FILE)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), str(folder / SPEC_FILE)) from None
    todo = [run for run in runs if run["run_id"] not in results.done]
    values = {run["run_id"]: run["values"] for run in todo}
    counts = {"ok": 0, "error": 0}
    try:
        with _progress(enabled=progress, total=len(runs), done=len(runs) - len(todo)) as advance:
            invalid: list[Outcome] = [
                (r["run_id"], "error", r["error"] or "", {}) for r in todo if r["error"]
            ]
            jobs = [(r["run_id"], r["scenario"]) for r in todo if not r["error"]]
            for run_id, status, error, metrics in itertools.chain(
                invalid, _outcomes(jobs, executor=executor, workers=workers)
            ):
                row = {"run_id": run_id, **values[run_id], "status": status, "error": error}
                results.append({**row, **{k: v for k, v in metrics.items() if k not in row}})
                counts[status] += 1
                advance()
    finally:
        results.close()
    table = pd.read_csv(results.path) if results.path.exists() else pd.DataFrame()
    skipped, repeats = len(runs) - len(todo), num_points(spec) - len(runs)
    return SweepReport(table, counts["ok"], counts["error"], skipped, results.path, repeats)


def sweep(
    path_or_spec: str | Path | SweepSpec,
    out: str | Path,
    *,
    executor: Literal["local", "ray"] = "local",
    workers: int | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Run a sweep (resuming what `out` holds) and return the full results table. The local pool
    starts fresh (`spawn`) processes: in a script, call this under `if __name__ == "__main__":`."""
    report = execute_sweep(path_or_spec, out, executor=executor, workers=workers, progress=progress)
    return report.table


def _outcomes(jobs: list[Job], *, executor: str, workers: int | None) -> Iterator[Outcome]:
    if executor == "ray":
        return _ray(jobs, workers)
    n = workers or os.cpu_count() or 1
    return _serial(jobs) if n == 1 or len(jobs) <= 1 else _pool(jobs, min(n, len(jobs)))


def _progress_lines(*, total: int, done: int) -> Callable[[], None]:
    """`advance` writing `llmsim: sweep: 12/48 runs done (3.1 runs/min, about 11 min left)`."""
    start, first = time.monotonic(), done
    every = max(1, (total - done) // 10)

    def advance() -> None:
        nonlocal done
        done += 1
        if (done - first) % every and done < total:
            return
        per_s = (done - first) / max(time.monotonic() - start, 1e-9)
        left = (total - done) / per_s / 60 if per_s > 0 else float("nan")
        sys.stderr.write(
            f"llmsim: sweep: {done}/{total} runs done ({per_s * 60:,.1f} runs/min, "
            f"about {left:.0f} min left)\n"
        )
        sys.stderr.flush()

    return advance


@contextmanager
def _progress(*, enabled: bool, total: int, done: int) -> Iterator[Callable[[], None]]:
    """A rich progress bar on stderr with rate and ETA, if enabled; where stderr is not a
    terminal (a log, CI, a notebook), a plain line every tenth of the runs and at the end."""
    console = Console(stderr=True)
    if not enabled:
        yield lambda: None
        return
    if not console.is_terminal:
        yield _progress_lines(total=total, done=done)
        return
    columns = (
        TextColumn("sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("sweep", total=total, completed=done, rate="")

        def advance() -> None:
            speed = bar.tasks[0].speed
            bar.update(task, advance=1, rate=f"{speed * 60:,.0f} runs/min" if speed else "")

        yield advance
