"""Errors that mean "the user's input is wrong": the CLI prints them as one line and exits 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


class SpecError(ValueError):
    """Bad input: an unknown id, malformed YAML, an impossible layout, a model that does not fit.

    `source` names the file or id, `field` the dotted field path, `reason` what is wrong and,
    where it helps, what to do. `str()` is the one line the CLI prints.
    """

    def __init__(self, reason: str, *, source: str = "", field: str = "") -> None:
        self.reason = reason
        self.source = source
        self.field = field
        super().__init__(self.line())

    def line(self) -> str:
        where = ": ".join(part for part in (self.source, self.field) if part)
        line = f"{where}: {self.reason}" if where else self.reason
        return line.replace("\r", "\\r").replace("\n", "\\n")  # a key may hold a line break


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A hint for a mistyped `word`: "; did you mean 'x'?" (or "'x' or 'y'"), naming the choices
    it begins (`h100`: h100_pcie, h100_sxm), else difflib's closest at a ratio of at least 0.6;
    "" when none is close. Case is ignored."""
    by_lower = {c.lower(): c for c in choices}
    key = word.lower()
    close = sorted(c for c in by_lower if c.startswith(key) and c != key)[:2]
    close = close or difflib.get_close_matches(key, list(by_lower), n=2, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(by_lower[c]) for c in close) + "?"


@contextmanager
def naming(source: str = "", field: str = "") -> Iterator[None]:
    """A SpecError raised within that does not already name `source` is raised again with
    `source` and `field` in front of its line (a scenario file's impossible layout names the
    file and the replica group)."""
    try:
        yield
    except SpecError as exc:
        if source and exc.source == source:
            raise
        raise SpecError(exc.line(), source=source, field=field) from exc


def output_folder(out: str | Path) -> Path:
    """`out` as a folder to write results into, created with its parents; a path that is a
    file, or a folder that cannot be made, is a SpecError naming it."""
    folder = not_a_file(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"cannot create the folder ({exc.strerror})", source=str(folder)) from None
    return folder


def not_a_file(out: str | Path) -> Path:
    """`out`, which may be a folder or not exist yet; a file there is a SpecError (checked
    before a long run whose results would go there)."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise SpecError("is a file; give a folder to write into", source=str(folder))
    return folder
