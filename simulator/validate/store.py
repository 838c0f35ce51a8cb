"""The simulated suites, computed once: per process, and across processes on disk when asked.

The end-to-end suites and the `ops` suite simulate or price every bundled measurement (minutes
of CPU in all), and several processes want the same rows: the CLI's `validate`, the test
workers, the CI check after them. `stored(name, compute)` keeps a suite's rows in the process;
with `LLMSIM_VALIDATE_CACHE` naming a folder it also keeps them there, keyed by a fingerprint of
everything the rows follow from: every file of this package (code, specs, bundled data) and of
the hardware spec folders (`hardware_specs/` beside it, with the calibration files), the Python
and numerical libraries' versions. A change to any of them is a new key (the stale file
of that suite is removed when the new one is written). Spec folders added through
`LLMSIM_HARDWARE_PATH` are the user's, so the folder is not used while it is set.

`prefetch(suites, names, jobs=...)` computes suites not yet held in a pool of processes, one
suite a process, and keeps what they return: `llmsim validate` (jobs = the cores) of every
suite takes the time of its longest suite on a machine with as many cores as it has simulated
suites.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import platform
import sys
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path

import pandas as pd

from simulator.specs.loader import hardware_dirs

CACHE_ENV = "LLMSIM_VALIDATE_CACHE"
PACKAGE = Path(__file__).resolve().parents[1]  # simulator/
# The libraries whose arithmetic the rows depend on.
LIBRARIES = ("numpy", "pandas", "scipy", "simpy", "pydantic", "pyyaml")

_HELD: dict[str, pd.DataFrame] = {}


def fingerprint() -> str:
    """A digest of every file of the package and of the hardware spec folders (the
    repository's `hardware_specs/`, with its calibration files), and of the Python and
    libraries' versions; read again at each use (some tens of milliseconds: a calibration may
    rewrite a spec's file)."""
    digest = hashlib.sha256()
    digest.update(f"{platform.python_implementation()} {sys.version_info[:3]}".encode())
    for name in LIBRARIES:
        try:
            digest.update(f"{name} {metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name} -".encode())
    for folder in (PACKAGE, *hardware_dirs()):
        digest.update(folder.name.encode())
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(path.relative_to(folder).as_posix().encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def cache_dir() -> Path | None:
    """The folder suites are kept in across processes, or None (not asked, or spec folders
    from outside the package in use)."""
    folder = os.environ.get(CACHE_ENV, "")
    if not folder or os.environ.get("LLMSIM_HARDWARE_PATH"):
        return None
    return Path(folder)


def _read(path: Path) -> pd.DataFrame | None:
    try:
        with path.open("rb") as f:
            rows = pickle.load(f)  # written by _write below, from this package's own rows
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    return rows if isinstance(rows, pd.DataFrame) else None


def _write(path: Path, rows: pd.DataFrame) -> None:
    """Atomically (a reader sees the whole file or none), then remove the suite's stale files."""
    folder, name = path.parent, path.name.rsplit("-", 1)[0]
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tmp.open("wb") as f:
            pickle.dump(rows, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
        for stale in folder.glob(f"{name}-*.pkl"):
            if stale != path:
                stale.unlink(missing_ok=True)
    except OSError as exc:  # a cache that cannot be written costs time, not results
        sys.stderr.write(f"llmsim: {CACHE_ENV}: cannot write {path}: {exc.strerror}\n")
        tmp.unlink(missing_ok=True)


def _path(name: str) -> Path | None:
    folder = cache_dir()
    return None if folder is None else folder / f"{name}-{fingerprint()}.pkl"


def on_disk(name: str, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """Suite `name`'s rows from the cache folder, else `compute()`d (and written there when a
    folder is in use)."""
    path = _path(name)
    rows = _read(path) if path is not None else None
    if rows is None:
        rows = compute()
        if path is not None:
            _write(path, rows)
    return rows


def stored(name: str, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """Suite `name`'s rows: held in this process, else `on_disk(name, compute)` (and held).
    The caller copies before handing them out."""
    rows = _HELD.get(name)
    if rows is None:
        rows = _HELD[name] = on_disk(name, compute)
    return rows


def held(name: str) -> bool:
    """Whether `name`'s rows are at hand without computing them (in this process or in the
    cache folder)."""
    if name in _HELD:
        return True
    path = _path(name)
    return path is not None and path.is_file()


def keep(name: str, rows: pd.DataFrame) -> None:
    """Hold rows computed elsewhere (a pool's process) as `name`'s, and write them to the cache
    folder if one is in use and lacks them."""
    _HELD[name] = rows
    path = _path(name)
    if path is not None and not path.is_file():
        _write(path, rows)


def forget(name: str | None = None) -> None:
    """Drop suite `name`'s rows held in this process (default: every suite's); the cache
    folder is left as it is."""
    if name is None:
        _HELD.clear()
    else:
        _HELD.pop(name, None)


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def prefetch(
    suites: dict[str, Callable[[], pd.DataFrame]], names: Iterable[str], *, jobs: int
) -> list[str]:
    """Compute the suites of `names` (keys of `suites`, each a picklable function returning
    the suite's rows) that are not held, in up to `jobs` processes, and keep their rows.
    Returns the names computed; with fewer than two to compute or `jobs` < 2, none (the
    caller computes in its own process)."""
    missing = [name for name in dict.fromkeys(names) if not held(name)]
    workers = min(jobs, len(missing))
    if workers < 2:
        return []
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    spawn = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as pool:
        for name, rows in zip(missing, pool.map(_call, [suites[n] for n in missing]), strict=True):
            keep(name, rows)
    return missing


def _call(compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    return compute()
