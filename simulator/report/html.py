"""One self-contained HTML report: plotly.js inlined once in the head, then each section's
text, tables and figures. It opens offline (no network, no CDN) in any browser.

`report.build.write_report(DIR)` loads what DIR holds, builds its sections and renders them
here.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

PLOT_CONFIG = {"displaylogo": False, "responsive": True}
STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1200px; padding: 1em 2em; color: #222; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
p.note { color: #666; font-size: 0.92em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.figure { margin: 0.5em 0 1.5em 0; }
"""


@dataclass
class Section:
    """A heading, paragraphs of text (plain; escaped), tables (trusted HTML built by the
    report) and figures, in that order."""

    title: str
    text: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    figures: list[go.Figure] = field(default_factory=list)


def table_html(
    rows: Sequence[tuple[str, str]] | Sequence[Sequence[str]], *, header: Sequence[str] = ()
) -> str:
    """An HTML table of escaped cells."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table>{f'<tr>{head}</tr>' if head else ''}{body}</table>"


def render(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """The whole page: plotly.js once, then every section; figure divs are `fig-0`, `fig-1`..."""
    parts: list[str] = []
    n = 0
    for section in sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        parts += [f'<p class="note">{html.escape(t)}</p>' for t in section.text]
        parts += section.tables
        for fig in section.figures:
            snippet = pio.to_html(
                fig,
                full_html=False,
                include_plotlyjs=False,
                config=PLOT_CONFIG,
                div_id=f"fig-{n}",
                default_width="100%",
                default_height=f"{fig.layout.height or 450}px",
            )
            parts.append(f'<div class="figure">{snippet}</div>')
            n += 1
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{STYLE}</style>",
            f'<script type="text/javascript">{get_plotlyjs()}</script>',
            "</head><body>",
            f"<h1>{html.escape(title)}</h1>",
            f'<p class="note">{html.escape(subtitle)}</p>',
            *parts,
            "</body></html>",
        ]
    )
