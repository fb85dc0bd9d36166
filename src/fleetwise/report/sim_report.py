"""Report of one simulation run (`summary.json` + `requests.csv`, schema `fleetwise-sim-summary/1`).

Figures: TTFT/TPOT/E2E CDFs per pool and per tenant with the SLO lines; per-replica waiting
queue, running batch and KV usage over time with fault periods shaded; traffic share, prefix
hit rate and selection reasons per replica; KV transfer times (PD runs).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fleetwise.errors import SpecError
from fleetwise.report import plots
from fleetwise.report.page import Page, Progress, Section
from fleetwise.report.registry import report_kind

SCHEMA_PREFIX = "fleetwise-sim-summary/"
LATENCIES = (("ttft_s", "TTFT", "ttft_max_s"), ("tpot_s", "TPOT", "tpot_max_s"), ("e2e_s", "E2E", "e2e_max_s"))


@dataclass
class RunData:
    """A simulation run as the report reads it: the summary and per-request columns."""

    summary: dict[str, Any]
    columns: dict[str, np.ndarray]
    """ttft_s, tpot_s, e2e_s, arrival_s, kv_start_s, kv_end_s (float, NaN = none); tenant, worker,
    prefill_worker (str). Empty when the records are missing."""

    @property
    def has_records(self) -> bool:
        return bool(self.columns)


_FLOAT_COLS = ("arrival_s", "ttft_s", "tpot_s", "e2e_s", "kv_start_s", "kv_end_s")
_STR_COLS = ("tenant", "worker", "prefill_worker")


def columns_from_rows(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> dict[str, np.ndarray]:
    """Per-request columns (see RunData) from rows of the records table; '' = NaN."""
    idx = {c: header.index(c) for c in (*_FLOAT_COLS, *_STR_COLS)}
    data: dict[str, list[Any]] = {c: [] for c in idx}
    for row in rows:
        for c in _FLOAT_COLS:
            v = row[idx[c]]
            data[c].append(math.nan if v == "" else float(v))
        for c in _STR_COLS:
            data[c].append(str(row[idx[c]]))
    return {c: np.asarray(v, dtype=np.float64 if c in _FLOAT_COLS else object) for c, v in data.items()}


def load_run(path: Path) -> RunData:
    """A run directory (summary.json [+ requests.csv]) or a summary.json path."""
    d = path if path.is_dir() else path.parent
    summary_path = path / "summary.json" if path.is_dir() else path
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    records = d / "requests.csv"
    cols: dict[str, np.ndarray] = {}
    if not records.is_file() and (d / "requests.parquet").is_file():
        raise SpecError(f"{d / 'requests.parquet'}: the report reads the records as CSV; rerun the simulation "
                        "with --records csv (the default)")
    if records.is_file():
        with records.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader)
            missing = [c for c in (*_FLOAT_COLS, *_STR_COLS) if c not in header]
            if missing:
                raise SpecError(f"{records}: columns {missing} missing; write it with `fleetwise simulate --out`")
            cols = columns_from_rows(header, reader)
    return RunData(summary, cols)


@report_kind(SCHEMA_PREFIX)
def build_from_file(path: Path | None, doc: dict[str, Any], progress: Progress | None = None) -> Page:
    return build(load_run(path) if path is not None else RunData(doc, {}), progress)


def fault_spans(faults: list[dict[str, Any]], end_s: float) -> list[tuple[float, float, str, str]]:
    """(start, end, kind, label) periods from the summary's fault log; an unclosed period ends at `end_s`."""
    opening = {"crash": "crash", "start": "start", "down": "down"}
    closing = {"restart": ("crash", "down"), "restart_superseded": ("crash",), "end": ("start",)}
    open_at: dict[tuple[int, str], tuple[float, str]] = {}
    spans = []
    for f in faults:
        key = (int(f["fault"]), str(f.get("target", "")))
        phase = f["phase"]
        if phase in opening:
            open_at[key] = (float(f["t_s"]), phase)
        elif phase in closing and key in open_at and open_at[key][1] in closing[phase]:
            t0, _ = open_at.pop(key)
            spans.append((t0, float(f["t_s"]), f["kind"], _span_label(f)))
    for (_k, _t), (t0, _) in open_at.items():
        f = next(x for x in faults if int(x["fault"]) == _k and str(x.get("target", "")) == _t)
        spans.append((t0, end_s, f["kind"], _span_label(f)))
    return sorted(spans)


