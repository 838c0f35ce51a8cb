"""`llmsim ARGV` run in this process, its JSON output returned: how `llmsim regress` (and the
pytest plugin) recompute a golden case exactly as a user's command line gives it."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

from simulator.errors import SpecError


def run_command(argv: list[str]) -> dict[str, Any]:
    """The JSON object `llmsim ARGV` prints, run in this process. Bad input (a SpecError, or
    a flag the command does not have) raises SpecError."""
    from simulator.cli import app, usage_error

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            app(args=argv, standalone_mode=False)
    except Exception as exc:
        message = usage_error(exc)
        if message is None:
            raise
        raise SpecError(message, field="flags") from None
    try:
        data = json.loads(buf.getvalue())
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise SpecError(f"`llmsim {' '.join(argv)}` printed no JSON object")
    return data
