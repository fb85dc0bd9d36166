"""`ComposedPolicy`: filters -> bounded load -> weighted scorers -> picker, plus P/D pairs.

One class serves every preset; a preset is a `PolicyParams` (see `fleetwise.spec.routing`).
Per request:

1. filters (healthy, pinned model version, region, role) keep the eligible workers, or the
   request is rejected with the filter's reason;
2. safe mode: when the view is stale the configured action applies (`round_robin`,
   `last_known`, `reject`);
3. each candidate's signals, as columns (one list per signal over the eligible workers, kept per
   view and brought up to date only where the in-flight ledger changed: `view_cache`):
   outstanding work from the view plus the router's own in-flight estimate since the view was
   taken, this request's own cost after its cached prefix, the feedback slowness factor over the
   worker's weight (relative capacity);
4. the load bound drops workers too far above the fleet mean (if enabled);
5. each weighted scorer scores every kept worker in one call; the weighted sums go to the picker.

A decision costs O(eligible workers) plus O(prompt blocks) per prefix lookup: nothing in it grows
with the requests in flight. Round-robin and random picks with no weighted scorer and no load
bound read no signal: they compute only the chosen worker's (O(1) per request).

In a P/D fleet the same steps run per side, each side by its own profile (`PdProfile`: the same
filters, scorers and pickers, by default the policy's), and each prefill->decode pair adds its pair
scorers (`handoff`: the KV link's load); with `max` on both sides the best pair wins, otherwise
each side's picker chooses in turn (prefill first). The sides are columns (`pd_select.Side`) and
the pairs positions into them; which pairs are KV-compatible and each pair's link view are kept
between decisions (`pd_select.PairTable`, `LinkTable`): O(replicas + pairs) per decision, the
pairs only as sums and comparisons.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetwise.core.feedback import (
    Cancelled,
    Completed,
    Dispatched,
    Failed,
    Feedback,
    FirstToken,
    KvCleared,
    KvEvicted,
    KvStored,
    WorkerDown,
    WorkerUp,
)
from fleetwise.core.rng import RngStreams
from fleetwise.core.views import FleetView, KvLinkView, RouteRequest, RoutingDecision, WorkerView
from fleetwise.routing import kernels
from fleetwise.routing.incoming import IncomingKv
from fleetwise.routing.pd_select import LinkTable, PairTable, Side, pair_totals
from fleetwise.routing.plugins import (
    FIELD_FILTERS,
    PICKER_KINDS,
    PICKERS,
    SCORERS,
    TIE_TOLERANCE,
    Candidate,
    PickerState,
    apply_filters,
    kv_headroom,
    own_cost_at,
    side_load,
)
from fleetwise.routing.predictor import OutputPredictor
from fleetwise.routing.prefix_index import PrefixIndex
from fleetwise.routing.reasons import max_reason, pair_reason
from fleetwise.routing.safe_mode import SafeModeTracker, as_fresh
from fleetwise.routing.signals import Columns
from fleetwise.routing.state import InFlight, LatencyFeedback, Pending, RecentPicks, pick_work
from fleetwise.routing.vector import ScoreTable
from fleetwise.routing.view_cache import Eligible, ViewColumns, ledger_load, positions, same_fields
from fleetwise.spec.routing import PolicyParams, SafeModeSpec

__all__ = ["ComposedPolicy"]


class ComposedPolicy:
    """A routing policy assembled from `PolicyParams`; see the module docstring for the steps."""

    def __init__(self, name: str, params: PolicyParams, safe_mode: SafeModeSpec, seed: int = 0) -> None:
        self.name = name
        self.params = params
        self.seed = seed
        self.safe = SafeModeTracker(safe_mode)
        self.picker = PickerState(RngStreams(seed).get(f"routing:{name}"))
        self.index = PrefixIndex(params.prefix_index.max_blocks_per_worker)
        self.inflight = InFlight()
        self.incoming = IncomingKv()
        self.predictor = OutputPredictor(params.output_predictor)
        self._expected = 0
        """Expected output tokens of the request being routed (set at the start of `route`)."""
        self.feedback = LatencyFeedback(params.feedback)
        self.down: dict[str, float] = {}
        self.recent = RecentPicks(params.load_bound.share_window)
        self.by_reason: dict[str, int] = {}
        self.by_worker: dict[str, int] = {}
        self.last_now_s = 0.0
        self.rejected = 0
        self._down_version = 0
        self._elig_key: tuple[Any, ...] | None = None
        self._elig: dict[tuple[str | None, str | None], Eligible] = {}
        self._elig_prev: dict[tuple[str | None, str | None], Eligible] = {}
        """The previous view's (what a new view's `Eligible` is built from)."""
        self._elig_renew = False
        """The current view differs from the previous one only outside the filtered fields."""
        self._filters_by_fields = all(f in FIELD_FILTERS for f in params.filters)
        """Every filter reads only `FIELD_FILTERS`' fields (what `_elig_renew` compares)."""
        self._order_names: list[str] = []
        """The names of the last view's workers, in the view's order (`_by_name`)."""
        self._order: list[int] = []
        """The positions that sort those workers by name."""
        self._simple = all(params.pd_picker(side) in ("round_robin", "random") for side in ("prefill", "decode")) and (
            params.picker in ("round_robin", "random") and not params.load_bound.enabled and not any(
                wt > 0 for wt in params.scorers.values()))
        """The pick reads no candidate signal: only the chosen worker's is computed (O(1) per request)."""
        self._weights: dict[str, float] = {str(k): v for k, v in params.scorers.items()}
        self._scorers = [str(k) for k, wt in params.scorers.items() if wt > 0]
        """The weighted scorers, in the order their terms are summed."""
        self._scorer_weights = [self._weights[s] for s in self._scorers]
        self._scorer_columns = {s: k for k, s in enumerate(self._scorers, start=1)}
        """Each weighted scorer's column in a `ScoreTable` (0: the totals)."""
        self._profiles = {side: params.pd_profile(side) for side in ("prefill", "decode")}
        """Scorer weights of the P/D prefill and decode profiles (`PolicyParams.pd_profile`)."""
        self._profile_terms = {side: self._terms(prof) for side, prof in self._profiles.items()}
        """Per P/D side: its scorers, their weights and the weights' sum (the profile's, or the
        policy's weighted scorers when the profile has none)."""
        self._pd_filters = {side: params.pd_filters(side) for side in ("prefill", "decode")}
        """Filters of each P/D side (None: the policy's eligible workers of that role)."""
        self._pd_pickers = (params.pd_picker("prefill"), params.pd_picker("decode"))
        """Pickers of the P/D prefill and decode sides (`PolicyParams.pd_picker`)."""
        self._pair_tables: dict[tuple[str | None, str | None], PairTable] = {}
        """Per (model_version, region): the compatible pairs of the P/D sides' workers (`_pair_table`)."""
        self._links = LinkTable()
        """The fleet view's KV links, kept between views (`LinkTable`)."""
        self._read_params(params)
        self.wants_kv_events = any(wt > 0 for wt in (*params.scorers.values(), *self._profiles["prefill"].values()))
        """Scores read the prefix index (load through the cached prefix, prefix): a driver should
        report the engines' `KvStored`/`KvEvicted` events."""

    def _read_params(self, params: PolicyParams) -> None:
        """The parameters each decision reads, as plain attributes (a pydantic field: ~350 instructions a read)."""
        lb, pdp, cost = params.load_bound, params.pd, params.cost
        self._bound_on: bool = lb.enabled
        self._bound_c: float = lb.c
        self._share_window: int = lb.share_window
        self._tie_break: str = params.tie_break
        self._picker_kind: str = params.picker
        self._record_dispatch: bool = params.prefix_index.record_dispatch
        self._kv_reserve: float = pdp.kv_reserve
        self._degraded_fraction: float = pdp.degraded_link_fraction
        self._side_weights: tuple[float, float] = (pdp.prefill.weight, pdp.decode.weight)
        self._pair_scorers: dict[str, float] = {str(k): v for k, v in pdp.pair_scorers.items()}
        self._dw: float = cost.decode_token_weight
        self._per_req: float = cost.per_request_tokens

    def _terms(self, profile: dict[str, float]) -> tuple[list[str], list[float], float]:
        """(scorers, weights, sum of weights or 1) of a P/D profile; the policy's when it is empty."""
        weights = profile or {s: self._weights[s] for s in self._scorers}
        return list(weights), list(weights.values()), sum(weights.values()) or 1.0

    # ---- route -------------------------------------------------------------------------------

    def route(self, req: RouteRequest, fleet: FleetView) -> RoutingDecision:
        now = fleet.now_s
        self.last_now_s = max(self.last_now_s, now)
        # The decode work this request is expected to bring: predicted from what a router knows
        # (tenant, prompt length, the client's cap), never its true output length. Pickers that
        # read no signal skip it (their in-flight ledger is never read).
        self._expected = 0 if self._simple else self.predictor.expect(
            req.request_id, req.tenant, req.prompt_tokens, req.max_output_tokens)
        e = self._eligible_cached(req, fleet)
        if not self.safe.enabled and self.safe.stale(now, e.reported):  # off: the stale view taken as fresh
            fleet = as_fresh(fleet)
            e = self._eligible_cached(req, fleet)
        ws = e.ws
        self.picker.weights = e.weights
        if not ws:
            return self._done(RoutingDecision(worker=None, reason=f"rejected: {e.why}", kind="rejected"))
        safe = self.safe.update_sorted(now, e.reported)
        if safe and self.safe.action == "reject":
            msg = f"safe-mode reject: fleet view stale ({self.safe.describe()}); shedding load"
            return self._done(RoutingDecision(worker=None, reason=msg, safe_mode=True, kind="safe-mode"))
        if ws[0].role == "mixed":
            if self._simple or (safe and self.safe.action == "round_robin"):
                d = self._route_mixed_simple(req, now, e, safe)
            else:
                d = self._route_mixed(req, now, e, safe)
        else:
            d = self._route_pd(req, fleet, ws, safe)
        return self._done(d)

    def _done(self, d: RoutingDecision) -> RoutingDecision:
        by_reason, by_worker = self.by_reason, self.by_worker  # plain dicts: a Counter's updates are generic calls
        by_reason[d.kind] = by_reason.get(d.kind, 0) + 1
        self.rejected += d.worker is None
        if d.worker is not None:
            by_worker[d.worker] = by_worker.get(d.worker, 0) + 1
        if d.prefill_worker is not None:
            by_worker[d.prefill_worker] = by_worker.get(d.prefill_worker, 0) + 1
        return d

    def _eligible_cached(self, req: RouteRequest, fleet: FleetView) -> Eligible:
        """`_eligible`, memoised while the view (the same workers tuple) and the down set last;
        a new view's is built from the previous view's (`Eligible`: only changed views are read again)."""
        key = (fleet.workers, self._down_version)
        last = self._elig_key
        if last is None or last[0] is not key[0] or last[1] != key[1]:
            # A new view of the same fleet whose filtered fields are unchanged (the exact mode's
            # per-request views): each previous `Eligible` is renewed with the new views, unfiltered.
            self._elig_renew = (self._filters_by_fields and last is not None and last[1] == key[1]
                                and not self.down and same_fields(last[0], fleet.workers))
            self._elig_key = key
            self._elig_prev = self._elig or self._elig_prev
            self._elig = {}
        sub = (req.model_version, req.region)
        e = self._elig.get(sub)
        if e is None:
            prev = self._elig_prev.get(sub)
            if self._elig_renew and prev is not None and prev.at is not None:
                e = Eligible.renewed(prev, fleet.workers, self.params.cost)
            else:
                ws, why = self._eligible(req, fleet)
                e = Eligible(ws, why, prev, self.params.cost, positions(fleet.workers, ws))
            self._elig[sub] = e
        return e

    def _eligible(self, req: RouteRequest, fleet: FleetView) -> tuple[list[WorkerView], str]:
        ws = self._by_name(fleet.workers)
        return apply_filters(req, ws, self._down_set(fleet), (*(f for f in self.params.filters if f != "role"), "role"))

    def _by_name(self, workers: tuple[WorkerView, ...]) -> list[WorkerView]:
        """`workers` sorted by name (stably); the last view's order reused while the names come in the same order."""
        names = self._order_names
        if len(workers) != len(names) or any(w.name != x for w, x in zip(workers, names, strict=True)):
            self._order_names = [w.name for w in workers]
            self._order = sorted(range(len(workers)), key=self._order_names.__getitem__)
        return [workers[i] for i in self._order]

    def _down_set(self, fleet: FleetView) -> frozenset[str]:
        """The workers reported down since their view was taken."""
        return frozenset(w.name for w in fleet.workers if self.down.get(w.name, -1.0) >= w.reported_at_s)

    def _bounded(self, load: list[float], own: list[float], slow: list[float], names: list[str], pool: str,
                 v: ViewColumns | None = None) -> tuple[float | None, list[int], list[str]]:
        """The load bound over columns (`kernels.bounded`, None when off), the positions kept, the names left out."""
        n = len(load)
        if not self._bound_on or n < 2:
            return None, list(range(n)) if v is None else v.every, []
        counts: list[int] | None = None
        k = 0
        if self._share_window > 0 and bool(self.recent.picks.get(pool)):
            if v is not None:
                counts, k = v.share_counts(names, self.picker.seq, self.recent.counts[pool])
            else:
                seen = self.recent.counts[pool]
                counts = [seen.get(x, 0) for x in names]
                k = sum(counts)
        bound, kept = kernels.bounded(load, own, slow, self._bound_c, TIE_TOLERANCE, counts, k)
        return bound, kept, (kernels.left_out(names, kept) if len(kept) < n else [])

    def _requests_totals(self, req: RouteRequest, cols: Columns) -> list[float]:
        """Totals by the `requests` scorer alone (what power-of-two compares without weighted scorers)."""
        return kernels.totals([SCORERS["requests"](req, cols)], [self._weights.get("requests", 1.0)])

    def _record(self, pool: str, name: str, own: float) -> tuple[str, int] | None:
        """Note `name` as chosen in `pool` for its own cost `own` (tokens); returns the pick that left the window."""
        self.picker.chosen(name)
        return self.recent.add(pool, name, pick_work(own))

    def _dispatch(self, req: RouteRequest, prefix_blocks: int, predicted_cost: float, worker: str,
                  prefill: str | None, now: float) -> None:
        """Reserve `req` in the in-flight ledger (cost in tokens); if configured, note its prompt cached there."""
        uncached = max(req.prompt_tokens - prefix_blocks * req.hash_block_tokens, 0)
        self.inflight.add(Pending(req.request_id, worker, prefill, now, uncached, self._expected, predicted_cost))
        if self._record_dispatch and req.block_hashes:
            self.index.insert(prefill or worker, req.block_hashes)

    # ---- colocated ---------------------------------------------------------------------------

    def _route_mixed_simple(self, req: RouteRequest, now: float, e: Eligible, safe: bool) -> RoutingDecision:
        """Round-robin or random picks (or safe mode): nothing scored, only the chosen worker's signals computed."""
        names = e.names
        scores: dict[str, float]
        kind = "safe-mode"
        if safe and self.safe.action == "round_robin":
            i = self.picker.round_robin(names, "mixed")
            reason = f"safe-mode round-robin {names[i]} ({self.safe.describe()})"
            scores = {}
        else:
            scores = e.zero_scores.copy()  # every total is an empty sum: no scorer has weight
            i, reason, _ = PICKERS[self._picker_kind](self.picker, names, lambda: [], "mixed", self._tie_break)
            if safe:
                reason = f"safe-mode last-known ({self.safe.describe()}); {reason}"
            else:
                kind = PICKER_KINDS[self._picker_kind]
        w, name, dw, per_req = e.ws[i], names[i], self._dw, self._per_req
        load, _ = ledger_load(w, side_load(w, dw, per_req), self.inflight, dw, per_req)
        prefix = self.index.match(name, req.block_hashes)
        self._record("mixed", name, own := own_cost_at(req, prefix, dw, per_req, self._expected))
        self._dispatch(req, prefix, load + own, name, None, now)
        return RoutingDecision(worker=name, scores=scores, reason=reason, safe_mode=safe, kind=kind)

    def _route_mixed(self, req: RouteRequest, now: float, e: Eligible, safe: bool) -> RoutingDecision:
        """A scored (or load-bounded) colocated pick over the view's columns."""
        c, scores, reason, kind = self._pick_mixed(req, now, e)
        if safe:
            reason = f"safe-mode last-known ({self.safe.describe()}); {reason}"
            kind = "safe-mode"
        seq = self.picker.seq
        dropped = self._record("mixed", c.name, c.own)
        if e.vec is not None:
            e.vec.picked(c.name, pick_work(c.own), dropped, seq, self.picker.seq)
        self._dispatch(req, c.prefix_blocks, c.load + c.own, c.name, None, now)
        return RoutingDecision(worker=c.name, scores=scores, reason=reason, safe_mode=safe, kind=kind)

    def _own_and_prefix(self, req: RouteRequest, pos: dict[str, int]) -> tuple[list[float], list[int] | None]:
        """Each worker's own cost of `req` after its cached prefix, and the prefix blocks (None:
        none cached anywhere), for the workers at `pos` (name -> position): one lookup of the
        prompt in the prefix index for them all (`PrefixIndex.match_all`, O(prompt blocks))."""
        dw, per_req, exp, hashes = self._dw, self._per_req, self._expected, req.block_hashes
        n = len(pos)
        own = [own_cost_at(req, 0, dw, per_req, exp)] * n
        prefix: list[int] | None = None
        if hashes:
            for name, k in self.index.match_all(hashes):
                i = pos.get(name)
                if i is not None:
                    if prefix is None:
                        prefix = [0] * n
                    prefix[i] = k
                    own[i] = own_cost_at(req, k, dw, per_req, exp)
        return own, prefix

    def _pick_mixed(self, req: RouteRequest, now: float,
                    e: Eligible) -> tuple[Candidate, Mapping[str, float], str, str]:
        """(chosen candidate, decision scores, reason, kind) by the configured picker over the
        view's columns: the load bound, then each weighted scorer once over the kept workers."""
        v = e.vec
        if v is None:
            v = e.vec = ViewColumns(e, self.params.cost, self._scorers)
        v.refresh(e, self.inflight, self._dw, self._per_req)
        names, n = e.names, len(e.names)
        own, prefix = self._own_and_prefix(req, v.pos)
        slow = self.feedback.factors(names, now)
        if v.weight is not None:  # relative capacity: a worker twice as big looks half as slow
            slow = [f / wt for f, wt in zip(slow, v.weight, strict=True)]
        load = v.load
        bound, kept, excluded = self._bounded(load, own, slow, names, "mixed", v)
        cols = Columns(load, own, slow, v.requests, prefix, v.kv_usage, len(req.block_hashes), kept, e.ws, v.weight)
        every = len(kept) == n
        fixed = v.fixed
        per = {s: (fixed[s] if every else kernels.picked(fixed[s], kept)) if s in fixed else SCORERS[s](req, cols)
               for s in self._scorers}
        columns = list(per.values())
        kept_names = names if every else [names[i] for i in kept]
        totals = kernels.totals(columns, self._scorer_weights) if columns else [0.0] * len(kept)
        kind = self._picker_kind
        if kind == "max":
            j, n_tied = self.picker.max(kept_names, totals, self._tie_break)
            reason = ""
        else:
            def picker_totals() -> list[float]:
                return totals if columns else self._requests_totals(req, cols)

            j, reason, n_tied = PICKERS[kind](self.picker, kept_names, picker_totals, "mixed", self._tie_break)
        i = kept[j]
        c = Candidate(e.ws[i], v.requests[i], load[i], own[i], slow[i], 0 if prefix is None else prefix[i])
        scores: Mapping[str, float] = (ScoreTable(names, self._scorer_columns, v.key_lists, v.where,
                                                  None if every else kept, [totals, *columns])
                                       if columns else dict.fromkeys(kept_names, 0))
        if kind != "max":
            return c, scores, reason, PICKER_KINDS[kind]
        reason, lead = max_reason(self.params, req, c, per, bound, excluded, n_tied)  # type: ignore[arg-type]
        return c, scores, reason, lead

    # ---- prefill/decode pairs: a prefill profile, a decode profile, pair scorers --------------

    def _pair_table(self, req: RouteRequest, ps: list[WorkerView], ds: list[WorkerView]) -> PairTable:
        """The compatible pairs of these side workers (`PairTable`), kept per (model_version, region) while they last."""
        sub = (req.model_version, req.region)
        pt = self._pair_tables.get(sub)
        if pt is None or not pt.matches(ps, ds):
            pt = self._pair_tables[sub] = PairTable(ps, ds)
        return pt

    def _route_pd(self, req: RouteRequest, fleet: FleetView, ws: list[WorkerView], safe: bool) -> RoutingDecision:
        now = fleet.now_s
        sides: list[list[WorkerView]] = []
        for side in ("prefill", "decode"):
            kept, why = self._side_workers(req, fleet, ws, side)
            if not kept:
                return RoutingDecision(worker=None, reason=f"rejected: {side} side: {why}", kind="rejected")
            sides.append(kept)
        pt = self._pair_table(req, sides[0], sides[1])  # only replicas whose KV formats match are ever paired
        if not pt.pi:
            return RoutingDecision(worker=None, reason=f"rejected: {pt.why}", kind="rejected")
        self._links.update(fleet.links)
        links = pt.links(self._links)
        f = self.feedback.factors(pt.names, now)
        n_p, index, exp, (lp, ld) = len(pt.ok_p), self.index, self._expected, pt.loads
        ps, ds = [sides[0][i] for i in pt.ok_p], [sides[1][j] for j in pt.ok_d]
        lp.refresh(ps, self.inflight, self._dw, self._per_req)
        ld.refresh(ds, self.inflight, self._dw, self._per_req)
        terms = (self._dw, self._per_req)
        cp = Side(ps, pt.names[:n_p], f[:n_p], "prefill", req, terms, lp, index, exp)
        cd = Side(ds, pt.names[n_p:], f[n_p:], "decode", req, terms, ld, index, exp)
        reserve = self._kv_reserve
        roomy = [j for j, r in enumerate(cd.room) if r >= reserve] or list(range(len(cd.ws)))
        fit = pt.every if len(roomy) == len(cd.ws) else pt.with_decode(pt.every, roomy)
        pairs = fit if self._links.all_healthy else [k for k in fit if (lk := links[k]) is None or lk.healthy]
        no_link = not pairs
        if no_link:  # soft, like the region filter: the prefill takes a while, a link may be back by then
            pairs = fit
        kp, kd = ("round_robin", "round_robin") if safe and self.safe.action == "round_robin" else self._pd_pickers
        if kp != "max" or kd != "max":
            p, d, reason = self._pick_pd_simple(req, pairs, pt, cp, cd, kp, kd)
            scores: Mapping[str, float] = {}
            kind = PICKER_KINDS[kp if kp != "max" else kd]
        else:
            p, d, scores, reason = self._pick_pd_max(req, pairs, pt, links, cp, cd, roomy)
            kind = "pair"
        return self.commit_pd(req, p, d, scores, reason, kind, safe, no_link, now)

    def commit_pd(self, req: RouteRequest, p: Candidate, d: Candidate, scores: Mapping[str, float], reason: str,
                  kind: str, safe: bool, no_link: bool, now: float) -> RoutingDecision:
        """Send `req` to the chosen (prefill, decode) pair: record both, book the load, say why."""
        if safe:
            reason = f"safe-mode {self.safe.action.replace('_', '-')} ({self.safe.describe()}); {reason}"
            kind = "safe-mode"
        if no_link:
            reason += "; no healthy KV link, sent anyway"
        self._record("prefill", p.name, p.own)
        self._record("decode", d.name, d.own)
        self._dispatch(req, p.prefix_blocks, p.load + p.own, d.name, p.name, now)
        self.incoming.add(req.request_id, d.name, req.prompt_tokens + self._expected)
        return RoutingDecision(worker=d.name, prefill_worker=p.name, scores=scores, reason=reason, safe_mode=safe,
                               kind=kind)

    def _side_workers(self, req: RouteRequest, fleet: FleetView, ws: list[WorkerView],
                      side: str) -> tuple[list[WorkerView], str]:
        """The workers of `side` its profile's filters keep (the policy's eligible ones when the
        profile names no filters), and the reason when none is kept."""
        filters = self._pd_filters[side]
        if filters is None:
            return [w for w in ws if w.role == side], ""
        kept = [w for w in self._by_name(fleet.workers) if w.role == side]
        return apply_filters(req, kept, self._down_set(fleet), filters)

    def _pick_pd_simple(self, req: RouteRequest, pairs: list[int], pt: PairTable, cp: Side, cd: Side,
                        kind_p: str, kind_d: str) -> tuple[Candidate, Candidate, str]:
        """Side by side, when a side's picker is not `max`: the prefill side first, then a decode
        worker paired with it; each by its own picker (`max` over its profile scores, the others
        over outstanding requests: round-robin, random, power-of-two)."""
        def totals(s: Side, at: list[int], side: str, kind: str) -> list[float]:
            cols = s.columns(req, at)
            return self._profile_totals(req, cols, side) if kind == "max" else self._requests_totals(req, cols)

        pi, dj = pt.pi, pt.dj
        at_p = sorted({pi[k] for k in pairs})  # pairs run prefill-major: their first appearances, in order
        pnames = [cp.names[i] for i in at_p]
        i = at_p[PICKERS[kind_p](self.picker, pnames, lambda: totals(cp, at_p, "prefill", kind_p), "prefill",
                                 self._tie_break)[0]]
        at_d = [dj[k] for k in pairs if pi[k] == i]
        dnames = [cd.names[j] for j in at_d]
        j = at_d[PICKERS[kind_d](self.picker, dnames, lambda: totals(cd, at_d, "decode", kind_d), "decode",
                                 self._tie_break)[0]]
        kinds = kind_p.replace("_", "-") if kind_p == kind_d else f"{kind_p.replace('_', '-')}/{kind_d.replace('_', '-')}"
        return self._side_candidate(cp, i, cp.room[i]), self._side_candidate(cd, j, cd.room[j]), (
            f"{kinds} pair {cp.names[i]}->{cd.names[j]}")

    @staticmethod
    def _side_candidate(s: Side, i: int, room: float) -> Candidate:
        return Candidate(s.ws[i], s.requests[i], s.load[i], s.own[i], s.slow[i], s.prefix[i], room)

    def _profile_totals(self, req: RouteRequest, cols: Columns, side: str) -> list[float]:
        """Each candidate's score in [0, 1] by the P/D profile of `side` (weighted mean of its
        scorers, each scoring every candidate in one call)."""
        scorers, weights, wsum = self._profile_terms[side]
        per = [SCORERS[s](req, cols) for s in scorers]
        tot = kernels.totals(per, weights) if per else [0.0] * len(cols.load)
        return [t / wsum for t in tot]

    def _pick_pd_max(self, req: RouteRequest, pairs: list[int], pt: PairTable, links: list[KvLinkView | None],
                     cp: Side, cd: Side, roomy: list[int]) -> tuple[Candidate, Candidate, Mapping[str, float], str]:
        """The best pair: `prefill.weight * prefill score + decode.weight * decode score + weighted
        pair scorers`, over the pairs both sides' load bounds keep (all pairs if none)."""
        pi, dj, reserve = pt.pi, pt.dj, self._kv_reserve
        # KV headroom net of the hand-offs this policy sent that the view cannot show yet (their
        # prefill or KV transfer is still running): the reserve applies to it, kv_room scores it.
        need = req.prompt_tokens + self._expected
        room = [kv_headroom(cd.ws[j], need + self.incoming.tokens(cd.names[j])) for j in roomy]
        room_at = [0.0] * len(cd.ws)
        for x, j in enumerate(roomy):  # index loops, not `zip(strict=True)`: mypyc compiles only a plain zip natively
            room_at[j] = room[x]
        if min(room) < reserve:
            pairs = pt.with_decode(pairs, [j for j in roomy if room_at[j] >= reserve]) or pairs
        # Links degraded below a fraction of the best healthy bandwidth are skipped while another
        # pair is left, before the load bound, so the bound shares work among the workers still
        # reachable instead of pushing it back onto the degraded link.
        floor = self._degraded_fraction * self._links.best
        if self._links.lowest < floor:
            pairs = [k for k in pairs if (lk := links[k]) is None or lk.bandwidth_bytes_per_s >= floor] or pairs
        at_p = list(range(len(cp.ws))) if pairs is pt.every else sorted({pi[k] for k in pairs})
        at_d = roomy if pairs is pt.every else sorted(set(roomy) & {dj[k] for k in pairs})
        kept_p, kept_d = self._bounded_at(cp, at_p, "prefill"), self._bounded_at(cd, at_d, "decode")
        if len(kept_p) < len(at_p) or len(kept_d) < len(at_d):
            on_p, on_d = [False] * len(cp.ws), [False] * len(cd.ws)
            for i in kept_p:
                on_p[i] = True
            for j in kept_d:
                on_d[j] = True
            pairs = [k for k in pairs if on_p[pi[k]] and on_d[dj[k]]] or pairs
        sp = self._profile_totals(req, cp.columns(req, list(range(len(cp.ws)))), "prefill")
        sd = [0.0] * len(cd.ws)
        for x, t in enumerate(self._profile_totals(req, cd.columns(req, roomy, room), "decode")):
            sd[roomy[x]] = t
        totals = pair_totals(req, pairs, pt, links, self._links, sp, sd, self._side_weights, self._pair_scorers, cp, cd)
        x, _ = self.picker.max(pt.keys if pairs is pt.every else [pt.keys[k] for k in pairs], totals,
                               self._tie_break)
        k = pairs[x]
        p, d = self._side_candidate(cp, pi[k], 0.0), self._side_candidate(cd, dj[k], room_at[dj[k]])
        return p, d, pt.scores(pairs, totals), pair_reason(req, p, d, links[k])

    def _bounded_at(self, s: Side, at: list[int], pool: str) -> list[int]:
        """The positions among `at` (of side `s`, ascending) the load bound of `pool` keeps, ascending."""
        if len(at) == len(s.ws):  # every position: the side's own columns, read, not copied
            _, kept, _ = self._bounded(s.load, s.own, s.slow, s.names, pool)
            return kept
        _, kept, _ = self._bounded([s.load[i] for i in at], [s.own[i] for i in at], [s.slow[i] for i in at],
                                   [s.names[i] for i in at], pool)
        return [at[x] for x in kept]

    # ---- feedback ----------------------------------------------------------------------------

    def observe(self, fb: Feedback) -> None:
        self.last_now_s = max(self.last_now_s, fb.now_s)
        self.safe.tick(fb.now_s)
        if isinstance(fb, Dispatched):
            self._observe_dispatch(fb)
        elif isinstance(fb, FirstToken):
            p = self.inflight.get(fb.request_id)
            if p is not None:
                self.feedback.first_token(p.prefill_worker or fb.worker, fb.ttft_s, p.predicted_cost, fb.now_s)
                self.inflight.prefill_done(fb.request_id)
            self.incoming.landed(fb.request_id)
        elif isinstance(fb, Completed):
            self.inflight.pop(fb.request_id)
            self.incoming.landed(fb.request_id)
            self.predictor.completed(fb.request_id, fb.output_tokens)
            self.feedback.completed(fb.worker, fb.tpot_s, fb.output_tokens, fb.now_s)
        elif isinstance(fb, Failed):
            self.inflight.pop(fb.request_id)
            self.incoming.landed(fb.request_id)
            self.predictor.forget(fb.request_id)
            self.feedback.failed(fb.worker, fb.now_s)
        elif isinstance(fb, Cancelled):
            self.inflight.pop(fb.request_id)
            self.incoming.landed(fb.request_id)
            self.predictor.forget(fb.request_id)
        elif isinstance(fb, WorkerDown):
            self._down_version += 1
            self.down[fb.worker] = fb.now_s
            self.index.drop_worker(fb.worker)
        elif isinstance(fb, WorkerUp):
            self._down_version += 1
            self.down.pop(fb.worker, None)
            self.index.drop_worker(fb.worker)
            self.feedback.forget(fb.worker)
        elif isinstance(fb, KvStored):
            self.index.insert(fb.worker, fb.block_hashes)
        elif isinstance(fb, KvEvicted):
            self.index.evict(fb.worker, fb.block_hashes)
        elif isinstance(fb, KvCleared):
            self.index.drop_worker(fb.worker)

    def _observe_dispatch(self, fb: Dispatched) -> None:
        """Confirm a routed request, or adopt one the driver placed itself."""
        p = self.inflight.get(fb.request_id)
        if p is not None and p.worker == fb.worker and p.prefill_worker == fb.prefill_worker:
            return
        self.inflight.add(Pending(fb.request_id, fb.worker, fb.prefill_worker, fb.now_s, fb.prompt_tokens, 0,
                                  float(fb.prompt_tokens)))
        if self._record_dispatch and fb.block_hashes:
            self.index.insert(fb.prefill_worker or fb.worker, fb.block_hashes)

    def report(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "decisions": sum(self.by_reason.values()),
            "rejected": self.rejected,
            "by_reason": dict(sorted(self.by_reason.items())),
            "by_worker": dict(sorted(self.by_worker.items())),
            "safe_mode": self.safe.report(),
            "slowness": self.feedback.snapshot(self.last_now_s),
            "in_flight": len(self.inflight),
            "output_predictor": self.predictor.report(),
        }
