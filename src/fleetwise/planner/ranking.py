"""Phase 7, ranking: cost per hour among plans meeting the SLO on every seed, then goodput.

Owns the final order (a plan whose claims failed, or whose headroom still missed, goes below every
plan whose claims and headroom hold), the
reason each plan that missed the SLO is rejected, reconciling the equal-cost verdict with the
cheapest plan, and the infeasible answer when nothing passes.
"""

from __future__ import annotations

from fleetwise.planner.layout import Rejection
from fleetwise.planner.simulate import SimVerdict
from fleetwise.planner.sizing import gpus_by_accelerator, over_limits, spares
from fleetwise.planner.state import Candidate, Search

RankKey = tuple[bool, float, float, str]


def rank_key(c: Candidate) -> RankKey:
    """A plan's place: demoted last (a failed claim, or a headroom term still missed after the
    replicas it may add), then $/h, then more goodput over the seeds, then its name. Before its
    headroom and claims are checked it is a lower bound (they only add cost or demote)."""
    return (c.demoted is not None, c.cost_per_hour,
            -_mean(c.refined.seeds, "goodput_rps") if c.refined else 0.0, c.key)


def run(search: Search) -> None:
    """Order the refined plans; reject the ones that missed the SLO; say infeasible when none passed."""
    unchecked = {c.key for c in search.unchecked}
    good = []
    for c in search.refined:
        r = c.refined
        assert r is not None
        if c.key in unchecked:
            continue
        over = over_limits(search, r.full, {})
        if r.passed and over:
            search.rejected.append(Rejection(c.key, f"after the headroom checks added replicas it {over}"))
            continue
        if r.passed:
            good.append(c)
            continue
        bad = next((v for v in r.seeds if not v.passed), r.confirm)
        detail = _miss(search, bad) if bad else "no simulation result"
        search.rejected.append(Rejection(c.key, f"missed the SLO in simulation at the target rate: {detail}"))
    # A plan whose claims fail is demoted below every plan whose claims hold (or that makes none).
    good.sort(key=rank_key)
    search.ranked = good
    floor = min((rank_key(c) for c in search.unchecked), default=None)
    search.ranked_exact = sum(1 for c in good if floor is None or rank_key(c) < floor)
    for c in good:  # listed with the rejections too, so a demoted plan past top_k is never silent
        if c.demoted:
            search.rejected.append(Rejection(c.key, f"${c.cost_per_hour:.2f}/h, meets the SLO but {c.demoted}"))
    _reconcile(search)
    if not good and search.infeasible is None:
        search.infeasible = infeasible_reason(search)


GENERIC_INFEASIBLE = ("no candidate met the SLO in simulation within the limits; see `rejected` for each "
                      "candidate's reason (raise search.max_gpus, relax the SLO, or allow more hardware)")
"""The answer when no plan passed and none was sized beyond the GPU limits: every layout missed
the SLO in simulation (each rejection says at what load)."""


def infeasible_reason(search: Search) -> str:
    """Why no plan passed, naming the binding GPU limit with the count that would lift it when a
    plan sized from the simulated goodputs (spares included) was dropped only for exceeding it."""
    kept = {c.key for c in search.candidates}
    needs: list[tuple[int, str, dict[str, int]]] = []
    for c in search.sized:
        fleet, spare = (c.fleet, spares(c.sizings)) if c.key not in kept else (
            (c.refined.full, {}) if c.refined and c.refined.passed else (None, {}))
        if fleet is not None and over_limits(search, fleet, spare):
            per = gpus_by_accelerator(fleet, spare)
            needs.append((sum(per.values()), c.key, per))
    if not needs:
        return GENERIC_INFEASIBLE
    total, key, per = min(needs)
    cap = search.spec.search.max_gpus
    fixes = ([f"raise search.max_gpus from {cap} to {total}"] if total > cap else []) + [
        f"raise accelerators[{acc}].max_gpus from {search.hw.max_gpus[acc]} to {n}"
        for acc, n in per.items() if n > search.hw.max_gpus[acc] < cap]  # the card's own cap, below the search's
    return (f"no plan meets the SLO within the GPU limits: the smallest fleet sized from the simulated goodputs, "
            f"{key}, needs {total} GPUs with its headroom ({', '.join(f'{n} {a}' for a, n in per.items())}); "
            f"{' and '.join(fixes)} to plan it (it is then checked in simulation), or relax the SLO")


