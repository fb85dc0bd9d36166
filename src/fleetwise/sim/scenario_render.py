"""Rendering a scenarios document: table rows (for the CLI's rich table) and Markdown."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Row:
    """One line of the results table (scenario x policy), every figure already formatted."""

    scenario: str
    policy: str
    cells: dict[str, str] = field(default_factory=dict)


TABLE_COLUMNS = ("TTFT p50 s", "TTFT p99 s", "dP99 vs RR s", "TPOT p99 ms", "goodput rps", "dGoodput", "SLO att.")


def _ci(st: dict[str, Any], scale: float = 1.0, digits: int = 3) -> str:
    m, lo, hi = st["mean"], st["ci95_lo"], st["ci95_hi"]
    if m is None:  # no seed defines it (TPOT of one-token outputs only)
        return "n/a"
    if lo is None or hi is None:
        return f"{m * scale:.{digits}f}"
    return f"{m * scale:.{digits}f} ±{(hi - lo) / 2 * scale:.{digits}f}"


def _interval(st: dict[str, Any]) -> str:
    lo, hi = st["ci95_lo"], st["ci95_hi"]
    ci = f" [{lo:+.3f}, {hi:+.3f}]" if lo is not None and hi is not None else ""
    return f"{st['mean']:+.3f}{ci}"


def table_rows(doc: dict[str, Any]) -> list[Row]:
    """The summary table: per scenario and policy, means ± CI half-widths and paired deltas."""
    rows = []
    for name, by_pol in doc["stats"].items():
        for pol, st in by_pol.items():
            vs = st.get("vs_baseline")
            ratio = st.get("goodput_ratio")
            rows.append(Row(name, pol, {
                "TTFT p50 s": _ci(st["ttft_p50_s"]),
                "TTFT p99 s": _ci(st["ttft_p99_s"]),
                "dP99 vs RR s": _interval(vs["ttft_p99_s"]) if vs else "-",
                "TPOT p99 ms": _ci(st["tpot_p99_s"], 1e3, 1),
                "goodput rps": _ci(st["goodput_rps"], 1.0, 2),
                "dGoodput": f"{(ratio - 1) * 100:+.1f}%" if ratio is not None else "-",
                "SLO att.": _ci(st["slo_attainment"], 100.0, 1) + "%",
            }))
    return rows


def render_markdown(doc: dict[str, Any]) -> str:
    """`scenarios.md`: the summary table, per-replica detail of seed 0, and the verdicts."""
    seeds = len(doc.get("seeds", []))
    out = [
        "# fleetwise scenarios",
        "",
        f"Default policy `{doc['default_policy']}` vs `{doc['baseline_policy']}`; {seeds} seeds"
        f"{' (small scenarios)' if doc.get('small') else ''}. Figures are means over seeds ± the half-width of "
        "the 95% t-interval; `dP99 vs RR` is the paired difference policy minus round-robin [95% CI] "
        "(negative = faster than round-robin); `dGoodput` is the ratio of mean goodputs minus 1.",
        "",
        "| scenario | policy | " + " | ".join(TABLE_COLUMNS) + " |",
        "|---|---|" + "---|" * len(TABLE_COLUMNS),
    ]
    for r in table_rows(doc):
        out.append(f"| {r.scenario} | {r.policy} | " + " | ".join(r.cells[c] for c in TABLE_COLUMNS) + " |")
    out += ["", "## Verdicts", ""] + [f"- {v}" for v in doc["verdicts"]]
    out += _variant_tables(doc)
    out += ["", "## Per replica (seed 0)", ""]
    for name, by_pol in doc["scenarios"].items():
        info = doc.get("info", {}).get(name, {})
        out += [f"### {name}", "", info.get("description", ""), ""]
        for note in info.get("notes", []):
            out.append(f"> note: {note}")
        out += ["| policy | replica | accelerator | requests | prefix hit | TTFT p50 s | TTFT p99 s | queue mean/max |",
                "|---|---|---|---|---|---|---|---|"]
        for pol, runs in by_pol.items():
            if not runs:
                continue
            for rep in runs[0]["per_replica"]:
                out.append(f"| {pol} | {rep['name']} | {rep['accelerator']} | {rep['requests']} | "
                           f"{rep['prefix_hit_rate']:.1%} | {rep['ttft_p50_s']:.3f} | {rep['ttft_p99_s']:.3f} | "
                           f"{rep['queue_mean']:.1f}/{rep['queue_max']} |")
        out.append("")
        for pol, runs in by_pol.items():
            if runs:
                reasons = ", ".join(f"{k} {v}" for k, v in (runs[0]["router"].get("by_reason") or {}).items())
                out.append(f"- {pol} selection reasons: {reasons}")
        out.append("")
        out += _tenant_table(by_pol)
    return "\n".join(out).rstrip() + "\n"


def _ms_or_na(x: float | None) -> str:
    """Seconds as ms with one decimal; `n/a` for an undefined figure (TPOT of one-token outputs only)."""
    return "n/a" if x is None else f"{x * 1e3:.1f}"


def _tenant_table(by_pol: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Per-tenant latency of seed 0 for every policy (only when the scenario has 2+ tenants)."""
    runs = {pol: r[0].get("per_tenant") or {} for pol, r in by_pol.items() if r}
    if not runs or max(len(t) for t in runs.values()) < 2:
        return []
    out = ["| policy | tenant | requests | completed | TTFT p50 s | TTFT p99 s | TPOT p99 ms | E2E p50 s |",
           "|---|---|---|---|---|---|---|---|"]
    for pol, tenants in runs.items():
        for t, v in tenants.items():
            out.append(f"| {pol} | {t} | {v['requests']} | {v['completed']} | {v['ttft_p50_s']:.3f} | "
                       f"{v['ttft_p99_s']:.3f} | {_ms_or_na(v['tpot_p99_s'])} | {v['e2e_p50_s']:.3f} |")
    return out + [""]


