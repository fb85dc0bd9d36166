"""Phases 4-7 of planning: size candidates, refine the cheapest in simulation, compare, rank.

Owns building colocated / PD / heterogeneous-PD candidates from measured goodputs (each with
its headroom terms and P:D reasoning), choosing which to refine, the colocated-vs-PD comparison at
equal GPU count, the heterogeneous claims, and the final ranking (cost per hour among plans that
meet the SLO over every seed, then goodput). Does not render anything (report).
"""

from __future__ import annotations

import math
from typing import Any

from fleetwise.planner.candidates import Layout, Rejection
from fleetwise.planner.executor import Executor
from fleetwise.planner.measure import FleetShape, PoolShape, SimVerdict, run_fleet
from fleetwise.planner.pipeline import Candidate, Search, _latency_line, _link, profile_line
from fleetwise.planner.sizing import Sizing, pd_ratio_text, size_pool
from fleetwise.planner.stages import Claims, Context, Refined, check_claims, refine_plan


# ---- phase 4: size ---------------------------------------------------------------------------
def _goodput_line(search: Search, role: str, lay: Layout) -> str:
    e = search.estimates[lay]
    mu = {"mixed": e.mu_mixed_rps, "prefill": e.mu_prefill_rps, "decode": e.mu_decode_rps}[role]
    judged = {"mixed": "TTFT and TPOT", "prefill": "TTFT (decode pool oversized)",
              "decode": "TPOT and TTFT (prefill pool oversized, so TTFT holds the decode admission wait)"}[role]
    if (role, lay) in search.measured:
        return (f"effective goodput: one {role} replica of {lay.label} sustains {search.goodput[(role, lay)]:.2f} "
                f"req/s within the SLO, {search.measured[(role, lay)]}; the analytical estimate was {mu:.2f} req/s")
    return (f"effective goodput: one {role} replica of {lay.label} sustains "
            f"{search.goodput[(role, lay)]:.2f} req/s of the target mix within the SLO ({judged}), bisected in the "
            f"simulator; the analytical estimate was {mu:.2f} req/s")


def _moe_line(search: Search, lay: Layout) -> str | None:
    m = search.hw.model
    if m.moe is None:
        return None
    from fleetwise.perf.types import BatchShape

    dep = search.hw.deployment(lay, search.spec.kv_dtype)
    e = search.estimates[lay]
    cost = search.perf.step_cost(BatchShape.decode(max(1, e.decode_batch), int(search.stats.prompt_mean)), dep)
    return (f"MoE: {m.moe.num_experts} experts, {m.moe.experts_per_token} per token; EP={lay.ep} over the "
            f"replica's {lay.gpus} GPUs; expert load imbalance {search.hw.imbalance:.2f} (busiest rank over mean; "
            f"default 1.3, set moe.expert_imbalance); at batch {e.decode_batch} a decode step spends "
            f"{cost.ep_comm_s * 1e3:.2f} ms in all-to-all of {cost.total_s * 1e3:.1f} ms")


def _base_steps(search: Search, role: str, lay: Layout) -> list[str]:
    steps = [profile_line(search), search.fits[lay], _latency_line(search.estimates[lay], search.spec, search.stats),
             _goodput_line(search, role, lay)]
    moe = _moe_line(search, lay)
    return steps + ([moe] if moe else [])


def _cost(search: Search, fleet: FleetShape, spare: dict[str, int]) -> float:
    return sum((p.replicas + spare.get(p.role, 0)) * p.layout.gpus * search.hw.price(p.layout.accelerator)
               for p in fleet.pools)


def _spare(sizings: dict[str, Sizing]) -> dict[str, int]:
    return {r: s.failures + s.upgrade for r, s in sizings.items()}


def _colocated(search: Search, lay: Layout) -> Candidate | None:
    g = search.goodput.get(("mixed", lay), 0.0)
    if g <= 0:
        return None
    w = search.spec.workload
    s = size_pool("mixed", g, w.rate_rps, search.burst, search.spec.headroom)
    fleet = FleetShape((PoolShape("mixed", lay, s.serving),))
    steps = _base_steps(search, "mixed", lay) + [s.explain(search.spec.headroom)]
    return Candidate(f"colocated {lay.label}", "colocated", fleet, {"mixed": s}, steps)


