"""Report of a plan (`fleetwise plan --json`, schema `fleetwise-plan/1`).

The ranked table; each plan's decision steps with their numbers and its claims; every candidate
the planner evaluated (`candidates`) in a table and on the cost vs goodput frontier (rejected
ones greyed, marked by their reason); the P:D sizing of the PD plans (load vs serving replicas
per phase) and every P:D ratio tried with its outcome (`pd_sweep`); and the disaggregation
verdict's breakdown (decode interference removed vs KV transfer cost added, at equal cost).
Documents written before `candidates`/`pd_sweep` existed still render, without those parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetwise.report import plots
from fleetwise.report.page import Page, Progress, Section
from fleetwise.report.plan_text import (
    TABLE_COLUMNS,
    calibration_lines,
    pools_label,
    price_lines,
    slo_line,
    table_rows,
)
from fleetwise.report.registry import report_kind


@report_kind("fleetwise-plan/")
def build_from_file(path: Path | None, doc: dict[str, Any], progress: Progress | None = None) -> Page:
    return build(doc, progress)


def build(doc: dict[str, Any], progress: Progress | None = None) -> Page:
    """The report page of a plan document (`progress`: told the share of its figures drawn)."""
    w = doc["workload"]
    pd = [p for p in doc["plans"] if p.get("pd_ratio")]
    dg = doc.get("disaggregation")
    draw = {"frontier": bool(doc["plans"] or doc.get("candidates")), "pd": bool(pd or doc.get("pd_sweep")),
            "disaggregation": bool(dg and dg.get("colocated") and dg.get("disaggregated"))}
    with plots.style():
        page = Page(f"Plan: {doc['name']}",
                    f"{doc['model']} at {w['rate_rps']:g} req/s (burst x{w['burst_factor']:.2f}); {slo_line(doc)}",
                    progress=progress, expected=sum(draw.values()))
        top = page.section("Answer")
        if doc.get("infeasible"):
            top.parts.append(f'<p class="fail">infeasible: {_esc(doc["infeasible"])}</p>')
        top.items([*price_lines(doc), *calibration_lines(doc)])
        top.table(["prompt mean (tokens)", "prompt p50 (tokens)", "prompt p99 (tokens)", "output mean (tokens)",
                   "output p99 (tokens)", "burst source"],
                  [[w["prompt_mean"], w["prompt_p50"], w["prompt_p99"], w["output_mean"], w["output_p99"],
                    w["burst_source"]]])
        if doc["plans"]:
            _ranked(top, doc["plans"])
        if draw["frontier"]:  # an infeasible answer still shows what was tried
            fr = page.section("Cost vs goodput")
            page.add_figure(fr, _frontier(doc))
        for p in doc["plans"]:
            sec = page.section(f"#{p['rank']} {p['kind']}")
            sec.text(f"{pools_label(p)}: {p['gpus']} GPUs, ${p['cost_per_hour']:.2f}/h, "
                     f"${p['cost_per_1m_tokens']:.2f} per 1M output tokens"
                     + (f", P:D {p['pd_ratio']}" if p.get("pd_ratio") else ""))
            sec.heading("decision steps")
            sec.items(p["explanation"], ordered=True)
            if p.get("claims"):
                sec.heading("claims checked in simulation")
                sec.table(["claim", "holds", "evidence"],
                          [[c["claim"], "yes" if c["holds"] else "NO", c["evidence"]] for c in p["claims"]])
        if doc.get("candidates"):
            _candidates(page.section(f"Every candidate evaluated ({len(doc['candidates'])})"), doc["candidates"])
        if draw["pd"]:
            sec = page.section("P:D ratio")
            page.add_figure(sec, _pd(doc, pd))
            if doc.get("pd_sweep"):
                _sweep_table(sec, doc["pd_sweep"])
        if dg:
            sec = page.section("Disaggregate or not")
            sec.parts.append(f"<p><b>{_esc(dg['verdict'])}</b>: {_esc(dg['reason'])}</p>")
            if dg.get("equal_cost"):
                sec.text(f"compared at equal cost: {dg['equal_cost']}")
            if draw["disaggregation"]:
                page.add_figure(sec, _disaggregation(dg))
            terms = dg.get("terms") or {}
            if terms:
                sec.table(["term", "value"], [[k.replace("_", " "), v] for k, v in terms.items()])
        if doc["rejected"]:
            rj = page.section(f"Rejected ({len(doc['rejected'])})")
            rj.table(["candidate", "reason"], [[r["candidate"], r["reason"]] for r in doc["rejected"]],
                     grey=[True] * len(doc["rejected"]))
        s = doc["search"]
        page.section("Search").text(f"{s['layouts_estimated']} layouts estimated, {s['candidates_sized']} candidates "
                                    f"sized, {s['simulations']} simulations in {s['wall_s']:.1f} s")
    return page


def _esc(s: str) -> str:
    import html

    return html.escape(str(s))


def _ranked(sec: Section, plans: list[dict[str, Any]]) -> None:
    rows = [[row[0], p["kind"], *row[1:]] for p, row in zip(plans, table_rows(plans), strict=True)]
    sec.table([TABLE_COLUMNS[0], "kind", *TABLE_COLUMNS[1:]], rows)


VERDICT_LOOK = {  # verdict -> (marker, legend label) of a candidate that is not a reported plan
    "missed_slo": ("X", "missed the SLO in simulation"),
    "over_limits": ("s", "over the GPU limits"),
    "not_checked": ("v", "not checked: could not be reported whatever its headroom gave"),
    "not_refined": ("o", "not refined: costlier than those refined"),
    "not_simulated": ("^", "not simulated: analytical cost per req/s above the best"),
    "demoted": ("D", "demoted: a PD claim failed"),
    "ranked": ("P", "meets the SLO, beyond the plans reported"),
}


def _candidates(sec: Section, cands: list[dict[str, Any]]) -> None:
    sec.table(["candidate", "fleet", "GPUs", "cost ($/h)", "goodput (req/s)", "source", "sustainable (req/s)", "verdict",
               "reason"],
              [[c["candidate"], c["fleet"], c["gpus"], c["cost_per_hour"], c["goodput_rps"], c["goodput_source"],
                c["capacity_rps"], c["verdict"] + (f" #{c['rank']}" if c.get("rank") else ""), c.get("reason") or ""]
               for c in cands],
              grey=[bool(c.get("reason")) for c in cands])


def _frontier(doc: dict[str, Any]) -> plots.Rendered:
    """Cost vs goodput of every candidate (the frontier: the most goodput for each cost), rejected
    ones grey and marked by their reason; documents without `candidates` show the ranked plans."""
    cands = [c for c in doc.get("candidates") or [] if c.get("cost_per_hour") is not None]
    fig, axes = plots.figure(1, 1, width=10.0 if cands else 8.0, height=4.4)
    ax = axes[0, 0]
    plans = {p["rank"]: p for p in doc["plans"]}
    key = "capacity_rps" if cands else None
    seen: set[str] = set()
    for c in cands:
        if c["verdict"] == "ranked" and c.get("rank") in plans:
            continue
        marker, label = VERDICT_LOOK.get(c["verdict"], ("o", c["verdict"]))
        ax.plot(c["cost_per_hour"], c["capacity_rps"], marker, ms=6, color=plots.GREY, alpha=0.9,
                mfc="none" if c.get("goodput_source") != "simulated" else plots.GREY,
                label=None if label in seen else label)
        seen.add(label)
    for p in doc["plans"]:
        c = next((c for c in cands if c.get("rank") == p["rank"]), None)
        y = c["capacity_rps"] if c is not None and key else p["predicted"]["goodput_rps"]
        ax.plot(p["cost_per_hour"], y, "o", ms=9, color=f"C{(p['rank'] - 1) % 10}",
                label=f"#{p['rank']} {p['kind']} ({p['gpus']} GPUs)")
        ax.annotate(f"#{p['rank']}", (p["cost_per_hour"], y), xytext=(7, -3 + 9 * (p["rank"] - 1)),
                    textcoords="offset points", fontsize=8)
    if cands:
        front, best = [], -1.0
        for c in sorted(cands, key=lambda c: (c["cost_per_hour"], -c["capacity_rps"])):
            if c["capacity_rps"] > best:
                best = c["capacity_rps"]
                front.append((c["cost_per_hour"], best))
        ax.step([x for x, _ in front], [y for _, y in front], where="post", color="black", lw=0.8, alpha=0.6,
                label="frontier: most goodput for the cost")
        ax.set_ylabel("sustainable goodput within the SLO (req/s)")
    else:
        ax.set_ylabel("goodput within the SLO (req/s)")
    ax.axhline(doc["workload"]["rate_rps"], color="#c62828", ls="--", lw=1, label="target rate")
    ax.set_xlabel("cost with spares ($/h)")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside right center", fontsize=7)
    return plots.render(fig, "frontier", "Cost vs goodput of every candidate the planner evaluated: serving replicas "
                                         "x goodput per replica (filled: measured in simulation, hollow: estimated); "
                                         "coloured: the ranked plans, grey: rejected, marked by the reason")


SWEEP_LOOK = {True: ("o", "#2ca02c", "met the SLO"), False: ("X", "#d62728", "missed the SLO"),
              None: ("o", plots.GREY, "sized, not simulated")}


def _pd(doc: dict[str, Any], pd: list[dict[str, Any]]) -> plots.Rendered:
    sweep = doc.get("pd_sweep") or []
    ncols = (1 if pd else 0) + (2 if sweep else 0)
    fig, axes = plots.figure(1, ncols, width=min(12.0, 4.2 * ncols + 1.0), height=3.6)
    if pd:
        _pd_sizing(axes[0, 0], pd)
    if sweep:
        _pd_sweep(axes[0, ncols - 2], axes[0, ncols - 1], sweep, doc["slo"]["attainment"])
    return plots.render(fig, "pd-ratio", "P:D ratio: the work each phase needs vs the replicas planned, and every "
                                         "prefill:decode replica count the planner tried with its outcome")


def _pd_sizing(ax: Any, pd: list[dict[str, Any]]) -> None:
    labels, load, serving, total = [], [], [], []
    for p in pd:
        for role in ("prefill", "decode"):
            h = p["headroom"].get(role)
            if h is None:
                continue
            labels.append(f"#{p['rank']} {role}")
            load.append(h["load_replicas"])
            serving.append(h["serving"])
            total.append(next((q["replicas"] for q in p["pools"] if q["role"] == role), h["serving"]))
    x = list(range(len(labels)))
    ax.bar([i - 0.27 for i in x], load, width=0.27, label="load (replicas of work)")
    ax.bar(x, serving, width=0.27, label="serving replicas")
    ax.bar([i + 0.27 for i in x], total, width=0.27, label="with failure/upgrade spares", color=plots.GREY)
    ax.set_xticks(x, labels, rotation=20, ha="right")
    ax.set_ylabel("load and serving (replicas)")
    ax.set_title("P:D sizing: " + ", ".join(f"#{p['rank']} {p['pd_ratio']}" for p in pd))
    ax.legend(loc="upper right")


def sweep_refs(sweep: list[dict[str, Any]]) -> dict[str, str]:
    """Short names (PD1, PD2, ...) of the candidates in the sweep, in order of first appearance."""
    refs: dict[str, str] = {}
    for s in sweep:
        refs.setdefault(s["candidate"], "split" if s["stage"] == "equal-cost split" else f"PD{len(refs) + 1}")
    return refs


def _pd_sweep(grid: Any, bars: Any, sweep: list[dict[str, Any]], required: float) -> None:
    """Left: each (prefill, decode) replica count tried, by outcome (x n: tried n times); right:
    attainment per simulated run."""
    seen: set[str] = set()
    groups: dict[tuple[int, int, object, bool], int] = {}
    for s in sweep:
        k = (s["prefill"], s["decode"], s.get("passed"), s["stage"] == "equal-cost split")
        groups[k] = groups.get(k, 0) + 1
    for (pre, dec, passed, split), n in groups.items():
        marker, color, label = SWEEP_LOOK[passed]  # type: ignore[index]
        if split:
            marker, label = "D", f"equal-cost split ({label})"
        dx = {None: -0.15, True: 0.0, False: 0.15}[passed] if not split else 0.0  # type: ignore[index]
        grid.plot(pre + dx, dec, marker, ms=8, color=color, alpha=0.85, mfc="none" if passed is None else color,
                  label=None if label in seen else label)
        if n > 1:
            grid.annotate(f"x{n}", (pre + dx, dec), xytext=(5, 5), textcoords="offset points", fontsize=7)
        seen.add(label)
    top = max(max(s["prefill"], s["decode"]) for s in sweep) + 1
    grid.set_xlim(0, top)
    grid.set_ylim(0, top)
    grid.set_xlabel("prefill (replicas)")
    grid.set_ylabel("decode (replicas)")
    grid.set_title("P:D tried (every PD candidate)")
    grid.legend(loc="upper right", fontsize=7)
    refs = sweep_refs(sweep)
    runs = [s for s in sweep if s.get("attainment") is not None]
    names = [f"{refs[s['candidate']]} {s['ratio']} {_stage_short(s['stage'])}" for s in runs]
    bars.barh(range(len(runs)), [s["attainment"] * plots.PCT for s in runs],
              color=[SWEEP_LOOK[s.get("passed")][1] for s in runs])
    bars.set_yticks(range(len(runs)), names, fontsize=7)
    bars.invert_yaxis()
    bars.axvline(required * plots.PCT, color="#c62828", ls="--", lw=1)
    bars.set_xlim(0, plots.PCT * 1.02)
    bars.set_xlabel("SLO attainment in simulation (%)")
    bars.set_title(f"P:D runs (dashed: {required:.0%} required)")


def _sweep_table(sec: Section, sweep: list[dict[str, Any]]) -> None:
    refs = sweep_refs(sweep)
    outcome = {True: "met the SLO", False: "missed the SLO", None: "sized, not simulated"}
    sec.table(["ref", "candidate", "stage", "P:D", "rate (req/s)", "attainment", "TTFT p99 (ms)", "TPOT p99 (ms)",
               "outcome"],
              [[refs[s["candidate"]], s["candidate"], s["stage"], s["ratio"], s["rate_rps"],
                "" if s["attainment"] is None else f"{s['attainment']:.1%}",
                "" if s["ttft_p99_s"] is None else s["ttft_p99_s"] * plots.MS,
                "" if s["tpot_p99_s"] is None else s["tpot_p99_s"] * plots.MS, outcome[s.get("passed")]]
               for s in sweep])


def _stage_short(stage: str) -> str:
    return {"confirmed at peak": "at peak", "missed at peak": "at peak", "equal-cost split": "equal cost"}.get(
        stage, stage.replace("full plan at target rate", "full plan"))


def _disaggregation(dg: dict[str, Any]) -> plots.Rendered:
    c, d = dg["colocated"], dg["disaggregated"]
    kv = float((dg.get("terms") or {}).get("kv_transfer_p99_s") or 0.0)
    fig, axes = plots.figure(1, 3, height=3.0)
    names = ["colocated", "disaggregated"]
    colors = ["#9aa0ab", "C0"]
    ms = plots.MS
    axes[0, 0].bar(names, [c["tpot_p99_s"] * ms, d["tpot_p99_s"] * ms], color=colors)
    axes[0, 0].set_title("interference removed")
    axes[0, 0].set_ylabel("TPOT p99 (ms)")
    axes[0, 1].bar(names, [c["ttft_p99_s"] * ms, max(d["ttft_p99_s"] - kv, 0.0) * ms], color=colors,
                   label="TTFT p99 without transfer")
    axes[0, 1].bar(["disaggregated"], [kv * ms], bottom=[max(d["ttft_p99_s"] - kv, 0.0) * ms], color="#ff7f0e",
                   label="KV transfer p99")
    axes[0, 1].set_title("transfer cost added")
    axes[0, 1].set_ylabel("TTFT p99 (ms)")
    axes[0, 1].legend(loc="upper left")
    axes[0, 2].bar(names, [c["goodput_rps"], d["goodput_rps"]], color=colors)
    axes[0, 2].set_title("at equal cost")
    axes[0, 2].set_ylabel("goodput (req/s)")
    for ax, key in ((axes[0, 2], None),):
        for i, v in enumerate((c, d)):
            ax.annotate(f"{v['slo_attainment']:.1%} attain.", (i, v["goodput_rps"]), ha="center", xytext=(0, 3),
                        textcoords="offset points", fontsize=7)
        del key
    return plots.render(fig, "disaggregation", "Disaggregation verdict: decode interference removed vs KV transfer "
                                               "cost added, colocated vs PD on the same GPUs")