def _variant_tables(doc: dict[str, Any]) -> list[str]:
    """Per scenario with variants: the default policy, each variant and round-robin side by side,
    with each run's safe-mode action, time in safe mode and rejected requests (means over seeds)."""
    out: list[str] = []
    for name, variants in (doc.get("variants") or {}).items():
        runs, stats = doc["scenarios"][name], doc["stats"][name]
        labels = [doc["default_policy"], *variants, doc["baseline_policy"]]
        out += ["", f"## {name}: variants side by side", "",
                "| run | routing | safe mode | time in safe mode s | rejected | TTFT p99 s | dP99 vs RR s | "
                "goodput rps | dGoodput | SLO att. |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for label in labels:
            if not runs.get(label):
                continue
            st, vs, ratio = stats[label], stats[label].get("vs_baseline"), stats[label].get("goodput_ratio")
            sm = [r["router"].get("safe_mode") or {} for r in runs[label]]
            action = sm[0].get("action", "-") if sm[0].get("enabled", False) else "off"
            t_safe = sum(x.get("time_s", 0.0) for x in sm) / len(sm)
            rejected = sum(r["router"].get("rejected") or 0 for r in runs[label]) / len(runs[label])
            routing = variants.get(label)
            changed = {k: v for k, v in (routing or {}).items() if k != "policy" or v != doc["default_policy"]}
            desc = ", ".join(f"{k}={v}" for k, v in _flat(changed)) if routing else label
            out.append(f"| {label} | {desc} | {action} | {t_safe:.1f} | {rejected:.0f} | {_ci(st['ttft_p99_s'])} | "
                       f"{_interval(vs['ttft_p99_s']) if vs else '-'} | {_ci(st['goodput_rps'], 1.0, 2)} | "
                       f"{f'{(ratio - 1) * 100:+.1f}%' if ratio is not None else '-'} | "
                       f"{_ci(st['slo_attainment'], 100.0, 1)}% |")
    return out


def _flat(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """`{"safe_mode": {"action": "reject"}}` -> `[("safe_mode.action", "reject")]`."""
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        out += _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return out