def safe_mode_spans(router: dict[str, Any]) -> list[tuple[float, float, str, str]]:
    """The router's safe-mode periods as spans (kind `safe_mode`)."""
    periods = (router.get("safe_mode") or {}).get("periods") or []
    return [(float(a), float(b), "safe_mode", "safe mode (stale fleet view)") for a, b in periods]


def _span_label(f: dict[str, Any]) -> str:
    target = f.get("target") or ""
    return f"{f['kind']} {target}".strip()


def build(run: RunData, progress: Progress | None = None) -> Page:
    """The report page of one simulation run (`progress`: told the share of its figures drawn)."""
    s = run.summary
    transfers = bool(s.get("disaggregated") and run.has_records)
    with plots.style():
        page = Page(f"Simulation: {s.get('plan', 'run')}",
                    f"{s['requests_completed']}/{s['requests_total']} requests completed, {s['requests_failed']} "
                    f"failed, {s['duration_s']:.1f} s simulated, seed {s['seed']}, routing {s['router'].get('policy', '')}",
                    progress=progress, expected=2 + 2 * run.has_records + transfers)  # timelines, routing, CDFs, KV
        _headline(page.section("Summary"), s)
        lat = page.section("Latency distributions")
        if run.has_records:
            page.add_figure(lat, _latency_cdfs(run, _pool_labels(run), "pool", "latency-by-pool"))
            page.add_figure(lat, _latency_cdfs(run, run.columns["tenant"], "tenant", "latency-by-tenant"))
        else:
            lat.text("requests.csv not found next to summary.json: distributions need the per-request records.")
        spans = sorted(fault_spans(s.get("faults", []), _end_s(s)) + safe_mode_spans(s["router"]))
        tl = page.section("Replicas over time")
        page.add_figure(tl, _timelines(s, spans))
        if spans:
            tl.table(["start (s)", "end (s)", "fault or safe mode"],
                     [[float(a), float(b), t] for a, b, _, t in spans])
        rt = page.section("Routing")
        page.add_figure(rt, _routing(s))
        _replica_table(rt, s)
        if transfers:
            kv = page.section("KV transfers")
            page.add_figure(kv, _transfers(run, spans))
            t = s["kv_transfer"]
            kv.text(f"{t['count']} transfers ({t['failed']} failed), p50 {t['p50_s'] * 1e3:.2f} ms, p99 "
                    f"{t['p99_s'] * 1e3:.2f} ms, mean queueing {t['mean_queue_s'] * 1e3:.2f} ms, "
                    f"{t['bytes_total'] / 1e9:.2f} GB moved")
    return page


def _end_s(s: dict[str, Any]) -> float:
    ends = [t for r in s["per_replica"] for t in r["queue_length"]["t_s"][-1:]]
    return max([*ends, *(float(f["t_s"]) for f in s.get("faults", [])), 0.0])


def _headline(sec: Section, s: dict[str, Any]) -> None:
    slo = s.get("slo", {})
    done = s["requests_completed"] > 0  # the summary's statistics of no requests are zeros, not measurements
    rows: list[list[Any]] = []
    for key, name, slo_key in LATENCIES:
        m = s[key]
        target = slo.get(slo_key)
        defined = done and m["p50"] is not None  # TPOT of one-token outputs only: undefined
        rows.append([name, *([_ms(m[q]) for q in ("p50", "p90", "p99", "mean")] if defined else ["n/a" if done else "-"] * 4),
                     "-" if target is None else _ms(target)])
    sec.table(["latency", "p50 (ms)", "p90 (ms)", "p99 (ms)", "mean (ms)", "SLO (ms)"], rows)
    t, c = s["throughput"], s["cost"]
    sec.table(["throughput (req/s)", "output (tokens/s)", "goodput (req/s)", "SLO attainment", "GPUs", "cost ($/h)",
               "$ per 1M output tokens"],
              [[float(t["requests_per_s"]), float(t["output_tokens_per_s"]), float(s["goodput_rps"]),
                f"{s['slo_attainment']:.1%}", c["gpus"], float(c["usd_per_hour"]),
                float(c["usd_per_1m_output_tokens"]) if t["output_tokens_per_s"] > 0 else "-"]])
    if s.get("failure_reasons"):
        sec.table(["failure reason", "requests"], [[k, v] for k, v in s["failure_reasons"].items()])