def _pd_steps(search: Search, p: Layout, d: Layout, sp: Sizing, sd: Sizing) -> list[str]:
    st, ep, ed = search.stats, search.estimates[p], search.estimates[d]
    an_p = search.spec.workload.rate_rps * search.burst / ep.mu_prefill_rps if ep.mu_prefill_rps else math.inf
    an_d = search.spec.workload.rate_rps * search.burst / ed.mu_decode_rps if ed.mu_decode_rps else math.inf
    kvb = search.hw.model.kv_bytes_per_token(search.spec.kv_dtype)
    return [
        (f"P:D from the queueing model: input/output tokens {st.prompt_mean:,.0f}/{st.output_mean:,.0f} = "
         f"{st.prompt_mean / st.output_mean:.1f}; prefill service {ep.prefill_s_per_request * 1e3:.0f} ms per mean "
         f"prompt (M/D/1 queue, TTFT budget after the p{search.spec.slo.percentile} prefill and a KV transfer p99 of "
         f"{ep.kv_transfer_p99_s * 1e3:.1f} ms = {kvb * st.prompt_p99 / 1e9:.2f} GB) gives {ep.mu_prefill_rps:.2f} "
         f"req/s per prefill replica; decode batch {ed.decode_batch} at {ed.tpot_at_batch_s * 1e3:.1f} ms per step "
         f"for {st.output_mean:.0f} tokens gives {ed.mu_decode_rps:.2f} req/s per decode replica; analytical "
         f"load {an_p:.2f}:{an_d:.2f}"),
        f"P:D measured in simulation: {pd_ratio_text(sp, sd)}",
    ]


def _disaggregated(search: Search, p: Layout, d: Layout) -> Candidate | None:
    gp, gd = search.goodput.get(("prefill", p), 0.0), search.goodput.get(("decode", d), 0.0)
    if gp <= 0 or gd <= 0:
        return None
    w, h = search.spec.workload, search.spec.headroom
    sp, sd = size_pool("prefill", gp, w.rate_rps, search.burst, h), size_pool("decode", gd, w.rate_rps, search.burst, h)
    fleet = FleetShape((PoolShape("prefill", p, sp.serving), PoolShape("decode", d, sd.serving)), *_link(search, p))
    kind = "heterogeneous" if p.accelerator != d.accelerator else "disaggregated"
    both = _base_steps(search, "prefill", p) + _base_steps(search, "decode", d)
    steps = list(dict.fromkeys(both)) + _pd_steps(search, p, d, sp, sd) + [sp.explain(h), sd.explain(h)]
    return Candidate(f"{kind} P[{p.label}] D[{d.label}]", kind, fleet, {"prefill": sp, "decode": sd}, steps)


def _within_limits(search: Search, c: Candidate) -> str | None:
    spare = _spare(c.sizings)
    per: dict[str, int] = {}
    for p in c.fleet.pools:
        per[p.layout.accelerator] = per.get(p.layout.accelerator, 0) + (p.replicas + spare[p.role]) * p.layout.gpus
    total = sum(per.values())
    if total > search.spec.search.max_gpus:
        return f"needs {total} GPUs with headroom > search.max_gpus={search.spec.search.max_gpus}"
    for acc, n in per.items():
        if n > search.hw.max_gpus[acc]:
            return f"needs {n} {acc} GPUs > {search.hw.max_gpus[acc]} available"
    return None


def size_candidates(search: Search, lists: dict[str, list[Layout]]) -> None:
    built: list[Candidate | None] = [_colocated(search, lay) for lay in lists["mixed"]]
    for p in lists["prefill"]:
        for d in lists["decode"]:
            hetero = p.accelerator != d.accelerator
            if p.weight_dtype == d.weight_dtype and (not hetero or search.spec.search.heterogeneous):
                built.append(_disaggregated(search, p, d))
    for c in built:
        if c is None:
            continue
        c.cost_per_hour = _cost(search, c.fleet, _spare(c.sizings))
        why = _within_limits(search, c)
        if why:
            search.rejected.append(Rejection(c.key, why))
        else:
            search.candidates.append(c)


# ---- phase 5: refine ---------------------------------------------------------------------------
def _refine_task(ctx: Context, item: tuple[str, FleetShape, dict[str, int]]) -> Refined:
    return refine_plan(ctx, *item)


REFINE_ROUNDS = 3
"""Batches of `refine_top` candidates refined, cheapest first, while none has passed yet."""


