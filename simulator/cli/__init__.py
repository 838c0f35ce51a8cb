"""The `llmsim` command line. Every command has a Python API twin in `simulator.api`.

Bad input of any kind exits with status 2 and one line on stderr naming the file, field and
reason (SpecError, a usage error from the flag parser, or a path that cannot be written or
read, such as an output folder under a missing or read-only parent or on a full disk).

The commands live by subject: `specs` (hardware, models, engines), `ops` (op), `bench`
(bench latency|throughput|serve, with the flags they share in `bench_flags`), `scenarios`
(run, plan, sweep, report) and `checks` (validate, regress). This module assembles them, in
the order `llmsim --help` lists them, and turns errors into exit statuses.
"""

from __future__ import annotations

import errno
import sys
from typing import Any

import typer

from simulator.cli import checks, scenarios
from simulator.cli.bench import bench_app
from simulator.cli.bench_flags import flag_error
from simulator.cli.common import flush_notes
from simulator.cli.ops import op_app
from simulator.cli.specs import engines_app, hardware_app, models_app
from simulator.errors import SpecError

app = typer.Typer(
    help="llmsim: performance simulator for LLM serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.command("validate")(checks.validate_cmd)
app.command("regress")(checks.regress_cmd)
app.command("run")(scenarios.run_cmd)
app.command("plan")(scenarios.plan_cmd)
app.command("sweep")(scenarios.sweep_cmd)
app.command("report")(scenarios.report_cmd)
app.add_typer(hardware_app, name="hardware")
app.add_typer(models_app, name="models")
app.add_typer(engines_app, name="engines")
app.add_typer(op_app, name="op")
app.add_typer(bench_app, name="bench")

# Errors of a write that the disk or file system refused, whatever the file.
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EROFS)

# Flags that take several values after one flag in vLLM (argparse nargs="+").
MULTI_VALUE_FLAGS = ("--goodput",)


def _spread_multi_values(argv: list[str]) -> list[str]:
    """`--goodput a b` -> `--goodput a --goodput b`, as vLLM's argparse accepts it."""
    out: list[str] = []
    flag = None
    for arg in argv:
        if arg in MULTI_VALUE_FLAGS:
            flag = arg
            continue
        if flag and not arg.startswith("-"):
            out += [flag, arg]
            continue
        flag = None
        out.append(arg)
    return out


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; bad input exits 2 with one line on stderr."""
    args = _spread_multi_values(sys.argv[1:] if argv is None else list(argv))
    try:
        code = app(args=args, standalone_mode=False)
        flush_notes(show=True)
    except SpecError as exc:
        sys.stderr.write(f"llmsim: error: {flag_error(exc, _flags(args)).line()}\n")
        raise SystemExit(2) from None
    except OSError as exc:
        if exc.filename is not None:
            # an output folder that cannot be created, a file that cannot be written or read
            sys.stderr.write(f"llmsim: error: {exc.filename}: {exc.strerror or exc}\n")
        elif exc.errno in FULL_DISK:  # a write that did not say where (stdout to a full disk)
            sys.stderr.write(f"llmsim: error: cannot write the output: {exc.strerror or exc}\n")
        else:  # not about a path the user named nor the disk: a bug
            raise
        raise SystemExit(2) from None
    except MemoryError as exc:  # a request asking for more than the machine holds
        detail = f" ({' '.join(str(exc).split())})" if str(exc) else ""
        sys.stderr.write(
            f"llmsim: error: out of memory{detail}; ask for fewer requests or a smaller sweep\n"
        )
        raise SystemExit(2) from None
    except (typer.Abort, KeyboardInterrupt):
        sys.stderr.write("llmsim: aborted\n")
        raise SystemExit(130) from None
    except Exception as exc:
        message = usage_error(exc)
        if message is None:  # not bad input: a bug, which keeps its traceback
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":  # help was printed: a bare command group
            raise SystemExit(0) from None
        sys.stderr.write(f"llmsim: error: {message}\n")
        raise SystemExit(2) from None
    finally:
        flush_notes(show=False)  # a failed command's notes: its error line stands alone
    raise SystemExit(code if isinstance(code, int) else 0)


def _flags(args: list[str]) -> set[str]:
    """The flags of the command `args` names (empty when they name none)."""
    command: Any = typer.main.get_command(app)
    for word in args:
        sub = getattr(command, "commands", {}).get(word)
        if sub is None:
            break
        command = sub
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}


def usage_error(exc: Exception) -> str | None:
    """The one-line message of a flag-parser usage error (bad flag, missing option, bad value:
    exit code 2 and a message), or None for any other exception."""
    format_message = getattr(exc, "format_message", None)
    if getattr(exc, "exit_code", None) != 2 or format_message is None:
        return None
    return " ".join(str(format_message()).split())