def _ms(x: float) -> float:
    return float(x) * plots.MS


def _pool_labels(run: RunData) -> np.ndarray:
    pool = {r["name"]: r["pool"] for r in run.summary["per_replica"]}
    w, p = run.columns["worker"], run.columns["prefill_worker"]
    return np.asarray([f"{pool[a]}→{pool[b]}" if a and a in pool and b in pool else pool.get(b, "unrouted")
                       for a, b in zip(p, w, strict=True)], dtype=object)


def _latency_cdfs(run: RunData, groups: np.ndarray, what: str, name: str) -> plots.Rendered:
    fig, axes = plots.figure(1, 3, height=3.0)
    slo = run.summary.get("slo", {})
    names = sorted(set(groups.tolist()))
    for ax, (key, label, slo_key) in zip(axes[0], LATENCIES, strict=True):
        vals = run.columns[key] * plots.MS
        if len(names) > 1:
            plots.cdf(ax, vals, "all", color="black", lw=1.2)
        for g in names:
            plots.cdf(ax, vals[groups == g], g, lw=1)
        if slo.get(slo_key) is not None:
            target = slo[slo_key] * plots.MS
            ax.axvline(target, color="#c62828", ls="--", lw=1, label=f"SLO {target:g} ms")
        plots.log_if_wide(ax, vals)
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylabel("requests at or below (%)")
        ax.set_ylim(0, plots.PCT * 1.01)
        if ax.get_legend_handles_labels()[0]:  # nothing completed and no target: no line to name
            ax.legend(loc="lower right")
    return plots.render(fig, name, f"TTFT, TPOT and end-to-end latency CDFs of completed requests per {what}; "
                                   "dashed red: SLO target")


def _timelines(s: dict[str, Any], spans: list[tuple[float, float, str, str]]) -> plots.Rendered:
    reps = s["per_replica"]
    fig, axes = plots.figure(len(reps), 3, width=12.0, height=max(3.0, 1.35 * len(reps) + 0.8), sharex=True)
    for i, r in enumerate(reps):
        for j, (key, label, unit, scale) in enumerate(TIMELINE_SERIES):
            ax = axes[i, j]
            if key in r:
                ax.step(r[key]["t_s"], np.asarray(r[key]["value"], dtype=float) * scale, where="post", lw=1,
                        color=f"C{j}")
            plots.mark_spans(ax, _mine(spans, r), label=False)
            if i == 0:
                ax.set_title(label)
            ax.set_ylabel(f"{r['name']}\n({unit})" if j == 0 else f"({unit})")
            ax.set_ylim(bottom=0)  # scaled to what it shows: a KV cache 3% full is not drawn flat on a 0-100 axis
    for j in range(3):
        axes[-1, j].set_xlabel("simulated time (s)")
    if spans:
        fig.legend(*_legend(spans), loc="outside upper right", ncol=6, fontsize=7)
    return plots.render(fig, "replica-timelines", "Per replica over time: waiting queue, running batch and KV "
                                                  "cache usage; shaded: its faults (crash to restart, slowdown, "
                                                  "KV link, upgrade) and the router's safe-mode periods")


TIMELINE_SERIES = (("queue_length", "waiting", "requests", 1.0), ("running", "running", "sequences", 1.0),
                   ("kv_usage_series", "KV cache used", "%", plots.PCT))
"""Per replica row: summary series, panel title, unit and the scale from the summary's value to it."""


def _mine(spans: list[tuple[float, float, str, str]], rep: dict[str, Any]) -> list[tuple[float, float, str, str]]:
    """The periods that concern replica `rep`: faults aimed at it, its pool, a link it ends, or the
    whole fleet (no target), and the router's safe mode."""
    out = []
    for sp in spans:
        target = sp[3][len(sp[2]):].strip()
        if sp[2] == "safe_mode" or not target or target in (rep["name"], rep["pool"]) or rep["name"] in target:
            out.append(sp)
    return out


LEGEND_SPANS = 12
"""Periods named in the timeline legend (the table under the figure lists them all)."""


