"""A sweep: many runs of one base scenario with some values varied (`simulator.runs.sweeps` runs
them, resumably). Here: the sweep file, and its expansion into runs.

A sweep file (`llmsim sweep SWEEP.yaml --out DIR`):

    base: quickstart.yaml          # a scenario file (relative to this file) or an inline mapping
    grid:                          # cartesian product
      workload.request_rate: [1, 2, 4, 8]
      hardware: [h100_sxm, mi300x]
    zip:                           # lock-step lists, all the same length
      workload.num_prompts: [100, 400]
      slo.ttft_ms: [200, 800]
    random:                        # `samples` points, drawn once with `seed`
      replicas.0.scheduler.max_num_seqs: {low: 16, high: 512, log: true, integer: true}
      router.kind: [round_robin, least_outstanding]     # a list: uniform choice
    samples: 8
    seed: 0

The runs are every grid point x every zip row x every random sample. A path is dotted keys into
the scenario mapping, list indices as numbers (`replicas.0.tensor_parallel_size`); mappings missing
on the way are created. A top-level path that names a replica-group field (`hardware`, `engine`,
`count`, `tensor_parallel_size`, ..., `scheduler.max_num_seqs`) applies to every replica group. A
trace path, model config, hardware spec or engine profile file in the base (or set by the sweep)
is relative to the base scenario file, as in `load_scenario`.

A path that cannot be set (through a value that is not a mapping, past the end of a list) or
that names no field of the scenario is an error of the sweep file (SpecError): it would fail every
run alike. A value the scenario rejects makes that run an error row (`error` set).

A run's id is the first 12 hex digits of the sha256 of its resolved scenario (validated, defaults
left out, canonical JSON, the base name as its name); the run's scenario is named
`<base name>-<id>`. Runs that resolve to the same scenario run once.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import zlib
from pathlib import Path
from typing import Annotated, Any, TypedDict

import numpy as np
import yaml
from pydantic import Discriminator, Field, PrivateAttr, Tag, field_validator, model_validator

from simulator.errors import SpecError, naming
from simulator.outputs import replace_file
from simulator.specs._base import Frozen
from simulator.specs.loader import UNKNOWN_FIELD, read_yaml, validate
from simulator.specs.scenario import ReplicaGroupSpec, Scenario, paths_beside

RUN_ID_CHARS = 12
# Replica-group fields that, as the first key of a path, apply to every replica group.
REPLICA_FIELDS = frozenset(ReplicaGroupSpec.model_fields) - frozenset(Scenario.model_fields)
# A base scenario's errors that no varied value elsewhere can mend: every run would fail alike.
BASE_ERRORS = frozenset({UNKNOWN_FIELD, "Field required"})

Values = list[Any]
NonEmpty = Annotated[Values, Field(min_length=1)]


class RandomRange(Frozen):
    """A number drawn from [low, high]: uniform, or log-uniform with `log`; with `integer`, an
    integer in [ceil(low), floor(high)] (log: each k weighted by log((k + 1) / k))."""

    low: float = Field(allow_inf_nan=False)
    high: float = Field(allow_inf_nan=False)
    log: bool = False
    integer: bool = False

    @model_validator(mode="after")
    def _check(self) -> RandomRange:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        if self.log and self.low <= 0:
            raise ValueError("log needs low > 0")
        if self.integer and math.ceil(self.low) > math.floor(self.high):
            raise ValueError(f"no integer lies in [{self.low}, {self.high}]")
        return self

    def draw(self, rng: np.random.Generator, n: int) -> Values:
        lo, hi = self.low, self.high
        if self.integer:  # continuous over [ceil(low), floor(high) + 1), then floored
            lo, hi = math.ceil(lo), math.floor(hi) + 1
        if self.log:
            x = np.exp(rng.uniform(math.log(lo), math.log(hi), size=n))
        else:
            x = rng.uniform(lo, hi, size=n)
        if self.integer:
            return [min(int(v), int(hi) - 1) for v in x]
        return [float(v) for v in x]


def _sampled_kind(value: Any) -> str:
    return "range" if isinstance(value, dict | RandomRange) else "choices"


# A random path's values: a list of choices or a {low, high, ...} range.
Sampled = Annotated[
    Annotated[NonEmpty, Tag("choices")] | Annotated[RandomRange, Tag("range")],
    Discriminator(_sampled_kind),
]


class SweepSpec(Frozen):
    """A sweep file; see the module docstring. `load_sweep` reads one."""

    base: str | dict[str, Any] = Field(
        description="scenario file (relative to the sweep file) or mapping"
    )
    grid: dict[str, NonEmpty] = Field(default_factory=dict)
    zip: dict[str, NonEmpty] = Field(default_factory=dict)
    random: dict[str, Sampled] = Field(default_factory=dict)
    samples: int | None = Field(default=None, ge=1, description="random points to draw")
    seed: int = Field(default=0, ge=0, description="seed of the random points")
    # The folder a relative base (and an inline base's trace path) starts from.
    _root: Path = PrivateAttr(default=Path("."))
    # What errors of the file name: its path, or "sweep" for a spec built in Python.
    _source: str = PrivateAttr(default="sweep")

    @field_validator("grid", "zip", "random")
    @classmethod
    def _paths(cls, section: dict[str, Any]) -> dict[str, Any]:
        if not section:
            raise ValueError("empty: give each dotted path its values, or leave the section out")
        for path in section:
            if not all(path.split(".")):
                raise ValueError(f"'{path}' is not a dotted path (e.g. workload.request_rate)")
        return section

    @field_validator("zip")
    @classmethod
    def _same_lengths(cls, section: dict[str, Values]) -> dict[str, Values]:
        lengths = {path: len(values) for path, values in section.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"zip lists must all have the same length (got {lengths})")
        return section

    @model_validator(mode="after")
    def _consistent(self) -> SweepSpec:
        if not (self.grid or self.zip or self.random):
            raise ValueError("nothing to vary: give grid, zip or random")
        if self.random and self.samples is None:
            raise ValueError("random needs samples: N (how many points to draw)")
        if self.samples is not None and not self.random:
            raise ValueError("samples is set but there is no random section")
        paths = [*self.grid, *self.zip, *self.random]
        twice = sorted({p for p in paths if paths.count(p) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} varied in more than one section")
        return self


class SweepRun(TypedDict):
    """One run of a sweep: `scenario` is the validated scenario as JSON-ready data (named
    `<base name>-<run_id>`), or the mapping as built when `error` says why it is invalid."""

    run_id: str
    values: dict[str, Any]
    scenario: dict[str, Any]
    error: str | None


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a sweep file (malformed: SpecError naming the file and field)."""
    path = Path(path)
    spec = validate(SweepSpec, read_yaml(path), source=str(path))
    spec._root = path.resolve().parent
    spec._source = str(path)
    return spec


