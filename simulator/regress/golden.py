"""The golden file of `llmsim regress`: cases, their golden metric values, tolerance bands.

```yaml
rtol: 0.01                # default band of every metric (the defaults: rtol 0.01, atol 0)
atol: 0
cases:
  - name: latency-8b-h100
    bench: latency        # `llmsim bench latency FLAGS --json`
    flags: {model: llama-3.1-8b, hardware: h100_sxm, batch-size: 8}
    metrics:
      avg_latency: 0.9599                     # golden value, the case's / file's band
      ttft_s: {value: 0.00846, rtol: 0.05}    # a band of its own
  - name: quickstart
    scenario: ../scenarios/quickstart.yaml    # `llmsim run FILE --json`, relative to this file
    rtol: 0.02                                # the band of this case's metrics
    metrics: [mean_ttft_ms, p99_tpot_ms]      # no values yet: `--update` fills them in
```

A case names exactly one of `scenario` (a scenario file), `bench` (latency | throughput |
serve) or `op` (gemm | attention | allreduce) with `flags`, the command's own flags (`batch-size`
or `batch_size`; `true` gives the bare flag, `false` its `--no-` form, a list repeats the flag).
A metric is a dotted path into the command's `--json` output (`memory.kv_capacity_tokens`,
`percentiles.50`). Its band, `|now - golden| <= atol + rtol * |golden|` (numpy.isclose's rule),
takes `rtol` and `atol` each from the metric, else the case, else the file's top level.
A string or boolean golden must match exactly. Rewriting (`dump_golden`) keeps the structure
and bands but not comments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Discriminator, Field, Tag, field_validator, model_validator
from typing_extensions import assert_never

from simulator.errors import SpecError
from simulator.specs._base import Frozen
from simulator.specs.loader import read_yaml, validate

Scalar = bool | int | float | str
FlagValue = Scalar | list[Scalar] | None
DEFAULT_RTOL = 0.01
DEFAULT_ATOL = 0.0
HEADER = (
    "# llmsim regress golden file: `llmsim regress FILE` checks, `--update` rewrites the values\n"
    "# (comments are not kept). Format: docs/regression.md.\n"
)


class _Flow(dict[str, Any]):
    """A mapping written on one line (a case's flags)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Flow, lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)
)


class Tolerance(Frozen):
    """A band's two widths; None: inherit from the enclosing level."""

    rtol: float | None = Field(default=None, ge=0, description="relative width, a fraction")
    atol: float | None = Field(default=None, ge=0, description="absolute width, metric units")


class MetricGolden(Tolerance):
    """One metric's golden value (None: not recorded yet) and optional band of its own."""

    value: Scalar | None = None


def _metrics(raw: Any) -> Any:
    """`[a, b]` -> `{a: {}, b: {}}`; `{a: 1.5}` -> `{a: {value: 1.5}}`; None -> `{}`."""
    if raw is None:
        return {}
    if isinstance(raw, list):
        if not all(isinstance(name, str) for name in raw):
            raise ValueError("a list of metrics must hold metric names")
        return {name: {} for name in raw}
    if isinstance(raw, dict):
        return {
            k: v if isinstance(v, dict | MetricGolden) else {"value": v} for k, v in raw.items()
        }
    return raw


class _Case(Tolerance):
    name: str = Field(min_length=1)
    metrics: dict[str, MetricGolden] = Field(default_factory=dict)

    @field_validator("metrics", mode="before")
    @classmethod
    def _shorthand(cls, raw: Any) -> Any:
        return _metrics(raw)

    @field_validator("metrics")
    @classmethod
    def _names(cls, metrics: dict[str, MetricGolden]) -> dict[str, MetricGolden]:
        if any(not name or name.startswith(".") or name.endswith(".") for name in metrics):
            raise ValueError("a metric is a dotted path into the --json output, e.g. ttft_s")
        return metrics


class ScenarioCase(_Case):
    """`llmsim run SCENARIO --json`; the path is relative to the golden file."""

    scenario: str = Field(min_length=1)


class BenchCase(_Case):
    """`llmsim bench KIND FLAGS --json`."""

    bench: Literal["latency", "throughput", "serve"]
    flags: dict[str, FlagValue] = Field(default_factory=dict)


class OpCase(_Case):
    """`llmsim op KIND FLAGS --json`."""

    op: Literal["gemm", "attention", "allreduce"]
    flags: dict[str, FlagValue] = Field(default_factory=dict)


KINDS = ("scenario", "bench", "op")


def _kind(raw: Any) -> str | None:
    if isinstance(raw, dict):
        named = [k for k in KINDS if k in raw]
        return named[0] if len(named) == 1 else None
    return next((k for k in KINDS if hasattr(raw, k)), None)


Case = Annotated[
    Annotated[ScenarioCase, Tag("scenario")]
    | Annotated[BenchCase, Tag("bench")]
    | Annotated[OpCase, Tag("op")],
    Discriminator(
        _kind,
        custom_error_type="case_kind",
        custom_error_message="a case names exactly one of: scenario, bench, op",
    ),
]


class Golden(Frozen):
    """The whole file: default band and the cases, in order."""

    rtol: float = Field(default=DEFAULT_RTOL, ge=0)
    atol: float = Field(default=DEFAULT_ATOL, ge=0)
    cases: list[Case] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> Golden:
        names = [c.name for c in self.cases]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"case names must be unique; repeated: {', '.join(repeated)}")
        return self


def load_golden(path: str | Path) -> Golden:
    """Read and validate a golden file; bad input raises SpecError naming file and field."""
    path = Path(path)
    if path.is_dir():
        raise SpecError("is a folder; give the golden YAML file", source=str(path))
    if not path.is_file():
        raise SpecError("no such golden file", source=str(path))
    return validate(Golden, read_yaml(path), source=str(path))


def _metric_data(metric: MetricGolden) -> Any:
    band = metric.model_dump(exclude_none=True, exclude={"value"})
    return {"value": metric.value, **band} if band else metric.value


def case_data(case: ScenarioCase | BenchCase | OpCase) -> dict[str, Any]:
    """A case as it is written: name, what it runs, its band, then its metrics."""
    data: dict[str, Any] = {"name": case.name}
    match case:
        case ScenarioCase():
            data["scenario"] = case.scenario
        case BenchCase():
            data["bench"] = case.bench
        case OpCase():
            data["op"] = case.op
        case _:
            assert_never(case)
    if not isinstance(case, ScenarioCase) and case.flags:
        data["flags"] = _Flow(case.flags)
    data |= case.model_dump(include={"rtol", "atol"}, exclude_none=True)
    data["metrics"] = {name: _metric_data(m) for name, m in case.metrics.items()}
    return data


def dump_golden(golden: Golden, path: str | Path) -> None:
    """Write `golden` to `path` as YAML (full float precision; comments are not kept)."""
    data = {
        "rtol": golden.rtol,
        "atol": golden.atol,
        "cases": [case_data(c) for c in golden.cases],
    }
    text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=4096)
    Path(path).write_text(HEADER + text, encoding="utf-8")
