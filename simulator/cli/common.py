"""What the command modules share: the console, JSON out, and the options of several commands."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Column, Table

out = Console()

PLAN_WIDTH = 140  # columns of the plan's tables when stdout is not a terminal

HardwareOpt = Annotated[str, typer.Option("--hardware", help="hardware id or path to a YAML spec")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the contract's JSON object")]
IntervalOpt = Annotated[
    float,
    typer.Option(
        "--interval-coverage",
        min=0.1,
        max=0.99,
        help="coverage of the error bands in the JSON and the printed figures "
        "(docs/error-bands.md)",
    ),
]
ReportOpt = Annotated[
    bool, typer.Option("--report", help="also write DIR/report.html (llmsim report DIR)")
]


def id_table(key: str, rows: Sequence[Sequence[str]], *columns: str, **options: Any) -> Table:
    """A table whose first column (`key`: ids) is never cut or wrapped, however narrow the
    terminal: the other columns wrap around it."""
    width = max([len(key), *(len(row[0]) for row in rows)])
    table = Table(Column(key, no_wrap=True, min_width=width), *columns, **options)
    for row in rows:
        table.add_row(*row)
    return table


def progress_line(command: str) -> Callable[[str], None]:
    """Progress as plain lines on stderr (`llmsim: plan: ...`), for logs and pipes where a
    spinner or a bar would not show."""

    def say(line: str) -> None:
        sys.stderr.write(f"llmsim: {command}: {line}\n")
        sys.stderr.flush()

    return say


# Notes on flags that change nothing or on estimates, written to stderr once the command has
# succeeded (`flush_notes`): a command that fails prints its one error line alone.
_notes: list[str] = []


def note(message: str) -> None:
    """Say `message` on stderr as `llmsim: note: ...` when the command succeeds."""
    _notes.append(f"llmsim: note: {message}\n")


def flush_notes(*, show: bool) -> None:
    """Write the pending notes (`show`) or drop them (the command failed)."""
    if show:
        sys.stderr.write("".join(_notes))
    _notes.clear()


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def write_json(path: str | None, data: Any) -> None:
    """`data` as indented JSON in the file `path` (nothing when None: no --output-json)."""
    if path:
        text = json.dumps(data, indent=2, default=str)
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:  # a full disk shows only at the flush: name the file
            raise OSError(exc.errno, exc.strerror or str(exc), path) from None


def wide_console() -> Console:
    """stdout, at PLAN_WIDTH columns when it is not a terminal (CI logs, pipes)."""
    return out if sys.stdout.isatty() else Console(width=PLAN_WIDTH)
