"""A plan document (schema `fleetwise-plan/1`) as text: the terminal report and the lines every
rendering of a plan shares.

Owns how a plan reads in words: the pools of a plan, its attainment with the interval, the SLO
it was held to, the GPU prices it was costed at and where the perf model is uncalibrated.
`render(doc, console)` prints the terminal report; `plan_report` (the HTML page) uses the same
lines, so the terminal, the page and the JSON say the same thing.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fleetwise.report.page import num


def pools_label(p: dict[str, Any], sep: str = " + ") -> str:
    """`2x prefill h200-sxm bf16 TP4 + 3x decode ...` of one plan's pools."""
    return sep.join(f"{q['replicas']}x {q['role']} {q['accelerator']} {q['weight_dtype']} TP{q['tp']}"
                    f"{' PP' + str(q['pp']) if q['pp'] > 1 else ''}{' EP' + str(q['ep']) if q['ep'] > 1 else ''}"
                    for q in p["pools"])


def attainment_text(predicted: dict[str, Any]) -> str:
    """`99.2% (98.1%-100.0%)`: the mean SLO attainment over seeds with its 95% interval."""
    lo, hi = predicted["slo_attainment_ci95"]
    return f"{predicted['slo_attainment']:.1%} ({lo:.1%}-{hi:.1%})"


def slo_line(doc: dict[str, Any]) -> str:
    """The SLO every plan was held to, in the units the tables use (ms)."""
    slo = doc["slo"]
    return (f"SLO held to: TTFT {slo['ttft_s'] * 1e3:.0f} ms and TPOT {slo['tpot_s'] * 1e3:.0f} ms at "
            f"p{slo['percentile']}, met by {slo['attainment']:.0%} of requests")


def price_lines(doc: dict[str, Any]) -> list[str]:
    """One line per accelerator: the price per GPU-hour the plan was costed at and its source."""
    return [f"{name}: ${p['usd_per_gpu_hour']:.2f} per GPU-hour ({p['source']})"
            for name, p in (doc.get("prices") or {}).items()]


def calibration_lines(doc: dict[str, Any]) -> list[str]:
    """Which profile priced the steps and, per accelerator and figure, where it is uncalibrated."""
    cal = doc.get("calibration")
    if not cal:
        return []
    if cal["profile"]:
        fit = cal.get("fit") or {}
        stat = (f", fitted to median {fit['median_abs_pct']:.3g}% / max {fit['max_abs_pct']:.3g}% error"
                if "median_abs_pct" in fit and "max_abs_pct" in fit else "")
        head = f"perf profile {cal['profile']} (measured on {cal['profile_accelerator']}{stat})"
    else:
        head = "perf factors: the defaults (no profile given)"
    out = [head]
    for u in cal["uncalibrated"]:
        out.append(f"uncalibrated on {u['accelerator']}, {u['figure']}: {u['factors']} ({u['reason']}); "
                   f"{u['why_it_matters']}")
    if cal["uncalibrated"]:
        out.append(f"for comparison, {cal['calibrated_accuracy']}; to calibrate: {cal['fix']}")
    return out


def render(doc: dict[str, Any], console: Console) -> None:
    """A readable report of a plan document: what it was held to, the ranked table, each plan's
    reasoning, the PD verdict, the rejections."""
    w = doc["workload"]
    console.print(f"[bold]fleetwise plan[/bold] {escape(doc['name'])}: {doc['model']} at {w['rate_rps']:g} req/s "
                  f"(burst x{w['burst_factor']:.2f}), prompts mean {w['prompt_mean']:.0f} / p99 {w['prompt_p99']:.0f} "
                  f"tokens, outputs mean {w['output_mean']:.0f} tokens")
    console.print(slo_line(doc), highlight=False)
    for line in price_lines(doc):
        console.print(f"price {escape(line)}", highlight=False)
    for line in calibration_lines(doc):
        console.print(escape(line), highlight=False)
    if doc["infeasible"]:
        console.print(f"[bold red]infeasible:[/bold red] {escape(doc['infeasible'])}")
    if doc["plans"]:
        console.print(_table(doc["plans"]))
        for p in doc["plans"]:  # D: ranked below every plan whose claims hold, and why
            if p.get("demoted"):
                console.print(f"  D #{p['rank']} {escape(p['demoted'])}", highlight=False)
    for p in doc["plans"]:
        console.print(f"\n[bold]#{p['rank']} {p['kind']}[/bold] ({p['gpus']} GPUs, ${p['cost_per_hour']:.2f}/h)")
        for i, line in enumerate(p["explanation"], 1):
            console.print(f"  {i}. {escape(line)}", highlight=False)
        for cl in p.get("claims", []):
            mark = "[green]holds[/green]" if cl["holds"] else "[red]fails[/red]"
            console.print(f"  claim: {escape(str(cl['claim']))}: {mark} ({escape(str(cl['evidence']))})", highlight=False)
    if doc["disaggregation"]:
        dg = doc["disaggregation"]
        console.print(f"\n[bold]disaggregate or not:[/bold] {dg['verdict']}: {escape(dg['reason'])}", highlight=False)
        for k, v in (dg.get("terms") or {}).items():
            console.print(f"  {k}: {escape(str(v))}", highlight=False)
    if doc["rejected"]:
        console.print(f"\n[bold]rejected[/bold] ({len(doc['rejected'])}):")
        for r in doc["rejected"]:
            console.print(f"  - {escape(r['candidate'])}: {escape(r['reason'])}", highlight=False)
    s = doc["search"]
    console.print(f"\n{s['layouts_estimated']} layouts estimated, {s['candidates_sized']} candidates sized, "
                  f"{s['simulations']} simulations in {s['wall_s']:.1f} s")


TABLE_COLUMNS = ("#", "pools", "GPUs", "$/h", "$/1M output tok", "TTFT p99 (ms)", "TPOT p99 (ms)",
                 "goodput (req/s)", "attainment (95% CI)")
"""The ranked table's columns, each with its unit (shared by the terminal and the HTML page)."""


def table_rows(plans: list[dict[str, Any]], sep: str = " + ") -> list[list[str]]:
    """The ranked table's rows (TABLE_COLUMNS), numbers formatted to at most 4 significant digits; a
    demoted plan's rank carries D (its claim that failed is printed under the table)."""
    return [[f"{p['rank']} D" if p.get("demoted") else str(p["rank"]), pools_label(p, sep), str(p["gpus"]), num(p["cost_per_hour"]),
             num(p["cost_per_1m_tokens"]), num(p["predicted"]["ttft_p99_s"] * 1e3),
             num(p["predicted"]["tpot_p99_s"] * 1e3), num(p["predicted"]["goodput_rps"]),
             attainment_text(p["predicted"])] for p in plans]


def _table(plans: list[dict[str, Any]]) -> Table:
    t = Table(title="ranked plans (cheapest meeting the SLO first)")
    for col in TABLE_COLUMNS:
        t.add_column(col, justify="left" if col == "pools" else "right")
    for row in table_rows(plans, "\n"):
        t.add_row(*(escape(c) for c in row))
    return t
