"""The readable per-candidate reference of the composed policy's P/D pair decision, used only to
check its columns path (`ComposedPolicy._route_pd` with `routing/pd_select.py`).

Every decision is recomputed from nothing: each side's workers as `Candidate`s (their signals
read one at a time: ledger walk, prefix match per worker, slowness per worker), every
(prefill, decode) pair checked for KV compatibility, the links looked up in a dict built from
the view, the pair filters, load bounds, profile totals and pair scores (the `handoff` formula
written out) over lists of candidate pairs, and a `max` over the pair keys. It works on the
wrapped policy's state (ledger, prefix index, feedback, incoming KV, picker, recent picks).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from reference_policy import reference_factor

from fleetwise.core.views import (
    FleetView,
    KvLinkView,
    RouteRequest,
    RoutingDecision,
    WorkerView,
    kv_format_of,
)
from fleetwise.routing import kernels
from fleetwise.routing.pd_scorers import PAIR_SCORERS, PairColumns
from fleetwise.routing.plugins import (
    PICKER_KINDS,
    PICKERS,
    SCORERS,
    Candidate,
    has_token_backlog,
    kv_headroom,
    own_cost,
    view_load,
)
from fleetwise.routing.reasons import pair_reason
from fleetwise.routing.vector import Columns
from fleetwise.spec.kv_format import kv_compat

Pair = tuple[Candidate, Candidate]
Links = dict[tuple[str, str], KvLinkView]


def columns(req: RouteRequest, cs: list[Candidate]) -> Columns:
    """`cs` as scorer columns, every candidate kept."""
    return Columns([c.load for c in cs], [c.own for c in cs], [c.slowness for c in cs], [c.requests for c in cs],
                   [c.prefix_blocks for c in cs], [c.view.kv_usage for c in cs], len(req.block_hashes),
                   list(range(len(cs))), [c.view for c in cs], [c.view.weight for c in cs], [c.kv_room for c in cs])


def candidate(p: Any, req: RouteRequest, w: WorkerView, side: str, now: float) -> Candidate:
    """One worker of `side` with its signals, read from its view and a walk of the ledger."""
    cost = p.params.cost
    dw, per_req = cost.decode_token_weight, cost.per_request_tokens
    n_pend, tok_pend = p.inflight._since_walk(w.name, w.reported_at_s, dw)
    load = view_load(w, cost, side)
    if not has_token_backlog(w):
        load += p.inflight.outstanding_walk(w.name, dw)[1] - tok_pend
    load += tok_pend + per_req * n_pend
    slow = reference_factor(p.feedback, w.name, now) / w.weight
    reqs = w.queued_requests + w.running_requests + n_pend
    if side == "prefill":
        prefix = p.index.match(w.name, req.block_hashes)
        return Candidate(w, reqs, load, own_cost(req, prefix, cost, 0), slow, prefix, 0.0)
    return Candidate(w, reqs, load, dw * p._expected + per_req, slow, 0, kv_headroom(w, req.prompt_tokens + p._expected))


def bounded_names(p: Any, cs: list[Candidate], pool: str) -> set[str]:
    names = [c.name for c in cs]
    _, kept, _ = p._bounded([c.load for c in cs], [c.own for c in cs], [c.slowness for c in cs], names, pool)
    return {names[i] for i in kept}


def profile_totals(p: Any, req: RouteRequest, cs: list[Candidate], side: str) -> list[float]:
    scorers, weights, wsum = p._profile_terms[side]
    per = [SCORERS[s](req, columns(req, cs)) for s in scorers]
    tot = kernels.totals(per, weights) if per else [0.0] * len(cs)
    return [t / wsum for t in tot]


def handoff(pairs: list[Pair], links: Links) -> dict[str, float]:
    best = max((lk.bandwidth_bytes_per_s for lk in links.values() if lk.healthy), default=0.0)
    out = {}
    for p, d in pairs:
        lk = links.get((p.name, d.name))
        rel = 1.0 if lk is None or best <= 0 else min(lk.bandwidth_bytes_per_s / best, 1.0)
        out[f"{p.name}->{d.name}"] = rel if lk is None else rel / (1 + lk.active_transfers)
    return out


def pick_max(p: Any, req: RouteRequest, pairs: list[Pair], cp: list[Candidate], cd: list[Candidate],
             links: Links) -> tuple[Candidate, Candidate, dict[str, float], str]:
    pdp = p.params.pd
    need = req.prompt_tokens + p._expected
    cd = [replace(c, kv_room=kv_headroom(c.view, need + p.incoming.tokens(c.name))) for c in cd]
    by_name = {c.name: c for c in cd}
    pairs = [(a, by_name[b.name]) for a, b in pairs]
    pairs = [(a, b) for a, b in pairs if b.kv_room >= pdp.kv_reserve] or pairs
    floor = pdp.degraded_link_fraction * max(
        (lk.bandwidth_bytes_per_s for lk in links.values() if lk.healthy), default=0.0)
    pairs = [(a, b) for a, b in pairs if (lk := links.get((a.name, b.name))) is None
             or lk.bandwidth_bytes_per_s >= floor] or pairs
    pn, dn = {a.name for a, _ in pairs}, {b.name for _, b in pairs}
    kpn = bounded_names(p, [c for c in cp if c.name in pn], "prefill")
    kdn = bounded_names(p, [c for c in cd if c.name in dn], "decode")
    pairs = [(a, b) for a, b in pairs if a.name in kpn and b.name in kdn] or pairs
    sp = dict(zip([c.name for c in cp], profile_totals(p, req, cp, "prefill"), strict=True))
    sd = dict(zip([c.name for c in cd], profile_totals(p, req, cd, "decode"), strict=True))
    terms = []
    for s, wt in pdp.pair_scorers.items():
        if wt > 0 and s == "handoff":
            terms.append((wt, handoff(pairs, links)))
        elif wt > 0:  # another pair scorer: its own implementation, over these pairs
            best = max((lk.bandwidth_bytes_per_s for lk in links.values() if lk.healthy), default=0.0)
            cols = PairColumns([a.view for a, _ in pairs], [b.view for _, b in pairs],
                               [links.get((a.name, b.name)) for a, b in pairs], best)
            terms.append((wt, dict(zip([f"{a.name}->{b.name}" for a, b in pairs], PAIR_SCORERS[s](req, cols),
                                       strict=True))))
    keys, totals = [], []
    for a, b in pairs:
        key = f"{a.name}->{b.name}"
        t = pdp.prefill.weight * sp[a.name] + pdp.decode.weight * sd[b.name]
        for wt, vals in terms:
            t += wt * vals[key]
        keys.append(key)
        totals.append(t)
    j, _ = p.picker.max(keys, totals, p.params.tie_break)
    a, b = pairs[j]
    return a, b, {k: round(v, 6) for k, v in zip(keys, totals, strict=True)}, pair_reason(
        req, a, b, links.get((a.name, b.name)))


def pick_simple(p: Any, req: RouteRequest, pairs: list[Pair], kind_p: str, kind_d: str) -> tuple[Candidate, Candidate, str]:
    def totals(cs: list[Candidate], side: str, kind: str) -> list[float]:
        if kind == "max":
            return profile_totals(p, req, cs, side)
        return p._requests_totals(req, columns(req, cs))

    ps = {a.name: a for a, _ in pairs}
    pc, pnames = list(ps.values()), list(ps)
    i = PICKERS[kind_p](p.picker, pnames, lambda: totals(pc, "prefill", kind_p), "prefill", p.params.tie_break)[0]
    pn = pnames[i]
    ds = {b.name: b for a, b in pairs if a.name == pn}
    dc, dnames = list(ds.values()), list(ds)
    j = PICKERS[kind_d](p.picker, dnames, lambda: totals(dc, "decode", kind_d), "decode", p.params.tie_break)[0]
    dn = dnames[j]
    kinds = kind_p.replace("_", "-") if kind_p == kind_d else f"{kind_p.replace('_', '-')}/{kind_d.replace('_', '-')}"
    return ps[pn], ds[dn], f"{kinds} pair {pn}->{dn}"


def route_pd(p: Any, req: RouteRequest, fleet: FleetView, ws: list[WorkerView], safe: bool) -> RoutingDecision:
    """The P/D decision of the wrapped `ComposedPolicy` `p`, recomputed per candidate."""
    now, pdp = fleet.now_s, p.params.pd
    links = {(lk.src, lk.dst): lk for lk in fleet.links}
    sides: dict[str, list[WorkerView]] = {}
    for side in ("prefill", "decode"):
        sides[side], why = p._side_workers(req, fleet, ws, side)
        if not sides[side]:
            return RoutingDecision(worker=None, reason=f"rejected: {side} side: {why}", kind="rejected")
    cp = [candidate(p, req, w, "prefill", now) for w in sides["prefill"]]
    cd_all = [candidate(p, req, w, "decode", now) for w in sides["decode"]]
    fit = [(a, b) for a in cp for b in cd_all if kv_compat(kv_format_of(a.view), kv_format_of(b.view)).ok]
    if not fit:
        a, b = cp[0], cd_all[0]
        why = kv_compat(kv_format_of(a.view), kv_format_of(b.view)).reason
        return RoutingDecision(worker=None, kind="rejected", reason=(
            f"rejected: no decode replica can take a prefill replica's KV ({a.name}->{b.name}: {why})"))
    ok_p, ok_d = {a.name for a, _ in fit}, {b.name for _, b in fit}
    cp = [a for a in cp if a.name in ok_p]
    cd_all = [b for b in cd_all if b.name in ok_d]
    roomy = {b.name for b in cd_all if b.kv_room >= pdp.kv_reserve} or ok_d
    fit = [(a, b) for a, b in fit if b.name in roomy]
    cd = [b for b in cd_all if b.name in roomy]
    pairs = [(a, b) for a, b in fit if links.get((a.name, b.name)) is None or links[(a.name, b.name)].healthy]
    no_link = not pairs
    if no_link:
        pairs = fit
    kp, kd = ("round_robin", "round_robin") if safe and p.safe.spec.action == "round_robin" else p._pd_pickers
    if kp != "max" or kd != "max":
        a, b, reason = pick_simple(p, req, pairs, kp, kd)
        scores: dict[str, float] = {}
        kind = PICKER_KINDS[kp if kp != "max" else kd]
    else:
        a, b, scores, reason = pick_max(p, req, pairs, cp, cd, links)
        kind = "pair"
    return p.commit_pd(req, a, b, scores, reason, kind, safe, no_link, now)  # the choice is what is checked
