"""Malformed files through every loader: random bytes, nesting thousands deep, values of the
wrong type, huge and non-finite numbers, and valid files with one value or key replaced. Each
either loads or is a SpecError (the CLI's one line and exit 2); never another exception."""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.errors import SpecError
from simulator.planning.spec import load_plan
from simulator.specs.loader import (
    ENGINES_DIR,
    MODELS_DIR,
    forget_loaded_specs,
    load_engine,
    load_hardware,
    load_model,
    read_yaml,
)
from simulator.specs.scenario import load_scenario
from simulator.specs.sweep import expand, load_sweep
from simulator.specs.workload import TraceDataset
from simulator.workload.traces import read_trace

ROOT = Path(__file__).resolve().parents[1]
FUZZ = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

huge_numbers = st.sampled_from(
    [2**64, -(2**64), 10**400, 1e308, -1e308, float("inf"), float("nan"), 0, -1, 1e-320]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    huge_numbers,
    st.text(max_size=12),
    st.sampled_from(["h100_sxm", "vllm", "llama-3.1-8b", "80 GiB", "3.35 TB/s", "trace"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside `data` (mapping keys, list indices)."""
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out += _paths(value, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    """`base` with one value replaced, one key renamed, or one value nested deep."""
    data = copy.deepcopy(base)
    path = draw(st.sampled_from(_paths(data)))
    *parents, last = path
    node = data
    for key in parents:
        node = node[key]
    how = draw(st.sampled_from(["value", "key", "deep"]))
    if how == "key" and isinstance(node, dict):
        node[draw(st.text(min_size=1, max_size=20))] = node.pop(last)
    elif how == "deep":
        depth = draw(st.integers(100, 3000))
        nested: Any = 1
        for _ in range(depth):
            nested = [nested]
        node[last] = nested
    else:
        node[last] = draw(values)
    return data


def _dump(data: Any, fmt: str) -> bytes:
    try:
        if fmt == "json":
            return json.dumps(data).encode()
        return yaml.safe_dump(data, sort_keys=False).encode()
    except (RecursionError, ValueError):  # too deep to write: write it by hand
        return b"a: " + b"[" * 5000 + b"]" * 5000


def contents(base: dict[str, Any], fmt: str) -> st.SearchStrategy[bytes]:
    """File contents: a mutation of `base`, random bytes, deep nesting, or any value."""
    deep = st.integers(1000, 50_000).map(
        lambda n: (b'{"a": ' if fmt == "json" else b"a: ") + b"[" * n + b"]" * n
    )
    return st.one_of(
        mutated(base).map(lambda d: _dump(d, fmt)),
        mutated(base).map(lambda d: _dump(d, fmt)),
        st.binary(max_size=200),
        deep,
        values.map(lambda d: _dump(d, fmt)),
    )


def loads_or_spec_error(
    load: Callable[[Path], object], content: bytes, name: str, files: dict[str, str] | None = None
) -> None:
    forget_loaded_specs()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(content)
        for other, text in (files or {}).items():
            (Path(folder) / other).write_text(text, encoding="utf-8")
        try:
            load(path)
        except SpecError as exc:
            assert "\n" not in exc.line(), exc.line()


def _yaml(path: Path) -> dict[str, Any]:
    data = read_yaml(path)
    assert isinstance(data, dict)
    return data


HARDWARE = _yaml(ROOT / "hardware_specs" / "h100_sxm.yaml")
ENGINE = _yaml(ENGINES_DIR / "vllm.yaml")
MODEL = json.loads((MODELS_DIR / "llama-3.1-8b.json").read_text(encoding="utf-8"))
SCENARIO = _yaml(ROOT / "scenarios" / "quickstart.yaml")
SWEEP = {**_yaml(ROOT / "scenarios" / "sweep_rate.yaml"), "base": "quickstart.yaml"}
PLAN = _yaml(ROOT / "scenarios" / "plan_chat.yaml")
QUICKSTART = (ROOT / "scenarios" / "quickstart.yaml").read_text(encoding="utf-8")


@FUZZ
@given(contents(HARDWARE, "yaml"))
def test_hardware_specs(content: bytes) -> None:
    loads_or_spec_error(lambda p: load_hardware(p, calibrated=False), content, "hw.yaml")


@FUZZ
@given(contents(ENGINE, "yaml"))
def test_engine_profiles(content: bytes) -> None:
    loads_or_spec_error(lambda p: load_engine(p, calibrated=False), content, "engine.yaml")


@FUZZ
@given(contents(MODEL, "json"))
def test_model_configs(content: bytes) -> None:
    def load(path: Path) -> None:
        spec = load_model(str(path))
        spec.kv_bytes_per_token()
        assert spec.num_params > 0

    loads_or_spec_error(load, content, "config.json")


@FUZZ
@given(contents(SCENARIO, "yaml"))
def test_scenarios(content: bytes) -> None:
    loads_or_spec_error(load_scenario, content, "scenario.yaml")


@FUZZ
@given(contents(SWEEP, "yaml"))
def test_sweeps(content: bytes) -> None:
    loads_or_spec_error(
        lambda p: expand(load_sweep(p)), content, "sweep.yaml", {"quickstart.yaml": QUICKSTART}
    )


@FUZZ
@given(contents(PLAN, "yaml"))
def test_plans(content: bytes) -> None:
    loads_or_spec_error(load_plan, content, "plan.yaml")


cells = st.one_of(
    st.integers(-5, 10**6).map(str),
    huge_numbers.map(str),
    st.sampled_from(["", "abc", "2024-01-01T00:00:00Z", "1e400", "-0", "nan", "inf", '"x"']),
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r,"),
        max_size=6,
    ),
)
csv_rows = st.lists(st.tuples(cells, cells, cells), min_size=0, max_size=8).map(
    lambda rows: ("ts,p,o\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows)).encode()
)
jsonl_rows = st.lists(
    st.dictionaries(st.sampled_from(["ts", "p", "o"]), scalars, min_size=0, max_size=3),
    max_size=8,
).map(lambda rows: "".join(json.dumps(r) + "\n" for r in rows).encode())


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@FUZZ
@given(data=st.data())
def test_traces(fmt: str, data: st.DataObject) -> None:
    rows = csv_rows if fmt == "csv" else jsonl_rows
    content = data.draw(st.one_of(rows, st.binary(max_size=200)))

    def load(path: Path) -> None:
        ds = TraceDataset(path=path, timestamp_column="ts", prompt_column="p", output_column="o")
        read_trace(ds, with_timestamps=True)

    loads_or_spec_error(load, content, f"trace.{fmt}")


def test_a_quantity_beyond_any_float_is_a_spec_error() -> None:
    """An integer too large for a float (hypothesis found one) is bad input, not an
    OverflowError from the unit parser."""
    huge = copy.deepcopy(HARDWARE)
    huge["compute"]["peak_flops_per_s"]["fp32"] = 10**400
    with pytest.raises(SpecError, match="too large"):
        forget_loaded_specs()
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "hw.yaml"
            path.write_text(yaml.safe_dump(huge), encoding="utf-8")
            load_hardware(path, calibrated=False)
