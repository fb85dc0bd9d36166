"""Every candidate the search evaluated, and every P:D ratio it tried, as plan-document records.

Owns `candidate_records(search)` (the document's `candidates`: each fleet with its cost per
hour, its goodput at the target rate and its estimated sustainable goodput, the verdict and the
reason) and `pd_sweep(search)` (the document's `pd_sweep`: each prefill:decode replica count a
PD candidate was sized to or run at, with the outcome). Reads the phases' results; decides
nothing.

Goodput sources: `simulated` (mean over the seeds at the target rate, all replicas),
`estimated` (the per-replica goodput measured in the simulator times the serving replicas,
capped at the target rate) and `analytical` (a colocated layout the goodput phase did not
simulate: the latency phase's per-replica capacity times the replicas it would need).
"""

from __future__ import annotations

from typing import Any

from fleetwise.planner.goodput import analytical_sizing
from fleetwise.planner.simulate import FleetShape, SimVerdict
from fleetwise.planner.sizing import fleet_cost, spares
from fleetwise.planner.state import Candidate, Search

VERDICTS = ("ranked", "demoted", "missed_slo", "over_limits", "not_checked", "not_refined", "not_simulated")
"""A candidate's verdict: ranked (meets the SLO), demoted (meets it, a PD claim failed), missed
the SLO in simulation, over the GPU limits, not checked (meets the SLO, but could not be
reported whatever its headroom and claims gave, so they were not simulated), not refined
(costlier than those refined), not simulated (a colocated layout whose analytical fleet at the
target rate cost more than the best ones')."""


def _r(x: float, nd: int = 4) -> float:
    return round(float(x), nd)


def _ratio(fleet: FleetShape) -> str | None:
    if not fleet.disaggregated:
        return None
    return f"{fleet.pool('prefill').replicas}:{fleet.pool('decode').replicas}"


def _capacity(c: Candidate, serving: FleetShape) -> float:
    """Requests/s the serving replicas sustain within the SLO: the slowest pool's replicas times
    its measured per-replica goodput."""
    return min(serving.pool(role).replicas * s.goodput_per_replica_rps for role, s in c.sizings.items())


def _verdict(search: Search, c: Candidate) -> tuple[str, int | None]:
    if c in search.ranked:
        i = search.ranked.index(c)
        return ("demoted" if c.demoted else "ranked"), (i + 1 if i < search.ranked_exact else None)
    if c in search.unchecked:
        return "not_checked", None
    if c in search.refined:
        return ("missed_slo" if c.refined is None or not c.refined.passed else "over_limits"), None
    if c in search.candidates:
        return "not_refined", None
    return "over_limits", None


def _record(search: Search, c: Candidate, reasons: dict[str, str]) -> dict[str, Any]:
    rate = search.spec.workload.rate_rps
    verdict, rank = _verdict(search, c)
    r = c.refined
    fleet = r.full if r is not None else c.fleet.with_replicas(
        **{p.role: p.replicas + spares(c.sizings).get(p.role, 0) for p in c.fleet.pools})
    capacity = _capacity(c, r.serving if r is not None else c.fleet)
    if r is not None and r.seeds:
        goodput, source = sum(v.goodput_rps for v in r.seeds) / len(r.seeds), "simulated"
    else:
        goodput, source = min(rate, capacity), "estimated"
    reason = reasons.get(c.key)
    if verdict in ("ranked", "demoted") and rank is not None and rank > search.top_k:
        reason = reason or f"meets the SLO; ranked #{rank}, beyond the {search.top_k} plans reported"
    elif verdict in ("ranked", "demoted") and rank is None:
        reason = reason or (f"meets the SLO; ranked beyond the {search.top_k} plans reported, below a plan whose "
                            "headroom was not simulated (its exact place is not known)")
    return {"candidate": c.key, "kind": c.kind, "fleet": fleet.label, "gpus": fleet.gpus,
            "pd_ratio": _ratio(fleet), "cost_per_hour": _r(c.cost_per_hour), "goodput_rps": _r(goodput),
            "capacity_rps": _r(capacity), "goodput_source": source, "verdict": verdict, "rank": rank,
            "reason": None if verdict == "ranked" and rank is not None and rank <= search.top_k else reason}


