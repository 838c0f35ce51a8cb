"""The package's import graph: data flows one way through its layers, with no cycles.

units, errors, native -> outputs -> specs -> costmodel / workload -> metrics -> serving -> runs
-> planning / validate / regress -> report / calibrate -> api -> cli -> entry points
(docs/architecture.md draws it). A module
may import its own package and the layers below it, never a layer above nor another package
of its own layer. Every import counts, including those inside functions and under
TYPE_CHECKING: each is a dependency of the design, even where Python would not load it.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "simulator"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("simulator.units", "simulator.errors", "simulator.native"),
    ("simulator.outputs",),
    ("simulator.specs",),
    ("simulator.workload", "simulator.costmodel"),
    ("simulator.metrics",),
    ("simulator.serving",),
    ("simulator.runs",),
    ("simulator.planning", "simulator.validate", "simulator.regress"),
    ("simulator.report", "simulator.calibrate"),
    ("simulator.api",),
    ("simulator.cli", "simulator"),
    ("simulator.__main__", "simulator.pytest_plugin"),  # entry points into the CLI
)
LAYER = {group: i for i, groups in enumerate(LAYERS) for group in groups}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("simulator", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _group(module: str) -> str:
    """The layer entry a module belongs to: its top-level subpackage or module."""
    return ".".join(module.split(".")[:2])


def _known(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> Iterator[str]:
    """The package's modules that `module` imports (a name imported from a package counts as
    the submodule when it is one; `from simulator import api` is an import of `api` only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            subs = [f"{base}.{alias.name}" for alias in node.names]
            names = [s for s in subs if s in MODULES] or [base]
        else:
            continue
        for name in names:
            target = _known(name)
            if target is not None and target != module:
                yield target


GRAPH = {module: set(_imports(module, path)) for module, path in MODULES.items()}


def test_every_module_has_a_layer() -> None:
    assert sorted({_group(m) for m in MODULES} - set(LAYER)) == []


def test_no_import_cycles() -> None:
    # a package's __init__ re-exporting its own modules is not a cycle of the design
    graph = {
        m: {t for t in targets if not (m.startswith(t + ".") and MODULES[t].name == "__init__.py")}
        for m, targets in GRAPH.items()
    }
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_imports_flow_down_the_layers() -> None:
    upward = [
        f"{module} imports {target}"
        for module, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if _group(target) != _group(module) and LAYER[_group(target)] >= LAYER[_group(module)]
    ]
    assert upward == []


def test_the_walk_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    # the commonest way an upward import slips in
    path = tmp_path / "probe.py"
    path.write_text("def f():\n    from simulator.runs.runner import run\n")
    assert list(_imports("simulator.specs.probe", path)) == ["simulator.runs.runner"]
