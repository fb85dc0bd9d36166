"""Report of a plan (`fleetwise plan --json`, schema `fleetwise-plan/1`).

The ranked table; each plan's decision steps with their numbers and its claims; the cost vs
goodput frontier (candidates the document scores but rejected greyed with their reason, and
every rejection listed); the P:D sizing of the PD plans (load vs serving replicas per phase, and
the document's P:D sweep when it carries one); and the disaggregation verdict's breakdown
(decode interference removed vs KV transfer cost added, at equal cost).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetwise.report import plots
from fleetwise.report.page import Page, Section
from fleetwise.report.registry import report_kind


@report_kind("fleetwise-plan/")
def build_from_file(path: Path | None, doc: dict[str, Any]) -> Page:
    return build(doc)


def _pools(p: dict[str, Any]) -> str:
    return " + ".join(f"{q['replicas']}x {q['role']} {q['accelerator']} {q['weight_dtype']} TP{q['tp']}"
                      f"{' PP' + str(q['pp']) if q['pp'] > 1 else ''}{' EP' + str(q['ep']) if q['ep'] > 1 else ''}"
                      for q in p["pools"])


def build(doc: dict[str, Any]) -> Page:
    """The report page of a plan document."""
    w, slo = doc["workload"], doc["slo"]
    with plots.style():
        page = Page(f"Plan: {doc['name']}",
                    f"{doc['model']} at {w['rate_rps']:g} req/s (burst x{w['burst_factor']:.2f}); SLO TTFT "
                    f"{slo['ttft_s']:g} s and TPOT {slo['tpot_s']:g} s at p{slo['percentile']} for "
                    f"{slo['attainment']:.0%} of requests")
        top = page.section("Answer")
        if doc.get("infeasible"):
            top.parts.append(f'<p class="fail">infeasible: {_esc(doc["infeasible"])}</p>')
        top.table(["prompt mean", "prompt p50", "prompt p99", "output mean", "output p99", "burst source"],
                  [[w["prompt_mean"], w["prompt_p50"], w["prompt_p99"], w["output_mean"], w["output_p99"],
                    w["burst_source"]]])
        if doc["plans"]:
            _ranked(top, doc["plans"])
            fr = page.section("Cost vs goodput")
            page.add_figure(fr, _frontier(doc))
        for p in doc["plans"]:
            sec = page.section(f"#{p['rank']} {p['kind']}")
            sec.text(f"{_pools(p)}: {p['gpus']} GPUs, ${p['cost_per_hour']:.2f}/h, "
                     f"${p['cost_per_1m_tokens']:.2f} per 1M output tokens"
                     + (f", P:D {p['pd_ratio']}" if p.get("pd_ratio") else ""))
            sec.heading("decision steps")
            sec.items(p["explanation"], ordered=True)
            if p.get("claims"):
                sec.heading("claims checked in simulation")
                sec.table(["claim", "holds", "evidence"],
                          [[c["claim"], "yes" if c["holds"] else "NO", c["evidence"]] for c in p["claims"]])
        pd = [p for p in doc["plans"] if p.get("pd_ratio")]
        if pd or doc.get("pd_sweep"):
            sec = page.section("P:D ratio")
            page.add_figure(sec, _pd(doc, pd))
        dg = doc.get("disaggregation")
        if dg:
            sec = page.section("Disaggregate or not")
            sec.parts.append(f"<p><b>{_esc(dg['verdict'])}</b>: {_esc(dg['reason'])}</p>")
            if dg.get("equal_cost"):
                sec.text(f"compared at equal cost: {dg['equal_cost']}")
            if dg.get("colocated") and dg.get("disaggregated"):
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
    rows = []
    for p in plans:
        pr = p["predicted"]
        lo, hi = pr["slo_attainment_ci95"]
        rows.append([p["rank"], p["kind"], _pools(p), p["gpus"], p["cost_per_hour"], p["cost_per_1m_tokens"],
                     round(pr["ttft_p99_s"] * 1e3), round(pr["tpot_p99_s"] * 1e3, 1), pr["goodput_rps"],
                     f"{pr['slo_attainment']:.1%} ({lo:.1%}-{hi:.1%})"])
    sec.table(["#", "kind", "pools", "GPUs", "$/h", "$/1M tok", "TTFT p99 ms", "TPOT p99 ms", "goodput req/s",
               "attainment (95% CI)"], rows)


def _frontier(doc: dict[str, Any]) -> plots.Rendered:
    fig, axes = plots.figure(1, 1, width=8.0, height=4.2)
    ax = axes[0, 0]
    for c in doc.get("candidates", []):  # every scored candidate, when the document lists them
        if c.get("cost_per_hour") is None or c.get("goodput_rps") is None:
            continue
        ok = not c.get("reason")
        ax.plot(c["cost_per_hour"], c["goodput_rps"], "o", color="C0" if ok else plots.GREY, ms=5, alpha=0.8)
        if not ok:
            ax.annotate(str(c["reason"])[:40], (c["cost_per_hour"], c["goodput_rps"]), fontsize=6,
                        color="#8a90a0", xytext=(3, -8), textcoords="offset points")
    pts = sorted((p["cost_per_hour"], p["predicted"]["goodput_rps"], p) for p in doc["plans"]) if doc["plans"] else []
    for i, (x, y, p) in enumerate(pts):
        ax.plot(x, y, "o", ms=8, color=f"C{(p['rank'] - 1) % 10}", label=f"#{p['rank']} {p['kind']} ({p['gpus']} GPUs)")
        ax.annotate(f"#{p['rank']}", (x, y), xytext=(5, 4 + 6 * (i % 2)), textcoords="offset points")
    ax.axhline(doc["workload"]["rate_rps"], color="#c62828", ls="--", lw=1, label="target rate")
    ax.set_xlabel("cost ($/h)")
    ax.set_ylabel("goodput (req/s meeting the SLO)")
    ax.legend(loc="lower right")
    return plots.render(fig, "frontier", "Cost vs goodput of the ranked plans (grey: candidates rejected, with "
                                         "their reason); dashed: the target rate")


def _pd(doc: dict[str, Any], pd: list[dict[str, Any]]) -> plots.Rendered:
    sweep = doc.get("pd_sweep") or []
    fig, axes = plots.figure(1, 2 if sweep else 1, width=10.0 if sweep else 7.0, height=3.4)
    ax = axes[0, 0]
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
    ax.set_ylabel("replicas")
    ax.set_title("P:D sizing of the PD plans: " + ", ".join(f"#{p['rank']} {p['pd_ratio']}" for p in pd))
    ax.legend(loc="upper right")
    if sweep:
        ax2 = axes[0, 1]
        xs = [str(s.get("ratio", "")) for s in sweep]
        ax2.plot(xs, [s.get("goodput_rps", 0.0) for s in sweep], "o-", label="goodput req/s")
        ax2.set_xlabel("P:D")
        ax2.set_ylabel("goodput (req/s)")
        ax2.set_title("P:D sweep")
    return plots.render(fig, "pd-ratio", "P:D ratio: the work each phase needs (replicas at the target load) vs the "
                                         "replicas planned")


def _disaggregation(dg: dict[str, Any]) -> plots.Rendered:
    c, d = dg["colocated"], dg["disaggregated"]
    kv = float((dg.get("terms") or {}).get("kv_transfer_p99_s") or 0.0)
    fig, axes = plots.figure(1, 3, height=3.0)
    names = ["colocated", "disaggregated"]
    colors = ["#9aa0ab", "C0"]
    axes[0, 0].bar(names, [c["tpot_p99_s"] * 1e3, d["tpot_p99_s"] * 1e3], color=colors)
    axes[0, 0].set_title("interference removed: TPOT p99 (ms)")
    axes[0, 1].bar(names, [c["ttft_p99_s"] * 1e3, max(d["ttft_p99_s"] - kv, 0.0) * 1e3], color=colors,
                   label="TTFT p99 without transfer")
    axes[0, 1].bar(["disaggregated"], [kv * 1e3], bottom=[max(d["ttft_p99_s"] - kv, 0.0) * 1e3], color="#ff7f0e",
                   label="KV transfer p99")
    axes[0, 1].set_title("transfer cost added: TTFT p99 (ms)")
    axes[0, 1].legend(loc="upper left")
    axes[0, 2].bar(names, [c["goodput_rps"], d["goodput_rps"]], color=colors)
    axes[0, 2].set_title("goodput at equal cost (req/s)")
    for ax, key in ((axes[0, 2], None),):
        for i, v in enumerate((c, d)):
            ax.annotate(f"{v['slo_attainment']:.1%} attain.", (i, v["goodput_rps"]), ha="center", xytext=(0, 3),
                        textcoords="offset points", fontsize=7)
        del key
    return plots.render(fig, "disaggregation", "Disaggregation verdict: decode interference removed vs KV transfer "
                                               "cost added, colocated vs PD on the same GPUs")