# -- expansion ------------------------------------------------------------------------------------
def expand(spec: SweepSpec) -> list[SweepRun]:
    """Every run of the sweep in order (grid, then zip, then random varying fastest), one per
    distinct resolved scenario. Bad input in the base file, and a varied path that cannot be set
    or is no field of the scenario, are SpecErrors naming the file; a run whose values the
    scenario schema rejects comes back with `error` set."""
    base, root = _base(spec)
    runs: dict[str, SweepRun] = {}
    for values in _points(spec):
        try:
            run = _resolve(base, values, root)
        except SpecError as exc:  # the path's, whatever the value: the sweep file's error
            raise SpecError(
                exc.reason, source=spec._source, field=_section(spec, exc.field)
            ) from None
        runs.setdefault(run["run_id"], run)
    return list(runs.values())


def _section(spec: SweepSpec, path: str) -> str:
    """`path` as the sweep file names it: under its section (`grid.workload.request_rate`)."""
    for name in ("grid", "zip", "random"):
        if path in getattr(spec, name):
            return f"{name}.{path}"
    return path


def varied_paths(spec: SweepSpec) -> list[str]:
    """The dotted paths the sweep varies, in its sections' order (results.csv's columns)."""
    return [*spec.grid, *spec.zip, *spec.random]


def num_points(spec: SweepSpec) -> int:
    """Points of the sweep, counting those that resolve to the same scenario (`expand` keeps
    one run of each)."""
    return len(_points(spec))


def _base(spec: SweepSpec) -> tuple[dict[str, Any], Path]:
    """The base scenario mapping and the folder the files it names are relative to."""
    if isinstance(spec.base, dict):
        return copy.deepcopy(spec.base), spec._root
    path = spec._root / spec.base
    with naming(spec._source, "base"):
        data = read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError("expected a scenario mapping", source=str(path))
    return data, path.parent


def _points(spec: SweepSpec) -> list[dict[str, Any]]:
    grid = [
        dict(zip(spec.grid, combo, strict=True)) for combo in itertools.product(*spec.grid.values())
    ]
    rows = [dict(zip(spec.zip, row, strict=True)) for row in zip(*spec.zip.values(), strict=True)]
    samples = _samples(spec)
    return [{**g, **r, **s} for g in grid or [{}] for r in rows or [{}] for s in samples or [{}]]


def _samples(spec: SweepSpec) -> list[dict[str, Any]]:
    """`samples` points; each path has its own generator (seeded by the sweep seed and the path),
    so adding or reordering paths leaves the others' values unchanged."""
    if not spec.random or spec.samples is None:
        return []
    n = spec.samples
    columns: dict[str, Values] = {}
    for path, dist in spec.random.items():
        rng = np.random.default_rng([spec.seed, zlib.crc32(path.encode())])
        if isinstance(dist, RandomRange):
            columns[path] = dist.draw(rng, n)
        else:
            columns[path] = [dist[i] for i in rng.integers(len(dist), size=n)]
    return [{path: values[i] for path, values in columns.items()} for i in range(n)]


