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

The module is compiled with mypyc (setup.py `COMPILED`): its classes are plain classes with
`__slots__`, which mypyc makes native classes. `PairColumns`, the dataclass pair-scorer plugins
read, stays in the uncompiled `pd_scorers.py`, so plugins build and read it as an ordinary
dataclass whether or not this module was compiled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fleetwise.core.views import KvLinkView, RouteRequest, WorkerView, kv_format_of
from fleetwise.routing.pd_scorers import LINK_ONLY_PAIR_SCORERS, PAIR_SCORERS, PairColumns
from fleetwise.routing.plugins import kv_headroom, own_cost_at, side_load
from fleetwise.routing.prefix_index import PrefixIndex
from fleetwise.routing.signals import Columns
from fleetwise.routing.state import InFlight
from fleetwise.routing.vector import ScoreTable
from fleetwise.routing.view_cache import mark_changed, refresh_due
from fleetwise.spec.kv_format import kv_compat

__all__ = ["LinkTable", "PairTable", "Side", "SideLoads", "pair_totals"]


def _signature(ws: Sequence[WorkerView]) -> list[tuple[str, Any, str]]:
    """What the pairing of a side's workers depends on: name, declared KV format, model version."""
    return [(w.name, w.kv_format, w.model_version) for w in ws]


def _same_signature(ws: Sequence[WorkerView], seen: Sequence[WorkerView], sig: list[tuple[str, Any, str]]) -> bool:
    """`_signature(ws) == sig`, reading only the views that are not the same objects as `seen`'s
    (views whose signature was `sig`, position for position)."""
    n = len(ws)
    if n != len(sig):
        return False
    same = len(seen) == n
    for i in range(n):
        w = ws[i]
        if same and w is seen[i]:
            continue
        name, fmt, version = sig[i]
        # Field by field, the format by identity first: a view's format is its replica's very
        # object, and the tuple comparison called the interpreted dataclass `__eq__` every time.
        if w.name != name or w.model_version != version or (w.kv_format is not fmt and w.kv_format != fmt):
            return False
    return True


class LinkTable:
    """The fleet view's KV link views by (prefill, decode) name, and the best healthy bandwidth
    among them (bytes/s), kept between views: a new links tuple of the same layout is read only
    where it holds another object."""

    __slots__ = ("links", "by_pair", "best", "lowest", "all_healthy", "version", "exact")

    def __init__(self) -> None:
        self.links: tuple[KvLinkView, ...] = ()
        self.by_pair: dict[tuple[str, str], KvLinkView] = {}
        self.best = 0.0
        """The best bandwidth of a healthy link, bytes/s (0 when none is)."""
        self.lowest = math.inf
        """The lowest bandwidth of any link, bytes/s (inf without links)."""
        self.all_healthy = True
        """No link is down."""
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
        best, lowest, ok = 0.0, math.inf, True
        for lk in by.values():
            bw = lk.bandwidth_bytes_per_s
            if lk.healthy:
                best = bw if bw > best else best
            else:
                ok = False
            lowest = bw if bw < lowest else lowest
        self.best, self.lowest, self.all_healthy = best, lowest, ok


