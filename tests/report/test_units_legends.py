"""Every report's figures and tables read the same way: each numeric axis is labelled with its
unit, no legend box covers plotted data, latencies are in ms everywhere, and no number in a
table shows more than 4 significant digits (counts, being exact, excepted)."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.cbook import STEP_LOOKUP_MAP

from fleetwise.report import report_page
from fleetwise.report.page import num
from fleetwise.report.plots import UNITS

ROOT = Path(__file__).resolve().parents[2]
KEPT_PLAN = ROOT / "benchmarks/results/report_examples/plan_default.json"
UNIT_RE = re.compile(r"\((" + "|".join(re.escape(u) for u in UNITS) + r")\)$")
NUMBER_CELL = re.compile(r"^[\s\d.,%$()+\-±]+$")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


@pytest.fixture(scope="module")
def pages(sim_run, routing_run, scenario_run, plan_run) -> dict[str, Any]:
    return {"simulation": report_page(sim_run), "routing": report_page(routing_run),
            "scenarios": report_page(scenario_run), "plan": report_page(plan_run / "plan.json"),
            "kept plan": report_page(KEPT_PLAN)}


def _plots_data(ax: Any) -> bool:
    return any(line.get_transform() is ax.transData for line in ax.get_lines()) or \
        any(p.get_data_transform() is ax.transData for p in ax.patches)


def _categorical(axis: Any) -> bool:
    labels = [t.get_text() for t in axis.get_ticklabels() if t.get_text()]
    return bool(labels) and not all(re.fullmatch(r"[−\-+]?[\d.,]+(e[−\-+]?\d+)?|\$\\mathdefault\{.*\}\$", t)
                                    for t in labels)


def _label(ax: Any, which: str) -> str:
    """The axis label, or a sibling's when the axis is shared (only the bottom row is labelled)."""
    own = ax.get_xlabel() if which == "x" else ax.get_ylabel()
    if own:
        return str(own.split("\n")[-1])
    group = ax.get_shared_x_axes() if which == "x" else ax.get_shared_y_axes()
    for other in group.get_siblings(ax):
        lab = other.get_xlabel() if which == "x" else other.get_ylabel()
        if lab:
            return str(lab.split("\n")[-1])
    return ""


def test_every_numeric_axis_names_its_unit(pages):
    checked = 0
    for kind, page in pages.items():
        for fig in page.figures:
            for ax in fig.figure.axes:
                if not _plots_data(ax):
                    continue
                for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
                    if _categorical(axis):
                        continue
                    label = _label(ax, which)
                    assert UNIT_RE.search(label), f"{kind} {fig.name}: {which} axis {label!r} has no unit {UNITS}"
                    checked += 1
    assert checked > 40


def _display_points(ax: Any) -> np.ndarray:
    """Points of every data line (step corners and segments sampled) in display coordinates."""
    out = [np.empty((0, 2))]
    for line in ax.get_lines():
        if line.get_transform() is not ax.transData:
            continue
        x, y = (np.asarray(v, dtype=float) for v in line.get_data())
        keep = np.isfinite(x) & np.isfinite(y)
        x, y = x[keep], y[keep]
        style = line.get_drawstyle()
        if style in STEP_LOOKUP_MAP and style != "default" and len(x) > 1:
            x, y = STEP_LOOKUP_MAP[style](x, y)
        xy = np.column_stack([x, y])
        if len(xy) > 1 and line.get_linestyle() not in ("None", "", " "):
            t = np.linspace(0, 1, 11)[:, None, None]
            xy = (xy[:-1] * (1 - t) + xy[1:] * t).reshape(-1, 2)
        out.append(ax.transData.transform(xy))
    return np.vstack(out)


def test_no_legend_covers_plotted_data(pages):
    legends = 0
    for kind, page in pages.items():
        for fig in page.figures:
            f = fig.figure
            boxes = [ax.get_legend() for ax in f.axes if ax.get_legend() is not None] + list(f.legends)
            for leg in boxes:
                legends += 1
                box = leg.get_window_extent()
                for ax in f.axes:
                    inside = box.count_contains(_display_points(ax))
                    assert inside == 0, f"{kind} {fig.name}: legend covers {inside} points of {ax.get_title()!r}"
                    for p in ax.patches:
                        if p.get_data_transform() is ax.transData and p.get_height() != 0 and p.get_width() != 0:
                            assert not box.overlaps(p.get_window_extent()), \
                                f"{kind} {fig.name}: legend covers a bar of {ax.get_title()!r}"
    assert legends > 10


def _sig_digits(token: str) -> int:
    digits = token.replace(",", "").replace(".", "").lstrip("0")
    return len(digits)


def test_no_table_number_shows_more_than_four_significant_digits(pages):
    cells = 0
    for kind, page in pages.items():
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", page.html()):
            text = html.unescape(cell)
            if not NUMBER_CELL.match(text):
                continue
            for token in NUMBER.findall(text):
                if "." in token:  # counts (whole numbers) are exact
                    cells += 1
                    assert _sig_digits(token) <= 4, f"{kind}: table cell {text!r}"
    assert cells > 50


def test_latencies_are_in_ms_in_tables_and_figures(sim_run, pages):
    import json

    s = json.loads((sim_run / "summary.json").read_text())
    page = pages["simulation"]
    text = page.html()
    assert f'<td class="num">{num(s["ttft_s"]["p99"] * 1e3)}</td>' in text
    figs = {f.name: f.figure for f in page.figures}
    assert [ax.get_xlabel() for ax in figs["latency-by-pool"].axes] == ["TTFT (ms)", "TPOT (ms)", "E2E (ms)"]
    kv_axes = [ax for ax in figs["replica-timelines"].axes if ax.get_ylabel() == "(%)"]
    assert kv_axes
    for ax in kv_axes:  # scaled to what it shows, not a flat line on 0-100 %
        top = max((float(np.nanmax(line.get_ydata())) for line in ax.get_lines() if len(line.get_ydata())),
                  default=0.0)
        assert top <= ax.get_ylim()[1] <= max(2 * top, 1.0)
