"""What a P/D pair decision keeps between decisions, and its two sides as columns.

`ComposedPolicy._route_pd` (routing/policy.py) reads, per decision, each side's candidates as
columns (`Side`: load, own cost, slowness, prefix, requests, KV room: O(replicas) plus one prefix
lookup, O(prompt blocks)) and the pairs as positions into them. What changes only when the
fleet does is kept:

- `PairTable`: the (prefill, decode) pairs whose KV formats are compatible (`kv_compat`), their
  keys and each pair's KV link view; rebuilt only when a side's workers, model versions or KV
  formats change (a rolling upgrade, a replica down or back);
- `LinkTable`: the view's KV links by (prefill, decode) and the best healthy bandwidth, brought
  up to date only where a new links tuple holds another object (the simulator keeps a link's
  view while its ports are unchanged: `sim/network.py`).

tests/routing/reference_pd.py recomputes every decision from nothing, one candidate and one pair
at a time, and tests/routing/test_pd_fast_path.py checks the decisions are equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetwise.core.views import KvLinkView, RouteRequest, WorkerView, kv_format_of
from fleetwise.routing.pd_scorers import PAIR_SCORERS, PairColumns, kv_headroom
from fleetwise.routing.plugins import own_cost, view_load
from fleetwise.routing.prefix_index import PrefixIndex
from fleetwise.routing.state import InFlight
from fleetwise.routing.vector import Columns
from fleetwise.routing.view_cache import ledger_load
from fleetwise.spec.kv_format import kv_compat

__all__ = ["LinkTable", "PairTable", "Side", "pair_totals"]


def _signature(ws: Sequence[WorkerView]) -> list[tuple[str, Any, str]]:
    """What the pairing of a side's workers depends on: name, declared KV format, model version."""
    return [(w.name, w.kv_format, w.model_version) for w in ws]


class LinkTable:
    """The fleet view's KV link views by (prefill, decode) name, and the best healthy bandwidth
    among them (bytes/s), kept between views: a new links tuple of the same layout is read only
    where it holds another object."""

    __slots__ = ("links", "by_pair", "best", "version", "exact")

    def __init__(self) -> None:
        self.links: tuple[KvLinkView, ...] = ()
        self.by_pair: dict[tuple[str, str], KvLinkView] = {}
        self.best = 0.0
        """The best bandwidth of a healthy link, bytes/s (0 when none is)."""
        self.version = 0
        """Bumped whenever `by_pair` changes."""
        self.exact = True
        """Every (src, dst) appears once in `links` (else every new tuple is read whole)."""

    def update(self, links: tuple[KvLinkView, ...]) -> None:
        """Bring the table to `links`: O(1) for the same tuple, O(links) identity checks plus
        the changed entries for a tuple of the same layout, a rebuild otherwise."""
        old = self.links
        if links is old:
            return
        self.links = links
        self.version += 1
        by = self.by_pair
        same = self.exact and len(links) == len(old)
        if same:
            for i, lk in enumerate(links):
                o = old[i]
                if lk is not o:
                    if lk.src != o.src or lk.dst != o.dst:
                        same = False
                        break
                    by[(lk.src, lk.dst)] = lk
        if not same:
            by = self.by_pair = {(lk.src, lk.dst): lk for lk in links}
            self.exact = len(by) == len(links)
        self.best = max((lk.bandwidth_bytes_per_s for lk in by.values() if lk.healthy), default=0.0)


