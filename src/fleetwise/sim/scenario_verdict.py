"""Across-seed statistics of a scenarios document (`aggregate`) and the pass rule (`pass_rule`):
the default policy beats round-robin on P99 TTFT (95% CI of the paired difference below zero)
in the TTFT-rule scenarios, and keeps at least 95% of its goodput everywhere."""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetwise.routing.registry import DEFAULT_POLICY
from fleetwise.sim.scenario_constants import BASELINE, GOODPUT_TOLERANCE, METRICS, TTFT_RULE_SCENARIOS
from fleetwise.sim.scenario_stats import mean_ci, paired_ci


def aggregate(doc: dict[str, Any]) -> dict[str, Any]:
    """Per scenario and policy: each metric's mean and 95% CI over seeds, and the paired
    difference against round-robin (`vs_baseline`: policy minus round-robin, same seeds)."""
    base = doc.get("baseline_policy", BASELINE)
    out: dict[str, Any] = {}
    for name, by_pol in doc["scenarios"].items():
        out[name] = {}
        ref = _by_seed(by_pol.get(base, []))
        for pol, runs in by_pol.items():
            mine = _by_seed(runs)
            # A figure a seed leaves undefined (None: TPOT of one-token outputs only) is left out.
            st: dict[str, Any] = {m: mean_ci([r[m] for r in mine.values() if r[m] is not None]).to_dict()
                                  for m in METRICS}
            common = sorted(set(mine) & set(ref))
            if pol != base and common:
                st["vs_baseline"] = {m: paired_ci(*_defined_pairs(mine, ref, common, m)).to_dict() for m in METRICS}
                g_ref = np.mean([ref[k]["goodput_rps"] for k in common])
                g = np.mean([mine[k]["goodput_rps"] for k in common])
                st["goodput_ratio"] = round(float(g / g_ref), 6) if g_ref > 0 else None
            out[name][pol] = st
    return out


def _defined_pairs(mine: dict[int, dict[str, Any]], ref: dict[int, dict[str, Any]], seeds: list[int],
                   metric: str) -> tuple[list[float], list[float]]:
    """`metric` of both policies on the seeds where both define it."""
    pairs = [(mine[k][metric], ref[k][metric]) for k in seeds
             if mine[k][metric] is not None and ref[k][metric] is not None]
    return [a for a, _ in pairs], [b for _, b in pairs]


def _by_seed(runs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {int(r["seed"]): r for r in runs}


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def pass_rule(doc: dict[str, Any], default_policy: str | None = None) -> list[str]:
    """Verdict lines (`PASS ...`, `FAIL ...` or `SKIP ...`) of the pass rule on a results document.

    For each scenario present: in `TTFT_RULE_SCENARIOS` the paired P99 TTFT difference (default
    minus round-robin) must have its whole 95% CI below zero; in every scenario the default's mean
    goodput must be at least `1 - GOODPUT_TOLERANCE` times round-robin's (means over the common seeds).
    """
    dflt = default_policy or doc.get("default_policy", DEFAULT_POLICY)
    base = doc.get("baseline_policy", BASELINE)
    lines = []
    for name, by_pol in doc["scenarios"].items():
        if dflt not in by_pol or base not in by_pol:
            lines.append(f"SKIP {name}: needs both {dflt} and {base} runs")
            continue
        mine, ref = _by_seed(by_pol[dflt]), _by_seed(by_pol[base])
        common = sorted(set(mine) & set(ref))
        if not common:
            lines.append(f"SKIP {name}: no seed run by both {dflt} and {base}")
            continue
        if name in TTFT_RULE_SCENARIOS:
            d = paired_ci([mine[k]["ttft_p99_s"] for k in common], [ref[k]["ttft_p99_s"] for k in common])
            ok = d.hi is not None and d.hi < 0
            lines.append(
                f"{'PASS' if ok else 'FAIL'} {name}: P99 TTFT {dflt} - {base} = {d.mean:+.3f} s "
                f"[95% CI {_fmt(d.lo)}, {_fmt(d.hi)}] over {d.n} seeds"
                + ("" if ok else (" (CI undefined: need 2+ seeds)" if d.hi is None else " (CI does not exclude zero)"
                                  if d.mean < 0 else " (not better)")))
        g = float(np.mean([mine[k]["goodput_rps"] for k in common]))
        g_ref = float(np.mean([ref[k]["goodput_rps"] for k in common]))
        ratio = g / g_ref if g_ref > 0 else (1.0 if g >= g_ref else 0.0)
        ok = ratio >= 1 - GOODPUT_TOLERANCE
        lines.append(f"{'PASS' if ok else 'FAIL'} {name}: goodput {dflt} {g:.3f} vs {base} {g_ref:.3f} req/s "
                     f"({(ratio - 1) * 100:+.1f}%, floor -{GOODPUT_TOLERANCE * 100:.0f}%)")
    return lines


# ---- rendering -------------------------------------------------------------------------------
