"""One self-contained HTML page: sections of text, tables and figures, and the figure files beside it.

Owns the page's markup and style and how a figure is embedded: each figure goes into the HTML
as an SVG data URI (so the page opens offline, with no server and nothing fetched) and is also
written as `<stem>_figures/<name>.svg` and `.png` next to the HTML, for slides.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetwise.report.plots import Rendered

TABLE_DIGITS = 4
"""Most significant digits a number in a report table shows (a float beyond it is noise to a reader)."""

Progress = Callable[[float], None]
"""Told the share of a report drawn so far (0..1)."""

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:18px 32px}
header h1{margin:0;font-size:22px} header p{margin:4px 0 0;color:#c9cfdb}
main{max-width:1180px;margin:0 auto;padding:8px 32px 40px}
section{background:#fff;border:1px solid #e1e4ea;border-radius:6px;margin:18px 0;padding:14px 20px}
h2{font-size:17px;margin:4px 0 10px} h3{font-size:15px;margin:14px 0 6px}
figure{margin:10px 0} figure img{max-width:100%;height:auto;display:block}
figcaption{color:#555d6e;font-size:13px;margin-top:4px}
table{border-collapse:collapse;margin:8px 0;font-size:13px} td,th{border-bottom:1px solid #e6e8ee;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f0f2f6} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.grey td{color:#8a90a0} .pass{color:#1a7f37;font-weight:600} .fail{color:#c62828;font-weight:600}
ol li,ul li{margin:2px 0} .kv{display:grid;grid-template-columns:max-content auto;gap:2px 16px}
nav a{margin-right:12px;color:#2a5bd7;text-decoration:none}
"""


def num(x: float, digits: int = TABLE_DIGITS) -> str:
    """`x` with at most `digits` significant digits (9.966667 -> 9.967, 1234567.8 -> 1,235,000); a
    count (int) stays exact; not finite -> `-`."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10**digits else str(x)
    if not math.isfinite(x):
        return "-"
    if abs(x) >= 10 ** (digits - 1):
        return f"{float(f'{x:.{digits}g}'):,.0f}"
    return f"{x:.{digits}g}"


@dataclass
class Section:
    """A titled part of the page; `parts` are HTML fragments in order."""

    title: str
    anchor: str
    parts: list[str] = field(default_factory=list)

    def text(self, s: str) -> None:
        self.parts.append(f"<p>{html.escape(s)}</p>")

    def heading(self, s: str) -> None:
        self.parts.append(f"<h3>{html.escape(s)}</h3>")

    def items(self, lines: list[str], ordered: bool = False) -> None:
        tag = "ol" if ordered else "ul"
        body = "".join(f"<li>{html.escape(x)}</li>" for x in lines)
        self.parts.append(f"<{tag}>{body}</{tag}>")

    def table(self, header: list[str], rows: list[list[Any]], grey: list[bool] | None = None) -> None:
        """A table; numbers are right-aligned and shown with at most TABLE_DIGITS significant digits
        (`num`), `grey[i]` greys row i (e.g. rejected candidates)."""
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        out = []
        for i, row in enumerate(rows):
            cells = "".join(
                f'<td class="num">{html.escape(num(c))}</td>' if isinstance(c, int | float) and not isinstance(c, bool) else
                f"<td>{html.escape(str(c))}</td>" for c in row)
            cls = ' class="grey"' if grey and grey[i] else ""
            out.append(f"<tr{cls}>{cells}</tr>")
        self.parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(out)}</tbody></table>")

    def figure(self, fig: Rendered) -> None:
        data = base64.b64encode(fig.svg.encode("utf-8")).decode("ascii")
        self.parts.append(
            f'<figure id="fig-{fig.name}" data-figure="{fig.name}"><img alt="{html.escape(fig.caption)}" '
            f'src="data:image/svg+xml;base64,{data}"><figcaption>{html.escape(fig.caption)}</figcaption></figure>')


@dataclass
class Page:
    """A report page: title, subtitle, sections, and the figures it embeds."""

    title: str
    subtitle: str = ""
    sections: list[Section] = field(default_factory=list)
    figures: list[Rendered] = field(default_factory=list)
    progress: Progress | None = None
    """Told the share of the figures drawn (0..1) after each one, out of `expected`."""
    expected: int = 0
    """Figures the builder will draw (it says so before drawing them)."""

    def section(self, title: str) -> Section:
        anchor = "s" + str(len(self.sections) + 1)
        s = Section(title, anchor)
        self.sections.append(s)
        return s

    def add_figure(self, section: Section, fig: Rendered) -> None:
        self.figures.append(fig)
        section.figure(fig)
        if self.progress is not None and self.expected:
            self.progress(min(1.0, len(self.figures) / self.expected))

    def html(self) -> str:
        nav = " ".join(f'<a href="#{s.anchor}">{html.escape(s.title)}</a>' for s in self.sections)
        body = "".join(f'<section id="{s.anchor}"><h2>{html.escape(s.title)}</h2>{"".join(s.parts)}</section>'
                       for s in self.sections)
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                f'<meta name="viewport" content="width=device-width,initial-scale=1">'
                f"<title>{html.escape(self.title)}</title><style>{STYLE}</style></head><body>"
                f"<header><h1>{html.escape(self.title)}</h1><p>{html.escape(self.subtitle)}</p></header>"
                f"<main><nav>{nav}</nav>{body}</main></body></html>\n")

    def write(self, path: str | Path) -> Path:
        """Write the HTML to `path` and every figure as SVG and PNG in `<stem>_figures/` beside it."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        figdir = figures_dir(out)
        figdir.mkdir(exist_ok=True)
        for f in self.figures:
            (figdir / f"{f.name}.svg").write_text(f.svg, encoding="utf-8")
            (figdir / f"{f.name}.png").write_bytes(f.png)
        out.write_text(self.html(), encoding="utf-8")
        return out


def figures_dir(html_path: Path) -> Path:
    """Where the PNG/SVG copies of a report's figures go: `<stem>_figures/` beside the HTML."""
    return html_path.with_name(f"{html_path.stem}_figures")
