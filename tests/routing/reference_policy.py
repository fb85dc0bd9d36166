"""The readable per-candidate reference of the composed policy's colocated decision, used only to
check the columns path of `fleetwise.routing.policy.ComposedPolicy` (tests/routing/test_fast_path.py,
tests/sim/test_fast_paths.py).

`ReferencePolicy` wraps a `ComposedPolicy` for its state (in-flight ledger, prefix index,
feedback, picker, recent picks) and decides every scored colocated request one candidate at a
time: each worker's signals from its view and a walk of the ledger, the per-candidate scorers of
`reference_scorers.py`, the load bound over `Candidate`s, weighted totals in dicts and a `max`
over a dict; P/D pairs by `reference_pd.py`. Signal-free colocated picks have a single
implementation and are delegated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from reference_scorers import REFERENCE

from fleetwise.core.feedback import Feedback
from fleetwise.core.views import FleetView, RouteRequest, RoutingDecision, WorkerView
from fleetwise.routing.plugins import (
    PICKER_KINDS,
    PICKERS,
    TIE_TOLERANCE,
    Candidate,
    PickerState,
    has_token_backlog,
    own_cost,
    view_load,
)
from fleetwise.routing.policy import ComposedPolicy
from fleetwise.routing.reasons import max_reason
from fleetwise.routing.safe_mode import as_fresh
from fleetwise.routing.state import LatencyFeedback
from fleetwise.routing.view_cache import Eligible
from fleetwise.spec.routing import LoadBoundParams


def reference_factor(fb: LatencyFeedback, worker: str, now_s: float) -> float:
    """`LatencyFeedback.factor` read one worker at a time: the geometric mean of the age-decayed
    ratios (a ratio of 0 left out), times the failure factor, clamped, 1 within the deadband."""
    p = fb.p
    if not p.enabled or worker not in fb._w:
        return 1.0
    t = fb._worker_terms(worker)
    logs: list[float] = []
    if t.ttft is not None or t.tpot is not None:
        decay = 0.5 ** (max(0.0, now_s - t.last_obs_s) / p.half_life_s)
        for term in (t.ttft, t.tpot):
            if term is not None:
                r = (term[0] + term[1] * decay) / term[0]
                if r:
                    logs.append(math.log(r))
    f = math.exp(sum(logs) / len(logs)) if logs else 1.0
    if t.failure_factor is not None:
        f *= t.failure_factor
    f = min(max(f, p.min_factor), p.max_factor)
    return 1.0 if abs(f - 1.0) < p.deadband else f


def load_bound(cs: Sequence[Candidate], recent: Sequence[tuple[str, int]],
               p: LoadBoundParams) -> tuple[list[Candidate], float, list[str]]:
    """The load bound over candidates: `current <= c * mean(current) + own * slowness`, then the
    share check over the last picks' work (`work <= c * (W + own) * speed / sum(speed)`), if it keeps any."""
    current = [c.load * c.slowness for c in cs]
    bound = p.c * (sum(current) / len(cs))
    kept = [c for c, cur in zip(cs, current, strict=True) if cur <= bound + c.own * c.slowness + TIE_TOLERANCE]
    if p.share_window > 0 and recent:
        work = {c.name: 0 for c in cs}
        for name, w in list(recent)[-p.share_window:]:
            if name in work:
                work[name] += w
        k = sum(work.values())
        speed = {c.name: 1.0 / c.slowness for c in cs}
        total = sum(speed.values())
        both = [c for c in kept if work[c.name] <= p.c * (k + c.own) * speed[c.name] / total]
        kept = both or kept
    ids = {id(c) for c in kept}
    return kept, bound, [c.name for c in cs if id(c) not in ids]


def weighted_totals(cs: Sequence[Candidate], per: dict[str, dict[str, float]],
                    weights: dict[str, float]) -> dict[str, float]:
    """`0 + w1 * s1 + w2 * s2 ...` per candidate, in scorer order."""
    return {c.name: sum([weights[s] * vals[c.name] for s, vals in per.items()]) for c in cs}


def max_of(state: PickerState, totals: dict[str, float], tie_break: str) -> tuple[str, int]:
    """The highest total; ties (within the tolerance) in name order, LRU first if asked, then seeded."""
    best = max(totals.values())
    tied = sorted(n for n, t in totals.items() if t >= best - TIE_TOLERANCE)
    if len(tied) > 1 and tie_break == "lru":
        oldest = min(state.last_chosen.get(n, 0) for n in tied)
        tied = [n for n in tied if state.last_chosen.get(n, 0) == oldest]
    if len(tied) == 1:
        return tied[0], 1
    return tied[int(state.rng.integers(len(tied)))], len(tied)


