"""Run one golden case: the `llmsim` command line it names, in this process, with `--json`.

A bench or op case is exactly the command a user types (`llmsim bench latency --model ...
--json`), so a golden value means what that command prints, with the CLI's own defaults.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typing_extensions import assert_never

from simulator.regress.golden import BenchCase, FlagValue, OpCase, ScenarioCase

# Runs `llmsim ARGV` and returns the JSON object it prints; the CLI passes its own
# (`simulator.cli.inprocess.run_command`), so that this package needs nothing above it.
Runner = Callable[[list[str]], dict[str, Any]]

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
