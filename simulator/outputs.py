"""Writing results so that a kill, Ctrl-C or a full disk never leaves a torn or mixed folder.

- `atomic_folder`: a run's (or a plan's) files are written into a hidden sibling folder, which
  gets `manifest.json` (each file's size and SHA-256) last and is then swapped into place in one
  rename. A previous result in that place is replaced only once the new one is whole: a reader
  finds the old folder or the new one, never a mix. `check_manifest` is the reader's half.
- `replace_file`: one file written beside its place and renamed over it; a symbolic link planted
  at that name is replaced, never followed.
- `folder_lock`: an exclusive lock on a folder (a sweep's), released by the system when its
  holder dies, however it dies; a second holder is refused with the first one's pid and host.
- `held_fd`: what native code writes to a file descriptor (a solver's diagnostics on stdout,
  Ray's retries on stderr) held back, and written out only if the caller says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime
import errno
import hashlib
import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from simulator.errors import SpecError, not_a_file

MANIFEST = "manifest.json"
LOCK_FILE = ".llmsim.lock"
# Files a result folder may hold beside its own: written after it by `llmsim report`.
EXTRA_FILES = ("report.html",)
_TMP_MARK = ".llmsim-"  # hidden siblings: .NAME.llmsim-PID-HEX (being written, or replaced)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


# -- whole folders --------------------------------------------------------------------------------
@contextmanager
def atomic_folder(out: str | Path, kind: str, files: Iterable[str]) -> Iterator[Path]:
    """Yield an empty hidden folder beside `out` to write a `kind` result ("run", "plan") into;
    when the block ends normally, write its manifest and swap it into `out` (a folder already
    there, empty or a previous `kind` result holding only `files`, goes). On any exception,
    including KeyboardInterrupt, the hidden folder goes and `out` is as it was; an OSError (a
    full disk) is raised again naming `out`. A folder holding anything else is refused, before
    anything is written (`check_replaceable`)."""
    final = check_replaceable(out, files)
    inside = Path.cwd() == final  # `--out .`: the working folder is about to be swapped
    parent = final.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"cannot create the folder ({exc.strerror})", source=str(parent)) from None
    remove_leftovers(final)
    tmp = parent / f".{final.name}{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.mkdir(tmp)
        yield tmp
        write_manifest(tmp, kind)
        check_replaceable(final, files)  # nothing else moved in while we wrote
        _swap_into_place(tmp, final)
        if inside:
            os.chdir(final)  # the new folder, not the deleted old one
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(exc.errno, exc.strerror or str(exc), str(out)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_replaceable(out: str | Path, files: Iterable[str]) -> Path:
    """`out` as an absolute path (a link to a folder is followed: the user named it) if a result
    may be written there: nothing there yet, an empty folder, or a previous result holding only
    `files`, its manifest and `EXTRA_FILES`; anything else is a SpecError naming what is in the
    way."""
    given = not_a_file(out)
    final = given.resolve() if given.is_symlink() else Path(os.path.abspath(given))
    if not final.is_dir():
        return final
    allowed = {*files, MANIFEST, *EXTRA_FILES}
    others = sorted(p.name for p in final.iterdir() if p.name not in allowed or not p.is_file())
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise SpecError(
            f"holds {shown}, which a result folder does not; give a new or empty folder, or a "
            "previous result's (it is replaced whole)",
            source=str(given),
        )
    return final


def write_manifest(folder: Path, kind: str) -> None:
    """`folder/manifest.json`: what wrote the folder and each file's size and SHA-256, after
    flushing them to disk (the manifest is the last file: a folder with one is whole)."""
    files = {}
    for path in sorted(folder.iterdir()):
        if path.name == MANIFEST or not path.is_file():
            continue
        _fsync(path)
        files[path.name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    text = json.dumps({"llmsim": kind, "files": files}, indent=2) + "\n"
    replace_file(folder / MANIFEST, text)


def check_manifest(folder: Path, kind: str, files: Iterable[str]) -> None:
    """A SpecError unless `folder` is a whole `kind` result: its manifest names each file it
    holds among `files` with that file's size and SHA-256 (a folder cut short, or one mixing
    two results, fails here)."""
    path = folder / MANIFEST
    rerun = f"rerun llmsim {kind} --out to write it again"
    if not path.is_file():
        raise SpecError(
            f"no {MANIFEST}: not a whole {kind} folder (cut short, or written by llmsim before "
            f"2026-11-28); {rerun}",
            source=str(folder),
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        listed: dict[str, dict[str, Any]] = data["files"]
        if data["llmsim"] != kind or not all(
            isinstance(v["bytes"], int) and isinstance(v["sha256"], str) for v in listed.values()
        ):
            raise ValueError
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        raise SpecError(f"not the manifest of a {kind} folder; {rerun}", source=str(path)) from None
    for name, entry in listed.items():
        file = folder / name
        if not file.is_file():
            raise SpecError(
                f"missing {name}, which {MANIFEST} lists (the folder is incomplete); {rerun}",
                source=str(folder),
            )
        size = file.stat().st_size
        if size != entry["bytes"] or _sha256(file) != entry["sha256"]:
            raise SpecError(
                f"is not the file {MANIFEST} lists ({size:,} bytes, listed {entry['bytes']:,}, "
                f"or other content): the folder mixes two results or was cut short; {rerun}",
                source=str(file),
            )
    strays = sorted(n for n in files if n not in listed and (folder / n).exists())
    if strays:
        raise SpecError(
            f"holds {', '.join(strays)}, which {MANIFEST} does not list (left by another "
            f"result: the folder mixes two); {rerun}",
            source=str(folder),
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    """Flush a file (or, where the system allows, a folder) to disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # a folder on Windows cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.EACCES):  # not supported there
            raise
    finally:
        os.close(fd)


