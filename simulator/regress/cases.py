"""Run one golden case: the `llmsim` command line it names, in this process, with `--json`.

A bench or op case is exactly the command a user types (`llmsim bench latency --model ...
--json`), so a golden value means what that command prints, with the CLI's own defaults.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

from typing_extensions import assert_never

from simulator.errors import SpecError
from simulator.regress.golden import BenchCase, FlagValue, OpCase, ScenarioCase

# The metrics a case with none listed gets on `llmsim regress --update`.
SERVE_METRICS = (
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
)
DEFAULT_METRICS: dict[str, tuple[str, ...]] = {
    "scenario": SERVE_METRICS,
    "bench serve": SERVE_METRICS,
    "bench latency": ("avg_latency", "ttft_s", "tpot_s"),
    "bench throughput": ("requests_per_second", "output_tokens_per_second"),
    "op gemm": ("latency_s",),
    "op attention": ("latency_s",),
    "op allreduce": ("latency_s",),
}


def _flag_value(value: bool | int | float | str) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return str(value)


def flag_args(flags: dict[str, FlagValue]) -> list[str]:
    """`{batch_size: 8, enforce-eager: true, goodput: [a, b]}` -> `--batch-size 8
    --enforce-eager --goodput a --goodput b`; false gives `--no-NAME`, None leaves it out."""
    args: list[str] = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        for item in value if isinstance(value, list) else [value]:
            if item is None:
                continue
            if isinstance(item, bool):
                args.append(flag if item else "--no-" + flag.removeprefix("--"))
            else:
                args += [flag, _flag_value(item)]
    return args


def kind(case: ScenarioCase | BenchCase | OpCase) -> str:
    """`scenario`, `bench latency`, `op gemm`, ...: the key of DEFAULT_METRICS."""
    match case:
        case ScenarioCase():
            return "scenario"
        case BenchCase():
            return f"bench {case.bench}"
        case OpCase():
            return f"op {case.op}"
        case _:
            assert_never(case)


def command(case: ScenarioCase | BenchCase | OpCase, *, base_dir: Path) -> list[str]:
    """The `llmsim` arguments a case runs (a scenario path relative to `base_dir`)."""
    if isinstance(case, ScenarioCase):
        return ["run", str(base_dir / case.scenario), "--json"]
    return [*kind(case).split(), *flag_args(case.flags), "--json"]


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


def lookup(output: dict[str, Any], metric: str) -> tuple[bool, Any]:
    """(found, value) of a dotted path into a JSON object; list items by index."""
    node: Any = output
    for part in metric.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node
