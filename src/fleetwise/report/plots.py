"""Figure helpers on matplotlib (object API, no pyplot state): CDFs, time series with marked
periods, bars with confidence intervals, and rendering one figure to SVG and PNG.

Owns the look every report shares (sizes, fonts, colours) and the rendering settings that keep
the output byte-stable for fixed inputs (fixed SVG id salt, no dates in metadata).
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

CDF_POINTS = 400
"""Points drawn per CDF line: quantiles of the sorted samples (enough for a smooth curve at print size)."""
PNG_DPI = 110
RC: dict[str, Any] = {
    "svg.fonttype": "none",      # text stays text: smaller files, selectable labels
    "svg.hashsalt": "fleetwise",  # stable element ids
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8,
    "legend.frameon": False,
}
SPAN_COLORS = {"crash": "#d62728", "slowdown": "#ff7f0e", "kv_link": "#9467bd", "stale_view": "#8c564b",
               "rolling_upgrade": "#17becf", "safe_mode": "#7f7f7f"}
GREY = "#b0b4bd"
LOG_SCALE_SPAN = 100.0
"""max/min ratio (two decades) above which a CDF's x axis is drawn log-scaled."""
SPAN_ALPHA = 0.12
"""Opacity of a shaded fault/safe-mode period (light enough to read the curves through)."""
MARK_ALPHA = 0.6
"""Opacity of the dotted line marking an instantaneous event."""


@dataclass(frozen=True)
class Rendered:
    """One figure, rendered: file stem, caption, SVG text and PNG bytes."""

    name: str
    caption: str
    svg: str
    png: bytes


@contextmanager
def style() -> Iterator[None]:
    """Draw and render under the shared look (matplotlib reads rcParams when artists are made)."""
    import matplotlib

    with matplotlib.rc_context(RC):  # type: ignore[arg-type]
        yield


def figure(nrows: int = 1, ncols: int = 1, width: float = 11.0, height: float = 3.2, **kw: Any) -> tuple[Any, Any]:
    """A new (figure, 2-D axes array) of `width` x `height` inches, without pyplot's global state."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kw)


def render(fig: Any, name: str, caption: str) -> Rendered:
    """Render `fig` to SVG (fonts as text) and PNG; stable for fixed inputs."""
    svg, png = io.BytesIO(), io.BytesIO()
    fig.draw_without_rendering()  # lay out once; both formats reuse it
    fig.set_layout_engine("none")
    fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": "fleetwise"})
    fig.savefig(png, format="png", dpi=PNG_DPI, metadata={"Software": "fleetwise"})
    text = svg.getvalue().decode("utf-8")
    start = text.find("<svg")  # drop the XML prolog and DOCTYPE: the SVG is embedded, never fetched
    return Rendered(name, caption, text[start:] if start > 0 else text, png.getvalue())


def cdf_points(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) of the empirical CDF of finite `values`, thinned to at most CDF_POINTS quantiles."""
    v = np.sort(values[np.isfinite(values)])
    if v.size == 0:
        return v, v
    if v.size > CDF_POINTS:
        q = np.linspace(0.0, 1.0, CDF_POINTS)
        return np.quantile(v, q), q
    return v, np.arange(1, v.size + 1) / v.size


def cdf(ax: Any, values: np.ndarray, label: str, **kw: Any) -> None:
    x, y = cdf_points(values)
    if x.size:
        ax.step(x, y, where="post", label=f"{label} (n={int(np.isfinite(values).sum())})", **kw)


def log_if_wide(ax: Any, values: np.ndarray) -> None:
    """Log x-scale when positive samples span more than two decades."""
    v = values[np.isfinite(values) & (values > 0)]
    if v.size and v.max() / v.min() > LOG_SCALE_SPAN:
        ax.set_xscale("log")


def mark_spans(ax: Any, spans: Sequence[tuple[float, float, str, str]], label: bool = True) -> None:
    """Shade periods (start_s, end_s, kind, text) on a time axis; one legend entry per kind."""
    seen: set[str] = set()
    for start, end, kind, text in spans:
        color = SPAN_COLORS.get(kind, GREY)
        if end > start:
            ax.axvspan(start, end, color=color, alpha=SPAN_ALPHA, lw=0, label=None if kind in seen or not label else text)
        else:
            ax.axvline(start, color=color, alpha=MARK_ALPHA, lw=1, ls=":", label=None if kind in seen or not label else text)
        seen.add(kind)


def bars_ci(ax: Any, labels: Sequence[str], means: Sequence[float], lo: Sequence[float], hi: Sequence[float],
            colors: Sequence[str] | None = None) -> None:
    """Bars of `means` with asymmetric 95% CI whiskers [lo, hi]."""
    m = np.asarray(means, dtype=float)
    err = np.vstack([m - np.asarray(lo, dtype=float), np.asarray(hi, dtype=float) - m]).clip(min=0)
    x = np.arange(len(labels))
    ax.bar(x, m, yerr=err, capsize=4, color=colors)
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=7)