class PairTable:
    """The compatible (prefill, decode) pairs of one list of workers per side: `pi[k]`, `dj[k]`
    are pair k's positions among the prefill and decode workers that pair at all (`ok_p`,
    `ok_d`: positions in the side lists), in prefill-major order; `why` says why none pairs."""

    __slots__ = ("sig_p", "sig_d", "ok_p", "ok_d", "pi", "dj", "keys", "names", "why", "_tkeys", "_links",
                 "_links_of")

    def __init__(self, ps: Sequence[WorkerView], ds: Sequence[WorkerView]) -> None:
        self.sig_p, self.sig_d = _signature(ps), _signature(ds)
        fp, fd = [kv_format_of(w) for w in ps], [kv_format_of(w) for w in ds]
        ok = [[kv_compat(a, b).ok for b in fd] for a in fp]
        self.ok_p = [i for i in range(len(ps)) if any(ok[i])]
        self.ok_d = [j for j in range(len(ds)) if any(row[j] for row in ok)]
        at_d = {j: n for n, j in enumerate(self.ok_d)}
        self.pi: list[int] = []
        self.dj: list[int] = []
        for n, i in enumerate(self.ok_p):
            for j in self.ok_d:
                if ok[i][j]:
                    self.pi.append(n)
                    self.dj.append(at_d[j])
        pn, dn = [ps[i].name for i in self.ok_p], [ds[j].name for j in self.ok_d]
        self.keys = [f"{pn[i]}->{dn[j]}" for i, j in zip(self.pi, self.dj, strict=True)]
        """Each pair's `"<prefill>-><decode>"` (how its score is keyed)."""
        self._tkeys = [(pn[i], dn[j]) for i, j in zip(self.pi, self.dj, strict=True)]
        self.names = pn + dn
        """The paired workers' names, prefill side first (one feedback lookup for both sides)."""
        self.why = "" if self.pi or not ps or not ds else (
            f"no decode replica can take a prefill replica's KV ({ps[0].name}->{ds[0].name}: "
            f"{kv_compat(fp[0], fd[0]).reason})")
        self._links: list[KvLinkView | None] = []
        self._links_of: tuple[Any, int] = (None, -1)

    def matches(self, ps: Sequence[WorkerView], ds: Sequence[WorkerView]) -> bool:
        """The same workers on each side, with the same model versions and KV formats."""
        return _signature(ps) == self.sig_p and _signature(ds) == self.sig_d

    def links(self, table: LinkTable) -> list[KvLinkView | None]:
        """Each pair's link view in `table` (None: the view has none), read again only when it changed."""
        if self._links_of[0] is not table or self._links_of[1] != table.version:
            get = table.by_pair.get
            self._links = [get(t) for t in self._tkeys]
            self._links_of = (table, table.version)
        return self._links


class Side:
    """One P/D side's paired workers (`PairTable.ok_p` or `ok_d`) with their signals as columns."""

    __slots__ = ("ws", "names", "load", "own", "slow", "prefix", "requests", "room")

    def __init__(self, ws: list[WorkerView], names: list[str], slow: list[float], side: str, req: RouteRequest,
                 cost: Any, inflight: InFlight, index: PrefixIndex, expected: int) -> None:
        """`slow`: each worker's feedback factor; `expected`: the request's expected output tokens."""
        dw, per_req = cost.decode_token_weight, cost.per_request_tokens
        n = len(ws)
        self.ws, self.names = ws, names
        self.load = [0.0] * n
        self.requests = [0] * n
        for i, w in enumerate(ws):
            x, n_pend = ledger_load(w, view_load(w, cost, side), inflight, dw, per_req)
            self.load[i] = x
            self.requests[i] = w.queued_requests + w.running_requests + n_pend
        self.slow = [f / w.weight for f, w in zip(slow, ws, strict=True)]
        self.prefix = [0] * n
        self.room = [0.0] * n
        if side == "prefill":
            self.own = [own_cost(req, 0, cost, 0)] * n
            if req.block_hashes:  # one lookup for every worker: O(prompt blocks)
                pos = {name: i for i, name in enumerate(names)}
                for name, k in index.match_all(req.block_hashes):
                    i = pos.get(name, -1)
                    if i >= 0:
                        self.prefix[i] = k
                        self.own[i] = own_cost(req, k, cost, 0)
        else:
            self.own = [dw * expected + per_req] * n
            need = req.prompt_tokens + expected
            self.room = [kv_headroom(w, need) for w in ws]

    def columns(self, req: RouteRequest, at: list[int], room: list[float] | None = None) -> Columns:
        """The workers at positions `at` as scorer columns, every one kept (`room`: their KV room, else `self.room`'s)."""
        ws = [self.ws[i] for i in at]
        return Columns([self.load[i] for i in at], [self.own[i] for i in at], [self.slow[i] for i in at],
                       [self.requests[i] for i in at], [self.prefix[i] for i in at], [w.kv_usage for w in ws],
                       len(req.block_hashes), list(range(len(at))), ws, [w.weight for w in ws],
                       [self.room[i] for i in at] if room is None else room)


def pair_totals(req: RouteRequest, pairs: list[int], pt: PairTable, links: list[KvLinkView | None], best: float,
                sp: list[float], sd: list[float], weights: tuple[float, float], pair_scorers: dict[str, float],
                ps: Side, ds: Side) -> list[float]:
    """Each pair's score: `prefill weight * sp[its prefill] + decode weight * sd[its decode]`, then
    each weighted pair scorer's term in turn (`sp`, `sd`: the sides' profile totals by position)."""
    pi, dj = pt.pi, pt.dj
    wp, wd = weights
    totals = [wp * sp[pi[k]] + wd * sd[dj[k]] for k in pairs]
    terms = [(wt, s) for s, wt in pair_scorers.items() if wt > 0]
    if terms:
        cols = PairColumns([ps.ws[pi[k]] for k in pairs], [ds.ws[dj[k]] for k in pairs], [links[k] for k in pairs],
                           best)
        for wt, s in terms:
            vals = PAIR_SCORERS[s](req, cols)
            totals = [t + wt * v for t, v in zip(totals, vals, strict=True)]
    return totals