class ReferencePolicy:
    """`ComposedPolicy`'s decisions, the scored colocated ones recomputed per candidate."""

    def __init__(self, inner: ComposedPolicy) -> None:
        self.p = inner
        self.name = inner.name
        self.wants_kv_events = inner.wants_kv_events

    def observe(self, fb: Feedback) -> None:
        self.p.observe(fb)

    def report(self) -> dict[str, Any]:
        return self.p.report()

    def route(self, req: RouteRequest, fleet: FleetView) -> RoutingDecision:
        p, now = self.p, fleet.now_s
        p.last_now_s = max(p.last_now_s, now)
        p._expected = 0 if p._simple else p.predictor.expect(req.request_id, req.tenant, req.prompt_tokens,
                                                             req.max_output_tokens)
        e = p._eligible_cached(req, fleet)
        if not p.safe.spec.enabled and p.safe.stale(now, e.reported):
            fleet = as_fresh(fleet)
            e = p._eligible_cached(req, fleet)
        p.picker.weights = e.weights
        if not e.ws:
            return p._done(RoutingDecision(worker=None, reason=f"rejected: {e.why}", kind="rejected"))
        safe = p.safe.update_sorted(now, e.reported)
        if safe and p.safe.spec.action == "reject":
            msg = f"safe-mode reject: fleet view stale ({p.safe.describe()}); shedding load"
            return p._done(RoutingDecision(worker=None, reason=msg, safe_mode=True, kind="safe-mode"))
        if e.ws[0].role != "mixed":
            from reference_pd import route_pd  # it imports this module's `reference_factor`

            return p._done(route_pd(p, req, fleet, e.ws, safe))
        if p._simple or (safe and p.safe.spec.action == "round_robin"):
            return p._done(p._route_mixed_simple(req, now, e, safe))
        return p._done(self._route_mixed(req, now, e, safe))

    def _candidate(self, req: RouteRequest, w: WorkerView, now: float) -> Candidate:
        p = self.p
        cost, dw = p.params.cost, p.params.cost.decode_token_weight
        n_pend, tok_pend = p.inflight._since_walk(w.name, w.reported_at_s, dw)
        prefix = p.index.match(w.name, req.block_hashes)
        load = view_load(w, cost)
        if not has_token_backlog(w):
            load += p.inflight.outstanding_walk(w.name, dw)[1] - tok_pend
        load += tok_pend + cost.per_request_tokens * n_pend
        requests = w.queued_requests + w.running_requests + n_pend
        slowness = reference_factor(p.feedback, w.name, now) / w.weight
        return Candidate(w, requests, load, own_cost(req, prefix, cost, p._expected), slowness, prefix)

    def _route_mixed(self, req: RouteRequest, now: float, e: Eligible, safe: bool) -> RoutingDecision:
        p, params = self.p, self.p.params
        cs = [self._candidate(req, w, now) for w in e.ws]
        kept, bound, excluded = cs, None, []
        if params.load_bound.enabled and len(cs) > 1:
            kept, bound, excluded = load_bound(cs, p.recent.picks.get("mixed", ()), params.load_bound)
        scorers = [s for s, wt in params.scorers.items() if wt > 0]
        per = {s: REFERENCE[s](req, kept) for s in scorers}
        totals = weighted_totals(kept, per, p._weights)
        scores = {k: round(v, 6) for k, v in totals.items()}
        for s, vals in per.items():
            scores.update((f"{k}.{s}", round(v, 6)) for k, v in vals.items())
        kind, names = params.picker, [c.name for c in kept]
        if kind == "max":
            name, tied = max_of(p.picker, totals, params.tie_break)
            c = next(x for x in kept if x.name == name)
            reason, kind = max_reason(params, req, c, per, bound, excluded, tied)
        else:
            pick = totals if per else weighted_totals(kept, {"requests": REFERENCE["requests"](req, kept)},
                                                      {"requests": p._weights.get("requests", 1.0)})
            i, reason, _ = PICKERS[kind](p.picker, names, lambda: list(pick.values()), "mixed", params.tie_break)
            c, kind = kept[i], PICKER_KINDS[kind]
        if safe:
            reason, kind = f"safe-mode last-known ({p.safe.describe()}); {reason}", "safe-mode"
        p._record("mixed", c.name, c.own)
        p._dispatch(req, c.prefix_blocks, c.load + c.own, c.name, None, now)
        return RoutingDecision(worker=c.name, scores=scores, reason=reason, safe_mode=safe, kind=kind)
