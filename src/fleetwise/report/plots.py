"""Figure helpers on matplotlib (object API, no pyplot state): CDFs, time series with marked
periods, bars with confidence intervals, and rendering one figure to SVG and PNG.

Owns the look every report shares (sizes, fonts, colours), the unit of each quantity in every
report (`MS`: latencies in milliseconds in figures and tables alike; simulated time in seconds;
shares in %), the rule that no legend covers plotted data (`render` moves one that does beside
its axes) and the rendering settings that keep the output byte-stable for fixed inputs (fixed SVG
id salt, no dates in metadata).
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
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
MS = 1e3
"""Seconds to milliseconds: every latency (TTFT, TPOT, E2E, KV transfer) is shown in ms, in figures and tables."""
PCT = 100.0
"""A fraction (share, hit rate, KV usage, attainment) to the % every figure shows it in."""
UNITS = ("ms", "s", "req/s", "tokens", "requests", "sequences", "replicas", "%", "$/h")
"""The units axis labels carry, as `label (unit)`; an axis of names (categories) carries none."""
LEGEND_PAD = 0.01
"""Gap between an axes and a legend moved beside it, in axes widths."""
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
    figure: Any = field(default=None, repr=False, compare=False)
    """The matplotlib Figure drawn (for checks over its axes and legends)."""


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
    if _clear_legends(fig):
        fig.draw_without_rendering()  # lay out again around the legends moved aside
    fig.set_layout_engine("none")
    fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": "fleetwise"})
    fig.savefig(png, format="png", dpi=PNG_DPI, metadata={"Software": "fleetwise"})
    text = svg.getvalue().decode("utf-8")
    start = text.find("<svg")  # drop the XML prolog and DOCTYPE: the SVG is embedded, never fetched
    return Rendered(name, caption, text[start:] if start > 0 else text, png.getvalue(), fig)


def _data_points(ax: Any) -> np.ndarray:
    """Display coordinates of the points an axes plots in data coordinates (lines with each segment
    sampled, bar corners and centres); reference lines and shaded periods are not data."""
    pts = [np.empty((0, 2))]
    for line in ax.get_lines():
        xy = np.asarray(line.get_xydata(), dtype=float)
        if line.get_transform() is not ax.transData or not line.get_visible():
            continue
        xy = xy[np.isfinite(xy).all(axis=1)]
        if len(xy) > 1 and line.get_linestyle() not in ("None", "", " "):
            pts.append(ax.transData.transform(_sampled(_drawn_path(xy, line.get_drawstyle()))))
        elif len(xy):
            pts.append(ax.transData.transform(xy))
    for patch in ax.patches:
        if patch.get_data_transform() is not ax.transData or not patch.get_visible():
            continue
        b = patch.get_window_extent()
        if b.width > 0 and b.height > 0:
            xs, ys = np.linspace(b.x0, b.x1, 5), np.linspace(b.y0, b.y1, 5)
            pts.append(np.array([(x, y) for x in xs for y in ys]))
    return np.vstack(pts)


SEGMENT_SAMPLES = 8
"""Points checked along each drawn segment of a line (a legend can sit on a segment between points)."""


def _drawn_path(xy: np.ndarray, drawstyle: str) -> np.ndarray:
    """The vertices a line is drawn through: its points, with the corners of a step line."""
    if not drawstyle.startswith("steps"):
        return xy
    corner = np.column_stack([xy[1:, 0], xy[:-1, 1]]) if drawstyle != "steps-pre" else \
        np.column_stack([xy[:-1, 0], xy[1:, 1]])
    out = np.empty((2 * len(xy) - 1, 2))
    out[0::2], out[1::2] = xy, corner
    return out


def _sampled(path: np.ndarray) -> np.ndarray:
    t = np.linspace(0.0, 1.0, SEGMENT_SAMPLES)[:, None, None]
    return (path[:-1] * (1 - t) + path[1:] * t).reshape(-1, 2)


def legend_covers_data(ax: Any, legend: Any) -> bool:
    """Whether `legend`'s box, as laid out, covers a point `ax` plots."""
    box = legend.get_window_extent()
    p = _data_points(ax)
    return bool(((p[:, 0] > box.x0) & (p[:, 0] < box.x1) & (p[:, 1] > box.y0) & (p[:, 1] < box.y1)).any())


def _clear_legends(fig: Any) -> bool:
    """Move each axes legend that covers its data beside the axes (right, top-aligned); True if one moved."""
    moved = False
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is not None and legend_covers_data(ax, leg):
            leg.set_loc("upper left")
            leg.set_bbox_to_anchor((1.0 + LEGEND_PAD, 1.0), transform=ax.transAxes)
            moved = True
    return moved


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
    """The empirical CDF of `values` as a step line, its y axis in % of the samples."""
    x, y = cdf_points(values)
    if x.size:
        ax.step(x, y * PCT, where="post", label=f"{label} (n={int(np.isfinite(values).sum())})", **kw)


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
