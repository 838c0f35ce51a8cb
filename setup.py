"""The build. setuptools reads the project from pyproject.toml; this adds the serving engine's
inner loop compiled to C by mypyc (simulator/native.py names the modules), where mypy is
importable and LLMSIM_PURE_PYTHON is not set. `make native` runs it in place
(`python setup.py build_ext --inplace --force`) in the environment `make` installs, whose
packages mypyc reads to type the code. Every compiled module is optional: without a C compiler
the build goes on and the sources run (the same results, slower)."""

import importlib.util
import os
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def native_modules() -> list:
    """mypyc's extension modules for native.MODULES, each optional; none where the build
    cannot or should not compile."""
    if os.environ.get("LLMSIM_PURE_PYTHON"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:  # an isolated build (pip's default) has no mypy: the sources run
        return []
    spec = importlib.util.spec_from_file_location("native", HERE / "simulator/native.py")
    assert spec is not None and spec.loader is not None
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    paths = [str(native.source(name).relative_to(HERE)) for name in native.MODULES]
    group = f"simulator.{native.LIBRARY.removesuffix('__mypyc')}"
    extensions = mypycify(paths, opt_level="3", group_name=group)
    for extension in extensions:
        extension.optional = True
    return extensions


setup(ext_modules=native_modules())
