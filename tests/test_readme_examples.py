"""README's YAML examples that name a bundled file say what that file says.

A block whose first line ends in `# scenarios/NAME.yaml` is read as an excerpt of that file:
every key it sets must hold the same value there (a key set to null may be absent), so an
example cannot drift from the file whose output the README quotes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```yaml\n(.*?)```", re.DOTALL)
NAMED = re.compile(r"#\s*(scenarios/[\w.-]+\.yaml)\s*$")


def _named_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    blocks = []
    for body in BLOCK.findall(text):
        match = NAMED.search(body.splitlines()[0])
        if match:
            blocks.append((match.group(1), body))
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
                    out.append(f"{where}: set in the README, absent from the file")
                continue
            out += _differences(value, full[key], where)
        return out
    return [] if excerpt == full else [f"{path}: README {excerpt!r}, file {full!r}"]


def test_readme_names_bundled_examples() -> None:
    assert {name for name, _ in _named_blocks()} >= {
        "scenarios/plan_chat.yaml",
        "scenarios/plan_disagg.yaml",
        "scenarios/disagg_h100.yaml",
    }


@pytest.mark.parametrize(
    "name,body", [pytest.param(n, b, id=f"{n}#{i}") for i, (n, b) in enumerate(_named_blocks())]
)
def test_readme_example_matches_its_file(name: str, body: str) -> None:
    excerpt = yaml.safe_load(body)
    full = yaml.safe_load((ROOT / name).read_text())
    assert _differences(excerpt, full) == []
