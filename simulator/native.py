"""The compiled engine: which of the package's modules mypyc compiles to C (`setup.py`,
`make native`), and, when `simulator` is imported, whether the compiled modules or their
sources run.

The compiled modules are the serving engine's inner loop (the replica and its variants, its
scheduler, KV cache and step timer, the requests, the cluster's front end and router) and the
recorder of its rows; they give the same results as the sources, bit for bit
(tests/test_native.py), in about 0.6 of the CPU time (docs/speed.md). The sources run instead,
all of them, when:
- LLMSIM_PURE_PYTHON is set (to profile: cProfile does not see into compiled functions);
- any source is newer than its compiled module (it was edited after the build; `make`
  rebuilds), or only some modules are compiled: a compiled module accepts only the compiled
  classes of the others, so the two are never mixed;
- nothing is compiled (no C compiler, or an install without the build step).

This module uses the standard library alone: `setup.py` reads MODULES from it before anything
is installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PACKAGE = "simulator"
HERE = Path(__file__).resolve().parent
# Compiled together, by their names under PACKAGE (one build: a compiled class is only
# subclassed within it).
MODULES = (
    "serving.request",
    "serving.kv_cache",
    "serving.kv_tiers",
    "serving.kv_pool",
    "serving.scheduler",
    "serving.steptime",
    "serving.replica",
    "serving.stepping",
    "serving.pipeline",
    "serving.dp_group",
    "serving.pd_partition",
    "serving.router",
    "serving.cluster",
    "metrics.recorder",
    "metrics.stream",
)
# The build's shared library, which every compiled module loads (setup.py's group_name), by
# its name under PACKAGE.
LIBRARY = "_native__mypyc"
ENV_PURE = "LLMSIM_PURE_PYTHON"
# A source this much newer than its compiled module was edited after the build (an install
# writes both within moments of each other).
STALE_AFTER_S = 2.0


def source(name: str, folder: Path = HERE) -> Path:
    """The source file of module `name` (as MODULES names it) under the package `folder`."""
    return folder.joinpath(*name.split(".")).with_suffix(".py")


def compiled_files(folder: Path = HERE) -> dict[str, Path]:
    """The compiled module of each of MODULES, and the build's LIBRARY, that the package
    `folder` holds, by name."""
    found: dict[str, Path] = {}
    for name in (*MODULES, LIBRARY):
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = source(name, folder).with_suffix(suffix)
            if path.is_file():
                found[name] = path
                break
    return found


def sources_reason(folder: Path = HERE, *, pure: bool | None = None) -> str | None:
    """Why the sources run instead of a compiled build `folder` holds (None: the compiled
    modules run; also None when nothing is compiled, where the sources run anyway). `pure`:
    whether LLMSIM_PURE_PYTHON is set (None: read the environment)."""
    if pure is None:
        pure = bool(os.environ.get(ENV_PURE))
    if pure:
        return f"{ENV_PURE} is set"
    compiled = compiled_files(folder)
    if not compiled:
        return None
    missing = [name for name in (*MODULES, LIBRARY) if name not in compiled]
    if missing:
        return f"not compiled: {', '.join(missing)}"
    stale = [
        name
        for name in MODULES
        if source(name, folder).stat().st_mtime > compiled[name].stat().st_mtime + STALE_AFTER_S
    ]
    if stale:
        names = ", ".join(str(source(name, folder).relative_to(folder)) for name in stale)
        return f"edited since the build: {names}"
    return None


class _Sources(importlib.abc.MetaPathFinder):
    """Finds MODULES as their source files, ahead of the compiled ones beside them."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.partition(".")
        if package != PACKAGE or name not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source(name))


def choose() -> None:
    """Run the sources if `sources_reason` gives one (`simulator/__init__.py` calls it, before
    any compiled module can be imported)."""
    if sources_reason() is not None and not any(isinstance(f, _Sources) for f in sys.meta_path):
        sys.meta_path.insert(0, _Sources())


def status() -> str:
    """Which build runs: "compiled", or "sources" with the reason."""
    if any(isinstance(f, _Sources) for f in sys.meta_path):
        return f"sources ({sources_reason()})"
    if not compiled_files():
        return "sources (not compiled: `make native` builds it)"
    return "compiled"