class PairTable:
    """The compatible (prefill, decode) pairs of one list of workers per side: `pi[k]`, `dj[k]`
    are pair k's positions among the prefill and decode workers that pair at all (`ok_p`,
    `ok_d`: positions in the side lists), in prefill-major order; `why` says why none pairs."""

    __slots__ = ("sig_p", "sig_d", "ok_p", "ok_d", "pi", "dj", "keys", "names", "why", "every", "where", "loads",
                 "_ws", "_seen",
                 "_tkeys", "_links", "_links_of", "_link_scores")

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
        self.every = list(range(len(self.pi)))
        """Every pair (a decision's pairs are this very list while no filter drops one)."""
        self.where = {key: (0, k) for k, key in enumerate(self.keys)}
        """Pair key -> (0, pair): a `ScoreTable` of pair totals reads its entries by it."""
        self.loads = (SideLoads("prefill", pn), SideLoads("decode", dn))
        """Each side's ledger signals, kept between decisions."""
        self._ws = (ps, ds, [ps[i] for i in self.ok_p], [ds[j] for j in self.ok_d])
        """The side lists the table was built from, and the paired workers of each."""
        self._seen: tuple[Sequence[WorkerView], Sequence[WorkerView]] = (ps, ds)
        """The side lists last found to match (`sig_p`, `sig_d`)."""
        self._links: list[KvLinkView | None] = []
        self._links_of: tuple[Any, int] = (None, -1)
        self._link_scores: dict[str, list[float]] = {}
        """Per link-only pair scorer (`LINK_ONLY_PAIR_SCORERS`): every pair's score for `_links_of`."""

    def matches(self, ps: Sequence[WorkerView], ds: Sequence[WorkerView]) -> bool:
        """The same workers on each side, with the same model versions and KV formats (a view
        that is the very object last matched is not read again)."""
        if _same_signature(ps, self._seen[0], self.sig_p) and _same_signature(ds, self._seen[1], self.sig_d):
            self._seen = (ps, ds)
            return True
        return False

    def links(self, table: LinkTable) -> list[KvLinkView | None]:
        """Each pair's link view in `table` (None: the view has none), read again only when it changed."""
        if self._links_of[0] is not table or self._links_of[1] != table.version:
            get = table.by_pair.get
            self._links = [get(t) for t in self._tkeys]
            self._links_of = (table, table.version)
            self._link_scores = {}
        return self._links

    def with_decode(self, pairs: list[int], decode: list[int]) -> list[int]:
        """The pairs among `pairs` whose decode position is in `decode`."""
        keep = [False] * len(self.ok_d)
        for j in decode:
            keep[j] = True
        dj = self.dj
        return [k for k in pairs if keep[dj[k]]]

    def link_scores(self, req: RouteRequest, name: str, table: LinkTable) -> list[float]:
        """Every pair's score by the link-only pair scorer `name`, computed once per link views."""
        vals = self._link_scores.get(name)
        if vals is None:
            links = self.links(table)
            ps, ds = self._ws[2], self._ws[3]
            cols = PairColumns([ps[i] for i in self.pi], [ds[j] for j in self.dj], links, table.best)
            vals = self._link_scores[name] = PAIR_SCORERS[name](req, cols)
        return vals

    def scores(self, pairs: list[int], totals: list[float]) -> Mapping[str, float]:
        """The decision's scores: `"<prefill>-><decode>"` -> its total (rounded when read) for each of `pairs`."""
        return ScoreTable(self.keys, {}, [], self.where, None if pairs is self.every else pairs, [totals])


class SideLoads:
    """One P/D side's ledger signals (`ledger_load`: each worker's load and outstanding requests),
    kept between decisions as `view_cache.ViewColumns` keeps a colocated view's: recomputed only
    for the workers whose view changed (another `WorkerView` object) or whose in-flight entries
    did (`InFlight.changes_since`)."""

    __slots__ = ("side", "pos", "ws", "base", "reqs0", "load", "requests", "mark")

    def __init__(self, side: str, names: list[str]) -> None:
        self.side = side
        self.pos = {name: i for i, name in enumerate(names)}
        self.ws: list[WorkerView] = []
        self.base: list[float] = []
        """Each worker's view load (`view_load` of its side)."""
        self.reqs0: list[int] = []
        """Each worker's queued + running requests (from its view)."""
        self.load: list[float] = []
        self.requests: list[int] = []
        self.mark = -1
        """`InFlight.changes_since` position of the last refresh (-1: never refreshed)."""

    def refresh(self, ws: list[WorkerView], inflight: InFlight, dw: float, per_req: float) -> None:
        """Bring the columns to the views `ws` (the side's paired workers, in order) and the ledger
        (`dw`, `per_req`: the cost's decode token weight and per-request tokens)."""
        side = self.side
        n, old = len(ws), self.ws
        due = [True] * n  # the positions whose ledger signals are recomputed
        if self.mark < 0 or len(old) != n:
            self.base = [side_load(w, dw, per_req, side) for w in ws]
            self.reqs0 = [w.queued_requests + w.running_requests for w in ws]
            self.load, self.requests = [0.0] * n, [0] * n
            self.mark = inflight.changes_since(0)[1]
        else:
            changed, self.mark = inflight.changes_since(self.mark)
            if changed is not None:
                due = [False] * n
                mark_changed(due, self.pos, changed)
            base, reqs0 = self.base, self.reqs0
            for i in range(n):
                w = ws[i]
                if w is not old[i]:
                    base[i] = side_load(w, dw, per_req, side)
                    reqs0[i] = w.queued_requests + w.running_requests
                    due[i] = True
        self.ws = ws
        refresh_due(ws, due, self.base, self.reqs0, self.load, self.requests, inflight, dw, per_req)


