"""The README stays a front door and the documentation's links lead somewhere.

Every relative link in README.md, CHANGELOG.md, docs/*.md and notebooks/README.md names a
file (or folder) that exists, and a `#fragment` into a Markdown file names one of its headings
as GitHub spells heading anchors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 300
PAGES = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "notebooks" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)
EXTERNAL = ("http://", "https://", "mailto:")


def _prose(text: str) -> str:
    """The text outside code blocks and code spans, where links are links."""
    return CODE.sub("", FENCE.sub("", text))


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but `-` and `_` dropped, spaces to
    `-`, a repeated anchor numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def _links(page: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(page.read_text(encoding="utf-8")))]


def test_anchor_spelling() -> None:
    text = "# Title\n## `llmsim bench latency`\n## e2e_energy, vLLM 0.11.1\n## Title\n"
    assert anchors(text) == {"title", "llmsim-bench-latency", "e2e_energy-vllm-0111", "title-1"}


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move topics to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _links(page):
        if target.startswith(EXTERNAL):
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file.read_text()):
            broken.append(f"{target}: no heading #{fragment} in {file.name}")
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"


def test_every_docs_page_is_linked_from_the_index() -> None:
    index = {t.partition("#")[0] for t in _links(ROOT / "docs" / "README.md")}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages <= index, sorted(pages - index)
