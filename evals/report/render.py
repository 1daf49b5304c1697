"""How the report says things: number formats, the ``Section`` and ``Figure`` a report is made
of, and the two renderings (Markdown, self-contained HTML with the PNGs embedded).

Every report module builds ``Section`` values and leaves writing them to this one, so the
Markdown and the HTML never say different things.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.analysis.stats import Interval, NotAvailable

__all__ = [
    "Figure",
    "Section",
    "estimate",
    "flatten",
    "interval",
    "na",
    "number",
    "p_value",
    "pct",
    "points",
    "render_html",
    "render_markdown",
]


def na(value: NotAvailable) -> str:
    return f"n/a ({value.reason})"


def pct(value: float | NotAvailable, digits: int = 1) -> str:
    return na(value) if isinstance(value, NotAvailable) else f"{100 * value:.{digits}f}%"


def points(value: Interval | NotAvailable, digits: int = 1) -> str:
    """A difference of rates in percentage points with its interval."""
    if isinstance(value, NotAvailable):
        return na(value)
    e, lo, hi = (100 * v for v in (value.estimate, value.low, value.high))
    return f"{e:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def estimate(value: Interval | NotAvailable) -> str:
    return na(value) if isinstance(value, NotAvailable) else pct(value.estimate)


def interval(value: Interval | NotAvailable) -> str:
    if isinstance(value, NotAvailable):
        return na(value)
    return f"{100 * value.estimate:.1f}% [{100 * value.low:.1f}, {100 * value.high:.1f}]"


def number(value: float | NotAvailable, digits: int = 2) -> str:
    return na(value) if isinstance(value, NotAvailable) else f"{value:.{digits}f}"


def p_value(value: float | NotAvailable) -> str:
    if isinstance(value, NotAvailable):
        return na(value)
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested mappings as (dotted key, JSON text) rows; strings stay as they are."""
    if isinstance(value, Mapping):
        out: list[tuple[str, str]] = []
        for key, inner in value.items():
            out.extend(flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return [(prefix, json.dumps(value) if not isinstance(value, str) else value)]


@dataclass(frozen=True)
class Figure:
    title: str
    path: Path


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(sections: Sequence[Section], title: str) -> str:
    lines = [f"# {title}", ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        for paragraph in section.paragraphs:
            lines += [paragraph, ""]
        if section.header:
            lines.append("| " + " | ".join(_md_cell(h) for h in section.header) + " |")
            lines.append("|" + "---|" * len(section.header))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in section.rows]
            lines.append("")
        for figure in section.figures:
            lines += [f"![{figure.title}]({figure.path.name})", ""]
    return "\n".join(lines)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
figure { display: inline-block; margin: 0.5em 1em 1em 0; }
figcaption { font-size: 0.85em; color: #555; }
img { max-width: 100%; }
"""


def render_html(sections: Sequence[Section], title: str) -> str:
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for section in sections:
        out.append(f"<h2>{html.escape(section.title)}</h2>")
        out += [f"<p>{html.escape(p)}</p>" for p in section.paragraphs]
        if section.header:
            out.append("<table><tr>")
            out += [f"<th>{html.escape(h)}</th>" for h in section.header]
            out.append("</tr>")
            for row in section.rows:
                out.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
            out.append("</table>")
        for figure in section.figures:
            data = base64.b64encode(figure.path.read_bytes()).decode("ascii")
            out.append(
                f'<figure><img alt="{html.escape(figure.title)}" '
                f'src="data:image/png;base64,{data}"><figcaption>'
                f"{html.escape(figure.title)}</figcaption></figure>"
            )
    out.append("</body></html>")
    return "\n".join(out)