class Side:
    """One P/D side's paired workers (`PairTable.ok_p` or `ok_d`) with their signals as columns."""

    __slots__ = ("ws", "names", "load", "own", "slow", "prefix", "requests", "room")

    def __init__(self, ws: list[WorkerView], names: list[str], slow: list[float], side: str, req: RouteRequest,
                 cost: tuple[float, float], loads: SideLoads, index: PrefixIndex, expected: int) -> None:
        """`slow`: each worker's feedback factor; `cost`: the cost's decode token weight and
        per-request tokens; `loads`: the side's ledger signals, brought up to date; `expected`: the
        request's expected output tokens."""
        dw, per_req = cost
        n = len(ws)
        self.ws, self.names = ws, names
        self.load, self.requests = loads.load, loads.requests
        self.slow = [slow[i] / ws[i].weight for i in range(n)]  # not `zip(strict=True)`: a generic call compiled
        self.prefix = [0] * n
        self.room = [0.0] * n
        if side == "prefill":
            self.own = [own_cost_at(req, 0, dw, per_req, 0)] * n
            if req.block_hashes:  # one lookup for every worker: O(prompt blocks)
                pos = {name: i for i, name in enumerate(names)}
                for name, k in index.match_all(req.block_hashes):
                    i = pos.get(name, -1)
                    if i >= 0:
                        self.prefix[i] = k
                        self.own[i] = own_cost_at(req, k, dw, per_req, 0)
        else:
            self.own = [dw * expected + per_req] * n
            need = req.prompt_tokens + expected
            self.room = [kv_headroom(w, need) for w in ws]

    def columns(self, req: RouteRequest, at: list[int], room: list[float] | None = None) -> Columns:
        """The workers at positions `at` (ascending) as scorer columns, every one kept (`room`:
        their KV room, else `self.room`'s). At every position the side's own lists are passed,
        not copies (scorers read their columns)."""
        if len(at) == len(self.ws):
            ws = self.ws
            return Columns(self.load, self.own, self.slow, self.requests, self.prefix, [w.kv_usage for w in ws],
                           len(req.block_hashes), at, ws, [w.weight for w in ws], self.room if room is None else room)
        ws = [self.ws[i] for i in at]
        return Columns([self.load[i] for i in at], [self.own[i] for i in at], [self.slow[i] for i in at],
                       [self.requests[i] for i in at], [self.prefix[i] for i in at], [w.kv_usage for w in ws],
                       len(req.block_hashes), list(range(len(at))), ws, [w.weight for w in ws],
                       [self.room[i] for i in at] if room is None else room)


def pair_totals(req: RouteRequest, pairs: list[int], pt: PairTable, links: list[KvLinkView | None],
                table: LinkTable, sp: list[float], sd: list[float], weights: tuple[float, float],
                pair_scorers: dict[str, float], ps: Side, ds: Side) -> list[float]:
    """Each pair's score: `prefill weight * sp[its prefill] + decode weight * sd[its decode]`, then
    each weighted pair scorer's term in turn (`sp`, `sd`: the sides' profile totals by position).
    A link-only pair scorer is read from every pair's scores, kept per link views (`PairTable.link_scores`)."""
    pi, dj = pt.pi, pt.dj
    wp, wd = weights
    every = pairs is pt.every
    terms: list[tuple[float, list[float], bool]] = []
    """(weight, scores, whether the scores are every pair's rather than `pairs`')."""
    cols: PairColumns | None = None
    for s, wt in pair_scorers.items():
        if wt <= 0:
            continue
        if s in LINK_ONLY_PAIR_SCORERS:
            terms.append((wt, pt.link_scores(req, s, table), True))
            continue
        if cols is None:
            cols = PairColumns([ps.ws[pi[k]] for k in pairs], [ds.ws[dj[k]] for k in pairs],
                               [links[k] for k in pairs], table.best)
        terms.append((wt, PAIR_SCORERS[s](req, cols), every))
    if len(terms) == 1 and terms[0][2]:  # the default: one pass, `(a + b) + c` as the loop below sums it
        wt, vals, _ = terms[0]
        if every:
            return [wp * sp[pi[k]] + wd * sd[dj[k]] + wt * vals[k] for k in range(len(pi))]
        return [wp * sp[pi[k]] + wd * sd[dj[k]] + wt * vals[k] for k in pairs]
    totals = ([wp * sp[pi[k]] + wd * sd[dj[k]] for k in range(len(pi))] if every
              else [wp * sp[pi[k]] + wd * sd[dj[k]] for k in pairs])
    for wt, vals, whole in terms:
        if whole and not every:
            vals = [vals[k] for k in pairs]
        totals = [totals[k] + wt * vals[k] for k in range(len(totals))]
    return totals