def _choose(search: Search, ordered: list[Candidate]) -> list[Candidate]:
    chosen = ordered[: search.spec.search.refine_top]
    for kind in ("colocated", "disaggregated", "heterogeneous"):
        best = next((c for c in ordered if c.kind == kind), None)
        if best is not None and best not in chosen:
            chosen.append(best)
    return chosen


def refine(search: Search, ctx: Context, ex: Executor) -> list[Candidate]:
    """Refine the cheapest candidates; while none passes, the next `refine_top` (REFINE_ROUNDS batches)."""
    ordered = sorted(search.candidates, key=lambda c: (c.cost_per_hour, c.key))
    batch = _choose(search, ordered)
    done: list[Candidate] = []
    for _ in range(REFINE_ROUNDS):
        items = [(c.key, c.fleet, _spare(c.sizings)) for c in batch]
        for c, r in zip(batch, ex.map(_refine_task, ctx, items), strict=True):
            c.refined = r
            search.simulations += r.runs
            c.cost_per_hour = _cost(search, r.full, {})  # spares, and what the headroom checks added
        done += batch
        if any(c.refined and c.refined.passed for c in done):
            break
        batch = [c for c in ordered if c not in done][: search.spec.search.refine_top]
        if not batch:
            break
    for c in ordered:
        if c not in done:
            search.rejected.append(Rejection(c.key, f"not refined: ${c.cost_per_hour:.2f}/h is above the "
                                                    f"{len(done)} cheapest candidates refined"))
    return done


# ---- phase 6: compare ----------------------------------------------------------------------------
def _claims_task(ctx: Context, item: tuple[FleetShape, float | None, SimVerdict]) -> Claims:
    return check_claims(ctx, *item)


def _equal_cost_task(ctx: Context, item: tuple[FleetShape, FleetShape]) -> tuple[SimVerdict, SimVerdict]:
    a, b = item
    return (run_fleet(ctx.spec, ctx.mix, a, ctx.prices, ctx.peak_rps, seed=0),
            run_fleet(ctx.spec, ctx.mix, b, ctx.prices, ctx.peak_rps, seed=0))


def compare(search: Search, ctx: Context, ex: Executor, chosen: list[Candidate]) -> None:
    ok = [c for c in chosen if c.refined and c.refined.passed]
    colo = min((c for c in ok if c.kind == "colocated"), key=lambda c: c.cost_per_hour, default=None)
    colo_tpot = colo.refined.seeds[0].tpot["p99"] if colo and colo.refined else None
    split = [c for c in ok if c.kind != "colocated" and c.refined and c.refined.seeds]
    items = [(c.refined.full, colo_tpot, c.refined.seeds[0]) for c in split if c.refined]
    for c, claims in zip(split, ex.map(_claims_task, ctx, items), strict=True):
        c.claims = claims
        search.simulations += claims.runs
    if colo is not None and colo.refined:
        _equal_cost(search, ctx, ex, colo)


def _equal_cost(search: Search, ctx: Context, ex: Executor, colo: Candidate) -> None:
    assert colo.refined is not None
    pool = colo.refined.serving.pools[0]
    lay, n = pool.layout, pool.replicas
    e = search.estimates[lay]
    if n < 2 or e.mu_prefill_rps <= 0 or e.mu_decode_rps <= 0:
        search.disaggregation = {"verdict": "colocated", "reason": f"the colocated plan has {n} serving replica(s): "
                                 "too few to split into prefill and decode pools at equal cost"}
        return
    share = (1 / e.mu_prefill_rps) / (1 / e.mu_prefill_rps + 1 / e.mu_decode_rps)
    p = min(n - 1, max(1, round(n * share)))
    pd = FleetShape((PoolShape("prefill", lay, p), PoolShape("decode", lay, n - p)), *_link(search, lay))
    v_colo, v_pd = ex.map(_equal_cost_task, ctx, [(colo.refined.serving, pd)])[0]
    search.simulations += 2
    search.disaggregation = _verdict(search, lay, n, p, v_colo, v_pd)


