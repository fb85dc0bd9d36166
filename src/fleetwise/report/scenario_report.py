"""Report of a scenario run (`scenarios.json`, schema `fleetwise-scenarios/1`).

Per scenario: the policies side by side (means with 95% confidence intervals over seeds), each
policy's per-replica queue over time (first seed, fault periods shaded), traffic share and
prefix hit rate per replica, and the routing decisions by reason; then the pass-rule verdicts.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from fleetwise.report import plots
from fleetwise.report.page import Page, Progress, Section
from fleetwise.report.registry import report_kind
from fleetwise.report.sim_report import decision_bars, safe_mode_spans

METRICS = (("ttft_p99_s", "P99 TTFT", "ms", plots.MS), ("tpot_p99_s", "P99 TPOT", "ms", plots.MS),
           ("goodput_rps", "goodput", "req/s", 1.0), ("slo_attainment", "SLO attainment", "%", plots.PCT))
"""Per policy bar: statistic, title, unit and the scale from the document's value to that unit."""


@report_kind("fleetwise-scenarios/")
def build_from_file(path: Path | None, doc: dict[str, Any], progress: Progress | None = None) -> Page:
    return build(doc, progress)


def build(doc: dict[str, Any], progress: Progress | None = None) -> Page:
    """The report page of a scenario run (`progress`: told the share of its figures drawn)."""
    with plots.style():
        verdict = "all pass-rule checks pass" if doc["passed"] else "a pass-rule check FAILS"
        page = Page(f"Routing scenarios: {doc['default_policy']} vs {doc['baseline_policy']}",
                    f"{len(doc['scenarios'])} scenarios, policies {', '.join(doc['policies'])}, "
                    f"{len(doc['seeds'])} seeds{' (small)' if doc.get('small') else ''}: {verdict}",
                    progress=progress, expected=2 * len(doc["scenarios"]))  # policies and replicas per scenario
        v = page.section("Verdicts")
        v.parts.append("<ul>" + "".join(
            f'<li><span class="{"pass" if line.startswith("PASS") else "fail"}">{line[:4]}</span>'
            f"{_esc(line[4:])}</li>" for line in doc["verdicts"]) + "</ul>")
        for name, runs in doc["scenarios"].items():
            info = doc.get("info", {}).get(name, {})
            sec = page.section(name)
            if info.get("description"):
                sec.text(info["description"])
            if info.get("replicas"):
                sec.text("fleet: " + "; ".join(info["replicas"]))
            stats = doc["stats"].get(name, {})
            page.add_figure(sec, _policies(name, stats, doc["policies"]))
            page.add_figure(sec, _replicas(name, runs, doc["policies"], _spans(info.get("faults", []), runs)))
            _reasons(sec, runs, doc["policies"])
    return page


def _esc(s: str) -> str:
    import html

    return html.escape(s)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _spans(faults: list[dict[str, Any]], runs: dict[str, list[dict[str, Any]]]) -> list[tuple[float, float, str, str]]:
    end = max((r["duration_s"] for rs in runs.values() for r in rs), default=0.0)
    out = []
    for f in faults:
        kind, target = f["kind"], f.get("replica") or f.get("pool") or ""
        label = f"{kind} {target}".strip()
        if "at_s" in f:
            back = f.get("restart_after_s")
            out.append((f["at_s"], f["at_s"] + back if back is not None else end, kind, label))
        elif f.get("end_s") is not None:
            out.append((f["start_s"], f["end_s"], kind, label))
        else:
            out.append((f["start_s"], f["start_s"], kind, label))
    return out


def _policies(name: str, stats: dict[str, Any], policies: list[str]) -> plots.Rendered:
    fig, axes = plots.figure(1, len(METRICS), height=2.9)
    pols = [p for p in policies if p in stats]
    colors = ["#9aa0ab" if i == len(pols) - 1 and p == "round-robin" else f"C{i}" for i, p in enumerate(pols)]
    for ax, (key, label, unit, scale) in zip(axes[0], METRICS, strict=True):
        st = [stats[p][key] for p in pols]
        means = [math.nan if x["mean"] is None else x["mean"] for x in st]  # None: undefined, no bar
        plots.bars_ci(ax, pols, [m * scale for m in means], [_scaled(x["ci95_lo"], m, scale) for x, m in zip(st, means, strict=True)],
                      [_scaled(x["ci95_hi"], m, scale) for x, m in zip(st, means, strict=True)], colors)
        ax.set_title(label)
        ax.set_ylabel(f"{label} ({unit})")
    return plots.render(fig, f"{_slug(name)}-policies", f"{name}: policies side by side, mean over seeds with "
                                                        "95% confidence intervals")