def _not_simulated(search: Search, reasons: dict[str, str]) -> list[dict[str, Any]]:
    """Colocated layouts the goodput phase left out, priced from their analytical capacity."""
    from fleetwise.planner.simulate import PoolShape

    w, out = search.spec.workload, []
    for lay, e in search.estimates.items():
        key = f"colocated {lay.label}"
        if key not in reasons or lay in search.shortlists.get("mixed", []) or e.mu_mixed_rps <= 0:
            continue
        s = analytical_sizing(search, e)
        fleet = FleetShape((PoolShape("mixed", lay, s.total),))
        capacity = s.serving * e.mu_mixed_rps
        out.append({"candidate": key, "kind": "colocated", "fleet": fleet.label, "gpus": fleet.gpus, "pd_ratio": None,
                    "cost_per_hour": _r(fleet_cost(search, fleet, {})), "goodput_rps": _r(min(w.rate_rps, capacity)),
                    "capacity_rps": _r(capacity), "goodput_source": "analytical", "verdict": "not_simulated",
                    "rank": None, "reason": reasons[key]})
    return out


def candidate_records(search: Search) -> list[dict[str, Any]]:
    """Every candidate evaluated, cheapest first: cost/h, goodput (and its source), verdict, reason."""
    reasons = {r.candidate: r.reason for r in search.rejected}
    out = [_record(search, c, reasons) for c in search.sized] + _not_simulated(search, reasons)
    return sorted(out, key=lambda d: (d["cost_per_hour"], d["candidate"]))


def _point(key: str, stage: str, fleet: FleetShape, v: SimVerdict | None, rate: float,
           goodput: float | None = None) -> dict[str, Any]:
    p, d = fleet.pool("prefill").replicas, fleet.pool("decode").replicas
    return {"candidate": key, "stage": stage, "prefill": p, "decode": d, "ratio": f"{p}:{d}", "rate_rps": _r(rate),
            "passed": None if v is None else v.passed,
            "attainment": None if v is None else _r(v.attainment),
            "goodput_rps": _r(v.goodput_rps if v is not None else goodput or 0.0),
            "ttft_p99_s": None if v is None else _r(v.ttft["p99"], 6),
            "tpot_p99_s": None if v is None else _r(v.tpot["p99"], 6)}


def pd_sweep(search: Search) -> list[dict[str, Any]]:
    """The P:D ratios tried per PD candidate: as sized (estimate at peak), each confirmation run
    at peak rate, the full plan (spares included) at the target rate; and the equal-cost split."""
    rate, peak = search.spec.workload.rate_rps, search.ctx.peak_rps
    out: list[dict[str, Any]] = []
    for c in search.sized:
        if not c.fleet.disaggregated:
            continue
        out.append(_point(c.key, "sized", c.fleet, None, peak, min(peak, _capacity(c, c.fleet))))
        r = c.refined
        if r is None:
            continue
        out += [_point(c.key, "confirmed at peak" if v.passed else "missed at peak", f, v, peak) for f, v in r.tried]
        for v in r.seeds:
            out.append(_point(c.key, f"full plan at target rate, seed {v.seed}", r.full, v, rate))
    dg = search.disaggregation or {}
    split, d = dg.get("pd_split"), dg.get("disaggregated")
    if isinstance(split, list) and isinstance(d, dict):
        out.append({"candidate": f"equal cost: {dg.get('equal_cost', '')}", "stage": "equal-cost split",
                    "prefill": split[0], "decode": split[1], "ratio": f"{split[0]}:{split[1]}", "rate_rps": _r(peak),
                    "passed": d.get("passed"),
                    "attainment": _r(d["slo_attainment"]), "goodput_rps": _r(d["goodput_rps"]),
                    "ttft_p99_s": _r(d["ttft_p99_s"], 6), "tpot_p99_s": _r(d["tpot_p99_s"], 6)})
    return out