def _legend(spans: list[tuple[float, float, str, str]]) -> tuple[list[Any], list[str]]:
    """One legend entry per distinct period label (`crash decode-0`), coloured by its kind."""
    from matplotlib.patches import Patch

    labels = dict((sp[3], sp[2]) for sp in spans)
    shown = list(labels.items())[:LEGEND_SPANS]
    return ([Patch(color=plots.SPAN_COLORS.get(k, plots.GREY), alpha=0.3) for _, k in shown], [t for t, _ in shown])


def _routing(s: dict[str, Any]) -> plots.Rendered:
    reps = s["per_replica"]
    names = [r["name"] for r in reps]
    fig, axes = plots.figure(1, 3, height=3.2)
    by_role: dict[str, int] = {}
    for r in reps:
        by_role[r["role"]] = by_role.get(r["role"], 0) + r["requests"]
    share = [r["requests"] / by_role[r["role"]] if by_role[r["role"]] else 0.0 for r in reps]
    axes[0, 0].bar(names, [x * plots.PCT for x in share])
    axes[0, 0].set_ylabel("share of its role's traffic (%)")
    axes[0, 1].bar(names, [r["prefix_hit_rate"] * plots.PCT for r in reps], color="#2ca02c")
    axes[0, 1].set_ylabel("prompt tokens from prefix cache (%)")
    axes[0, 1].set_ylim(0, plots.PCT)
    decision_bars(axes[0, 2], reps)
    axes[0, 2].set_title(f"selection reasons ({s['router'].get('policy', '')})")
    for ax in axes[0, :]:
        ax.tick_params(axis="x", rotation=30)
    return plots.render(fig, "routing", "Traffic share, prefix hit rate and the routing decisions (by kind) that "
                                        "placed requests on each replica")


def decision_bars(ax: Any, reps: list[dict[str, Any]]) -> None:
    """Stacked bars: per replica, requests placed by each decision kind (`per_replica[].decisions`)."""
    names = [r["name"] for r in reps]
    kinds = sorted({k for r in reps for k in (r.get("decisions") or {})})
    bottom = np.zeros(len(reps))
    for i, k in enumerate(kinds):
        v = np.array([float((r.get("decisions") or {}).get(k, 0)) for r in reps])
        ax.bar(names, v, bottom=bottom, label=k, color=f"C{i % 10}")
        bottom += v
    ax.set_ylabel("placed (requests)")
    if kinds:
        ax.set_ylim(0, max(float(bottom.max()), 1.0) * (1.12 + 0.09 * len(kinds)))  # room for the legend
        ax.legend(loc="upper right", fontsize=7, ncol=2)
    else:
        ax.text(0.5, 0.5, "no decision kinds recorded", ha="center", transform=ax.transAxes)


def _replica_table(sec: Section, s: dict[str, Any]) -> None:
    sec.table(["replica", "pool", "role", "requests", "utilization", "prefix hit rate", "preemptions",
               "KV mean", "KV max"],
              [[r["name"], r["pool"], r["role"], r["requests"], f"{r['utilization']:.1%}",
                f"{r['prefix_hit_rate']:.1%}", r["preemptions"], f"{r['kv_usage']['mean']:.1%}",
                f"{r['kv_usage']['max']:.1%}"] for r in s["per_replica"]])


def _transfers(run: RunData, spans: list[tuple[float, float, str, str]]) -> plots.Rendered:
    c = run.columns
    dur = c["kv_end_s"] - c["kv_start_s"]
    ok = np.isfinite(dur)
    fig, axes = plots.figure(1, 2, height=3.0)
    plots.cdf(axes[0, 0], dur * plots.MS, "transfers")
    axes[0, 0].set_xlabel("KV transfer time (ms)")
    axes[0, 0].set_ylabel("transfers at or below (%)")
    axes[0, 1].plot(c["kv_start_s"][ok], dur[ok] * plots.MS, ".", ms=3)
    plots.mark_spans(axes[0, 1], spans)
    axes[0, 1].set_xlabel("transfer start, simulated time (s)")
    axes[0, 1].set_ylabel("KV transfer time (ms)")
    if spans:  # the legend names the shaded fault and safe-mode periods; none, no legend
        axes[0, 1].legend(loc="upper right")
    return plots.render(fig, "kv-transfers", "KV cache transfer times (prefill to decode): distribution and over time")