def _resolve(base: dict[str, Any], values: dict[str, Any], root: Path) -> SweepRun:
    """One run; raises SpecError (field: the varied path) for a path that fails whatever its
    value: one `assign` cannot set, or one (or a mapping on the way to it) the schema does not
    know."""
    data = copy.deepcopy(base)
    for path, value in values.items():
        assign(data, path, copy.deepcopy(value))
    try:
        scenario = validate(Scenario, paths_beside(data, root), source="scenario")
    except SpecError as exc:
        if exc.reason == UNKNOWN_FIELD:
            for path in values:
                unknown = _unknown_on(path, exc.field)
                if unknown is not None:
                    where = "" if unknown == path else f"'{unknown}' on the way: "
                    raise SpecError(f"{where}{exc.reason}", field=path) from None
        if exc.reason in BASE_ERRORS and not any(_related(p, exc.field) for p in values):
            raise SpecError(exc.reason, field=f"base.{exc.field}") from None
        return SweepRun(run_id=_digest(data), values=values, scenario=data, error=exc.line())
    run_id = _digest(scenario.model_dump(mode="json", exclude_defaults=True))
    resolved = scenario.model_dump(mode="json")
    resolved["name"] = f"{scenario.name}-{run_id}"
    return SweepRun(run_id=run_id, values=values, scenario=resolved, error=None)


def _unknown_on(path: str, field: str) -> str | None:
    """The part of varied `path` that the unknown scenario `field` is (all of it, or a leading
    part), or None when `field` is not on it."""
    field = _group_field(field)
    return field if path == field or path.startswith(f"{field}.") else None


def _related(path: str, field: str) -> bool:
    """Whether scenario `field` lies on varied `path` or inside the value it sets."""
    field = _group_field(field)
    return _unknown_on(path, field) is not None or field.startswith(f"{path}.")


def _group_field(field: str) -> str:
    """A replica-group path is set in every group, so `replicas.1.scheduler.x` is `scheduler.x`."""
    keys = field.split(".")
    if len(keys) > 2 and keys[0] == "replicas" and keys[1].isdigit() and keys[2] in REPLICA_FIELDS:
        return ".".join(keys[2:])
    return field


def _digest(data: dict[str, Any]) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:RUN_ID_CHARS]


def assign(data: dict[str, Any], path: str, value: Any) -> None:
    """Set the dotted `path` in a scenario mapping (see the module docstring)."""
    head, *rest = path.split(".")
    if head not in REPLICA_FIELDS:
        _set(data, path.split("."), value, path=path)
        return
    groups = data.get("replicas")
    if not isinstance(groups, list) or not groups:
        raise SpecError("the base has no replica groups to apply it to", field=path)
    for i in range(len(groups)):
        _set(data, ["replicas", str(i), head, *rest], value, path=path)


def _set(node: Any, keys: list[str], value: Any, *, path: str) -> None:
    *parents, last = keys
    for depth, key in enumerate(parents):
        child = _get(node, key, path=path)
        if child is None:  # missing or null: a new mapping
            child = {}
            _put(node, key, child, path=path)
        elif not isinstance(child, dict | list):
            where = ".".join(keys[: depth + 1])
            raise SpecError(f"'{where}' holds {child!r}, not a mapping", field=path)
        node = child
    _put(node, last, value, path=path)


def _get(node: dict[str, Any] | list[Any], key: str, *, path: str) -> Any:
    return node[_index(node, key, path=path)] if isinstance(node, list) else node.get(key)


def _put(node: dict[str, Any] | list[Any], key: str, value: Any, *, path: str) -> None:
    if isinstance(node, list):
        node[_index(node, key, path=path)] = value
    else:
        node[key] = value


def _index(node: list[Any], key: str, *, path: str) -> int:
    if not key.isdigit() or int(key) >= len(node):
        raise SpecError(f"'{key}' is not an index into a list of {len(node)}", field=path)
    return int(key)


# -- the sweep as run -----------------------------------------------------------------------------
def write_sweep(spec: SweepSpec, path: Path) -> None:
    """The sweep as run, its base scenario inlined (`DIR/sweep.yaml`)."""
    base, root = _base(spec)
    rest = spec.model_dump(mode="json", exclude={"base"}, exclude_defaults=True)
    for section in ("grid", "zip", "random"):  # a file a value names, as the base finds it
        for varied, values in rest.get(section, {}).items():
            if isinstance(values, list):
                rest[section][varied] = [_beside_base(base, varied, v, root) for v in values]
    data = {"base": paths_beside(base, root), **rest}  # its files named from anywhere
    source = f"{spec.base} in {spec._root}" if isinstance(spec.base, str) else "inline"
    header = f"# The sweep as run by `llmsim sweep`; the base ({source}) inlined.\n"
    # written beside and renamed over: a link planted at `path` is replaced, never followed
    replace_file(path, header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None))


def _beside_base(base: dict[str, Any], path: str, value: Any, root: Path) -> Any:
    """`value` of the varied `path` as a run reads it: a file it names beside the base made
    absolute (`paths_beside`), so the sweep as written means the same from its own folder."""
    data = copy.deepcopy(base)
    try:
        assign(data, path, value)
    except SpecError:  # a run that cannot take it is an error row already
        return value
    head, *rest = path.split(".")
    keys = ["replicas", "0", head, *rest] if head in REPLICA_FIELDS else [head, *rest]
    node: Any = paths_beside(data, root)
    for key in keys:
        node = _get(node, key, path=path)
    return node