def _scaled(bound: float | None, mean: float, scale: float) -> float:
    """A CI bound in the figure's unit; a single seed has none, so the whisker is the mean."""
    return (mean if bound is None else bound) * scale


def _replicas(name: str, runs: dict[str, list[dict[str, Any]]], policies: list[str],
              spans: list[tuple[float, float, str, str]]) -> plots.Rendered:
    pols = [p for p in policies if p in runs]
    decided = any("decisions" in r for rs in runs.values() for run in rs for r in run["per_replica"])
    fig, axes = plots.figure(3 if decided else 2, len(pols), height=8.0 if decided else 5.4,
                             width=max(11.0, 3.6 * len(pols)))
    for j, p in enumerate(pols):
        first = runs[p][0]
        ax = axes[0, j]
        for r in first["per_replica"]:
            ax.step(r["queue_length"]["t_s"], r["queue_length"]["value"], where="post", lw=1, label=r["name"])
        plots.mark_spans(ax, sorted(spans + safe_mode_spans(first["router"])))
        ax.set_title(f"{p}: waiting requests (seed {first['seed']})")
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("waiting (requests)")
        if j == 0:
            ax.legend(loc="upper left", ncol=2)
        names = [r["name"] for r in first["per_replica"]]
        total = {n: 0 for n in names}
        hits = {n: 0.0 for n in names}
        for run in runs[p]:
            for r in run["per_replica"]:
                total[r["name"]] = total.get(r["name"], 0) + r["requests"]
                hits[r["name"]] = hits.get(r["name"], 0.0) + r["prefix_hit_rate"] / len(runs[p])
        n_all = sum(total.values()) or 1
        ax2 = axes[1, j]
        x = list(range(len(names)))
        ax2.bar([i - 0.2 for i in x], [total[n] / n_all * plots.PCT for n in names], width=0.4, label="traffic share")
        ax2.bar([i + 0.2 for i in x], [hits[n] * plots.PCT for n in names], width=0.4, label="prefix hit rate",
                color="#2ca02c")
        ax2.set_xticks(x, names, rotation=30, ha="right")
        ax2.set_ylim(0, plots.PCT)
        ax2.set_ylabel("share (%)")
        ax2.set_title(f"{p}: per replica, all seeds")
        if j == 0:
            ax2.legend(loc="upper left")
        if decided:  # documents written before per-replica decisions were recorded have none
            _decisions(axes[2, j], p, names, runs[p])
    return plots.render(fig, f"{_slug(name)}-replicas", f"{name}: per-replica queue over time (faults and safe "
                                                        "mode shaded), traffic share, prefix hit rate and the "
                                                        "routing decisions by kind per replica, per policy")


def _decisions(ax: Any, policy: str, names: list[str], runs: list[dict[str, Any]]) -> None:
    by_name: dict[str, dict[str, int]] = {n: {} for n in names}
    for run in runs:
        for r in run["per_replica"]:
            mine = by_name.setdefault(r["name"], {})
            for k, v in (r.get("decisions") or {}).items():
                mine[k] = mine.get(k, 0) + v
    decision_bars(ax, [{"name": n, "decisions": by_name[n]} for n in names])
    ax.set_title(f"{policy}: selection reasons, all seeds")
    ax.tick_params(axis="x", rotation=30)


def _reasons(sec: Section, runs: dict[str, list[dict[str, Any]]], policies: list[str]) -> None:
    rows = []
    for p in policies:
        counts: dict[str, int] = {}
        for run in runs.get(p, []):
            for k, v in run["router"].get("by_reason", {}).items():
                counts[k] = counts.get(k, 0) + v
        total = sum(counts.values()) or 1
        rows.append([p, ", ".join(f"{k} {v / total:.1%}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))])
    sec.table(["policy", "routing decisions by reason (all seeds)"], rows)