def _reconcile(search: Search) -> None:
    """The equal-cost verdict splits one layout; the ranking may still prefer another plan. Say
    which plan kind won overall and why, from the plans' own facts, so the two answers never
    contradict."""
    dg = search.disaggregation
    if not dg or not search.ranked:
        return
    top = search.ranked[0]
    dg["best_plan"] = {"kind": top.kind, "plan": top.key, "cost_per_hour": top.cost_per_hour}
    split_wins = top.kind != "colocated"
    if split_wins != (dg.get("verdict") == "disaggregate"):
        pd_split = dg.get("pd_split")
        dg["reason"] = f"{dg['reason']}; but {verdict_sentence(search.ranked, pd_split if isinstance(pd_split, list) else None)}"
        dg["verdict"] = "disaggregate" if split_wins else "colocate"


def verdict_sentence(ranked: list[Candidate], pd_split: list[int] | None) -> str:
    """Why the top-ranked plan wins over the equal-cost verdict, stated from the plans' facts:
    for a colocated winner, what became of the P/D plans (demoted by a named claim, dearer, or
    none met the SLO); for a P/D winner, what it does differently from the equal-cost split."""
    top = ranked[0]
    head = f"the cheapest plan meeting the SLO is {top.kind} ({top.key}, ${top.cost_per_hour:.2f}/h)"
    if top.kind == "colocated":
        split = [c for c in ranked if c.kind != "colocated"]
        cheaper = [c for c in split if c.cost_per_hour < top.cost_per_hour and c.demoted]
        if cheaper:
            return head + "; the cheaper P/D plans were demoted: " + "; ".join(
                f"{c.key} (${c.cost_per_hour:.2f}/h) {c.demoted}" for c in cheaper)
        if split:
            c = min(split, key=lambda c: c.cost_per_hour)
            return head + f"; the cheapest P/D plan meeting the SLO, {c.key}, costs ${c.cost_per_hour:.2f}/h"
        return head + "; no P/D plan met the SLO in simulation"
    pools = {p.role: p for p in (top.refined.full if top.refined else top.fleet).pools}
    pre, dec = pools.get("prefill"), pools.get("decode")
    if pre is not None and dec is not None and pre.layout != dec.layout:
        return head + (f", which uses a different layout per phase (prefill {pre.layout.label}, decode "
                       f"{dec.layout.label})")
    ratio = f"{pre.replicas}:{dec.replicas}" if pre is not None and dec is not None else "its own"
    equal = f"{pd_split[0]}:{pd_split[1]}" if pd_split else "the equal-cost"
    return head + f", sized P:D {ratio} for the target rate rather than the {equal} split of the colocated fleet"


def _miss(search: Search, v: SimVerdict) -> str:
    k = f"p{search.spec.slo.percentile}"
    return (f"seed {v.seed}: TTFT {k} {v.ttft[k] * 1e3:.0f} ms (target {search.spec.slo.ttft_s * 1e3:.0f}), "
            f"TPOT {k} {v.tpot[k] * 1e3:.1f} ms (target {search.spec.slo.tpot_s * 1e3:.0f}), attainment "
            f"{v.attainment:.1%} (required {search.spec.slo.attainment:.0%})")


def _mean(vs: list[SimVerdict], attr: str) -> float:
    return sum(float(getattr(v, attr)) for v in vs) / len(vs) if vs else 0.0
