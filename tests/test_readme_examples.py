"""The documentation's YAML examples that name a bundled file say what that file says.

A block in README.md or docs/*.md whose first line ends in `# scenarios/NAME.yaml` is read as
an excerpt of that file: every key it sets must hold the same value there (a key set to null
may be absent), so an example cannot drift from the file whose output the docs quote."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```yaml\n(.*?)```", re.DOTALL)
NAMED = re.compile(r"#\s*(scenarios/[\w.-]+\.yaml)\s*$")


def _named_blocks() -> list[tuple[str, str, str]]:
    """(page, bundled file, block) for every named YAML block of every page."""
    blocks = []
    for page in PAGES:
        for body in BLOCK.findall(page.read_text(encoding="utf-8")):
            match = NAMED.search(body.splitlines()[0])
            if match:
                blocks.append((page.relative_to(ROOT).as_posix(), match.group(1), body))
    return blocks


def _differences(excerpt: Any, full: Any, path: str = "") -> list[str]:
    """Where `excerpt` sets something `full` does not hold."""
    if isinstance(excerpt, dict):
        if not isinstance(full, dict):
            return [f"{path or '.'}: {full!r} is not a mapping"]
        out = []
        for key, value in excerpt.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in full:
                if value is not None:
                    out.append(f"{where}: set in the example, absent from the file")
                continue
            out += _differences(value, full[key], where)
        return out
    return [] if excerpt == full else [f"{path}: example {excerpt!r}, file {full!r}"]


def test_docs_name_bundled_examples() -> None:
    assert {name for _, name, _ in _named_blocks()} >= {
        "scenarios/plan_chat.yaml",
        "scenarios/plan_disagg.yaml",
        "scenarios/disagg_h100.yaml",
    }


@pytest.mark.parametrize(
    "page,name,body",
    [pytest.param(p, n, b, id=f"{p}:{n}#{i}") for i, (p, n, b) in enumerate(_named_blocks())],
)
def test_example_matches_its_file(page: str, name: str, body: str) -> None:
    excerpt = yaml.safe_load(body)
    full = yaml.safe_load((ROOT / name).read_text())
    assert _differences(excerpt, full) == [], page