def _verdict(search: Search, lay: Layout, n: int, p: int, vc: SimVerdict, vp: SimVerdict) -> dict[str, Any]:
    st, slo = search.stats, search.spec.slo
    kvb = search.hw.model.kv_bytes_per_token(search.spec.kv_dtype)
    pd_better = (vp.attainment, vp.goodput_rps) > (vc.attainment, vc.goodput_rps)
    terms = {
        "interference_removed": f"TPOT p99 {vc.tpot['p99'] * 1e3:.1f} ms colocated -> {vp.tpot['p99'] * 1e3:.1f} ms "
                                "with decode steps free of prompt chunks",
        "kv_bytes_per_request": f"mean {kvb * st.prompt_mean / 1e6:.0f} MB, p99 {kvb * st.prompt_p99 / 1e6:.0f} MB "
                                f"({kvb / 1e3:.0f} kB per prompt token)",
        "kv_transfer_p99_s": vp.kv_transfer.get("p99_s", 0.0),
        "extra_failure_surface": "each request now needs a prefill replica, a decode replica and the KV link; "
                                 "two pools each need their own failure spares",
    }
    return {
        "verdict": "disaggregate" if pd_better else "colocate",
        "equal_cost": f"{n} x {lay.label}: colocated vs {p} prefill + {n - p} decode, at "
                      f"{search.spec.workload.rate_rps * search.burst:.2f} req/s (peak)",
        "colocated": {"slo_attainment": vc.attainment, "goodput_rps": vc.goodput_rps,
                      "ttft_p99_s": vc.ttft["p99"], "tpot_p99_s": vc.tpot["p99"]},
        "disaggregated": {"slo_attainment": vp.attainment, "goodput_rps": vp.goodput_rps,
                          "ttft_p99_s": vp.ttft["p99"], "tpot_p99_s": vp.tpot["p99"]},
        "terms": terms,
        "reason": (f"at equal cost the PD split {'beats' if pd_better else 'does not beat'} colocation: attainment "
                   f"{vp.attainment:.1%} vs {vc.attainment:.1%} (target {slo.attainment:.0%}), goodput "
                   f"{vp.goodput_rps:.2f} vs {vc.goodput_rps:.2f} req/s"),
    }


# ---- phase 7: rank -------------------------------------------------------------------------------
def rank(search: Search, chosen: list[Candidate]) -> None:
    good = []
    for c in chosen:
        r = c.refined
        assert r is not None
        if r.passed:
            good.append(c)
            continue
        bad = next((v for v in r.seeds if not v.passed), r.confirm)
        detail = _miss(search, bad) if bad else "no simulation result"
        search.rejected.append(Rejection(c.key, f"missed the SLO in simulation at the target rate: {detail}"))
    # A plan whose claims fail is demoted below every plan whose claims hold (or that makes none).
    good.sort(key=lambda c: (bool(c.claims and c.claims.failed), c.cost_per_hour,
                             -_mean(c.refined.seeds, "goodput_rps") if c.refined else 0.0, c.key))
    search.ranked = good
    _reconcile(search)
    if not good and search.infeasible is None:
        search.infeasible = ("no candidate met the SLO in simulation within the limits; see `rejected` for each "
                             "candidate's reason (raise search.max_gpus, relax the SLO, or allow more hardware)")


def _reconcile(search: Search) -> None:
    """The equal-cost verdict splits one layout; the ranking may still prefer a plan with other
    layouts per phase. Say which plan kind won overall, so the two answers never contradict."""
    dg = search.disaggregation
    if not dg or not search.ranked:
        return
    top = search.ranked[0]
    dg["best_plan"] = {"kind": top.kind, "plan": top.key, "cost_per_hour": top.cost_per_hour}
    split_wins = top.kind != "colocated"
    if split_wins != (dg.get("verdict") == "disaggregate"):
        dg["reason"] = (f"{dg['reason']}; but the cheapest plan meeting the SLO is {top.kind} ({top.key}, "
                        f"${top.cost_per_hour:.2f}/h), which uses a different layout per phase")
        dg["verdict"] = "disaggregate" if split_wins else "colocate"


def _miss(search: Search, v: SimVerdict) -> str:
    k = f"p{search.spec.slo.percentile}"
    return (f"seed {v.seed}: TTFT {k} {v.ttft[k] * 1e3:.0f} ms (target {search.spec.slo.ttft_s * 1e3:.0f}), "
            f"TPOT {k} {v.tpot[k] * 1e3:.1f} ms (target {search.spec.slo.tpot_s * 1e3:.0f}), attainment "
            f"{v.attainment:.1%} (required {search.spec.slo.attainment:.0%})")


def _mean(vs: list[SimVerdict], attr: str) -> float:
    return sum(float(getattr(v, attr)) for v in vs) / len(vs) if vs else 0.0