def _swap_into_place(tmp: Path, final: Path) -> None:
    """Make `tmp` be `final`. With a folder already at `final`: on Linux one renameat2
    RENAME_EXCHANGE (a reader sees the old folder or the new one), elsewhere two renames
    (between them, for an instant, neither); the old folder is then deleted."""
    _fsync(tmp)
    if not final.exists():
        os.rename(tmp, final)
    elif not _exchange(tmp, final):
        old = final.parent / f".{final.name}{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(final, old)
        os.rename(tmp, final)
        tmp = old
    # `tmp` now holds what was at `final` (if anything): the replaced result
    shutil.rmtree(tmp, ignore_errors=True)
    _fsync(final.parent)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    return getattr(libc, "renameat2", None)  # glibc 2.28+


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where the system or the file system
    cannot."""
    call = _renameat2()
    if call is None:
        return False
    if call(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def remove_leftovers(final: Path) -> None:
    """Delete the hidden siblings of `final` (folders or files) left by a writer that died (a
    kill mid-write, or between the renames of the fallback swap), found by their pid (POSIX
    only)."""
    if os.name != "posix" or not final.parent.is_dir():
        return
    prefix = f".{final.name}{_TMP_MARK}"
    for path in final.parent.glob(f"{prefix}*"):
        pid = path.name[len(prefix) :].partition("-")[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()


def pid_alive(pid: int) -> bool:
    """Whether process `pid` lives on this machine (POSIX)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- single files ---------------------------------------------------------------------------------
def replace_file(path: Path, text: str) -> None:
    """Write `text` to `path` through a new file beside it (created exclusively, so no planted
    name or link is followed) renamed over it: a link at `path` is replaced, its target
    untouched; a kill leaves the old file or the new one."""
    with replacing(path) as fh:
        fh.write(text)


@contextmanager
def replacing(path: Path, *, newline: str | None = None) -> Iterator[IO[str]]:
    """A text file to write that becomes `path` when the block ends normally (see
    `replace_file`); on an exception it is deleted and `path` is as it was."""
    tmp = path.with_name(f".{path.name}{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o666)
    try:
        with open(fd, "w", encoding="utf-8", newline=newline) as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_append(path: Path) -> IO[str]:
    """`path` opened to append text, never through a symbolic link (a SpecError)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _link_error(path) from None
        raise
    return open(fd, "a", encoding="utf-8", newline="")


def refuse_link(path: Path) -> None:
    """A SpecError if `path` is a symbolic link (an output folder's files are never written
    through one: its target could be anything)."""
    if path.is_symlink():
        raise _link_error(path)


def _link_error(path: Path) -> SpecError:
    return SpecError(
        "is a symbolic link; llmsim does not write through links in an output folder (remove "
        "it, or choose another --out)",
        source=str(path),
    )


# -- locks ----------------------------------------------------------------------------------------
@contextmanager
def folder_lock(folder: Path, what: str) -> Iterator[None]:
    """Hold `folder/.llmsim.lock` exclusively while the block runs, with this process's pid
    and host in it. The system releases the lock when its holder dies, however it dies (a
    lock left by a dead process is simply taken); a live holder is a SpecError naming it."""
    path = folder / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _link_error(path) from None
        raise
    try:
        if not _try_lock(fd):
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() if _HAS_PREAD else ""
            raise SpecError(
                f"another {what} is writing this folder ({holder or 'holder unknown'}); wait "
                "for it to finish or stop it, or choose another --out",
                source=str(folder),
            )
        since = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock


_HAS_PREAD = hasattr(os, "pread")


def _try_lock(fd: int) -> bool:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
        except OSError:
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        return False
    return True


@dataclass
class HeldOutput:
    """What `held_fd` holds back: set `replay` for it to be written out when the block ends."""

    replay: bool = False


@contextmanager
def held_fd(fd: int) -> Iterator[HeldOutput]:
    """What is written to file descriptor `fd` (1 or 2) in the block, by Python or by native
    code that writes there directly, held in a temporary file and written out at the end only
    if `replay` was set, else dropped. A process without that descriptor (an embedding host)
    is left as it is."""
    held = HeldOutput()
    stream = sys.stdout if fd == 1 else sys.stderr
    try:
        stream.flush()
        saved = os.dup(fd)
    except (OSError, ValueError):
        yield held
        return
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), fd)
        try:
            yield held
        finally:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
            os.dup2(saved, fd)
            os.close(saved)
            if held.replay:
                log.seek(0)
                os.write(fd, log.read())
