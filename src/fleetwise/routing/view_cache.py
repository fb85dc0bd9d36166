"""The routing policy's view of the fleet, kept between decisions: the workers a view makes
eligible (`Eligible`) and their signals as columns (`ViewColumns`), brought up to date only
where the in-flight ledger changed; `ledger_load`, the one formula of a worker's load.

`fleetwise.routing.policy.ComposedPolicy` builds and reads them; tests/routing/reference_policy.py
recomputes every signal one candidate at a time and checks the decisions are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetwise.core.views import RouteRequest, WorkerView
from fleetwise.routing.plugins import SCORERS, has_token_backlog, side_load, view_load
from fleetwise.routing.signals import VIEW_ONLY_SCORERS, Columns
from fleetwise.routing.state import InFlight

__all__ = ["Eligible", "ViewColumns", "ledger_load", "positions", "same_fields"]

VIEW_ONLY_REQUEST = RouteRequest("", 0, None)
"""The request a view-only scorer (`vector.VIEW_ONLY_SCORERS`, which reads none) is called with."""


def mark_changed(due: list[bool], pos: dict[str, int], changed: list[str]) -> None:
    """Mark due the positions (`pos`: worker name -> position) of the workers named in `changed`."""
    for name in changed:
        i = pos.get(name, -1)
        if i >= 0:
            due[i] = True


def refresh_due(ws: list[WorkerView], due: list[bool], base: list[float], reqs0: list[int], load: list[float],
                requests: list[int], inflight: InFlight, dw: float, per_req: float) -> None:
    """Recompute `load` and `requests` at the due positions from each view's `base` and `reqs0` and
    the in-flight ledger (`ledger_load`)."""
    for i in range(len(ws)):
        if not due[i]:
            continue
        x, n_pend = ledger_load(ws[i], base[i], inflight, dw, per_req)
        load[i] = x
        requests[i] = reqs0[i] + n_pend


def ledger_load(w: WorkerView, base: float, inflight: InFlight, dw: float, per_req: float) -> tuple[float, int]:
    """(load, requests dispatched since the view) of worker `w` in token equivalents: `base` (what
    its view reports, `plugins.view_load`) plus the work this policy sent it since the view was
    taken (its in-flight ledger, `dw` per expected decode token, `per_req` per request); a view
    without token backlogs counts, in their place, every request the ledger holds for it."""
    name = w.name
    n_pend, tok_pend = inflight.since(name, w.reported_at_s, dw)
    x = base
    if not has_token_backlog(w):
        x += inflight.outstanding(name, dw)[1] - tok_pend
    x += tok_pend + per_req * n_pend
    return x, n_pend


def same_fields(old: Sequence[WorkerView], new: Sequence[WorkerView]) -> bool:
    """`new` holds, position for position, views of `old`'s workers with the same name, health,
    model version, region, role and weight: what the filters of `plugins.FIELD_FILTERS` and an
    `Eligible`'s names and weights read. O(workers); a view that is the same object is not read."""
    if len(old) != len(new):
        return False
    for i in range(len(old)):  # not `zip(strict=True)`, which mypyc compiles as a generic call
        a, b = old[i], new[i]
        if a is not b and not (a.name == b.name and a.healthy == b.healthy and a.model_version == b.model_version
                               and a.region == b.region and a.role == b.role and a.weight == b.weight):
            return False
    return True


def positions(workers: Sequence[WorkerView], ws: list[WorkerView]) -> list[int] | None:
    """The position in `workers` of each of `ws` (by name; None when two workers share a name)."""
    at = {w.name: i for i, w in enumerate(workers)}
    return [at[w.name] for w in ws] if len(at) == len(workers) else None


class Eligible:
    """The eligible workers of one view for one (model_version, region), and what every request
    routed on that view reads of them: names, report times (sorted) and view loads. Built from
    the previous view's (`prev`) when the same workers are eligible with the same weights, its
    columns then carried over and brought up to date only where a worker's view changed;
    `renewed` from it without filtering when the new view's filtered fields are the same."""

    __slots__ = ("ws", "why", "names", "reported", "zero_scores", "vec", "weights", "unit", "at")

    names: list[str]
    weights: dict[str, float] | None
    """The workers' weights, or None when they are all equal (picks are then unweighted)."""
    unit: bool
    """Every weight is 1 (signals are divided by none)."""

    def __init__(self, ws: list[WorkerView], why: str, prev: Eligible | None = None, cost: Any = None,
                 at: list[int] | None = None, same_names: bool = False) -> None:
        """`at`: the positions of `ws` in the view's workers; `same_names`: `ws` are views of
        `prev`'s workers, in order, with the same names and weights (`renewed`)."""
        self.ws, self.why, self.at = ws, why, at
        self.reported = sorted(w.reported_at_s for w in ws)
        self.vec: ViewColumns | None = None
        """The workers' signals as columns (built on first use, or carried over from `prev`)."""
        same = False
        if same_names and prev is not None:
            self.names, self.weights, self.unit, same = prev.names, prev.weights, prev.unit, True
        else:
            self.names = [w.name for w in ws]
            self.weights = {w.name: w.weight for w in ws} if len({w.weight for w in ws}) > 1 else None
            self.unit = all(w.weight == 1.0 for w in ws)
            same = prev is not None and prev.names == self.names and (
                [w.weight for w in prev.ws] == [w.weight for w in ws])
        self.zero_scores: dict[str, float] = prev.zero_scores if same and prev is not None else dict.fromkeys(
            self.names, 0)
        """Every worker's total when no scorer has weight (each decision gets a copy)."""
        if same and prev is not None and prev.vec is not None:  # the columns move here: `prev` no longer has them
            self.vec, prev.vec = prev.vec.moved(prev.ws, ws, cost), None

    @staticmethod
    def renewed(prev: Eligible, workers: Sequence[WorkerView], cost: Any) -> Eligible:
        """`prev` (with positions `at`) for a new view `workers` that `same_fields` found equal to
        `prev`'s view: the same positions are eligible, for the same reason, without filtering."""
        at = prev.at
        assert at is not None
        return Eligible([workers[i] for i in at], prev.why, prev, cost, at, True)


class ViewColumns:
    """The eligible workers' signals as columns, kept per view for every decision routed on it:
    each worker's load and outstanding requests (`ledger_load`), recomputed only for the workers
    whose in-flight entries changed (`InFlight.changes_since`), the share check's pick counts,
    plus what depends only on the view (KV usage, weights, view-only scores, score keys)."""

    __slots__ = ("load", "requests", "mark", "base", "reqs0", "kv_usage", "weight", "keys", "key_lists", "where",
                 "pos", "every", "counts", "counts_k", "counts_seq", "fixed", "dirty")

    def __init__(self, e: Eligible, cost: Any, scorers: Sequence[str]) -> None:
        ws = e.ws
        n = len(ws)
        self.base = [view_load(w, cost) for w in ws]
        self.reqs0 = [w.queued_requests + w.running_requests for w in ws]
        self.kv_usage = [w.kv_usage for w in ws]
        self.weight: list[float] | None = None if e.unit else [w.weight for w in ws]
        """Each worker's relative capacity (None: every weight is 1)."""
        self.every = list(range(n))
        """Every position (the kept workers when the load bound keeps all or is off)."""
        full = Columns([0.0] * n, [0.0] * n, [1.0] * n, [0] * n, None, self.kv_usage, 0, self.every, ws)
        self.fixed = {s: SCORERS[s](VIEW_ONLY_REQUEST, full) for s in scorers if s in VIEW_ONLY_SCORERS}
        """Every worker's score by each view-only scorer (`VIEW_ONLY_SCORERS`)."""
        self.keys = {s: [f"{name}.{s}" for name in e.names] for s in scorers}
        self.key_lists = [self.keys[s] for s in scorers]
        self.where: dict[str, tuple[int, int]] = {name: (0, i) for i, name in enumerate(e.names)}
        """`ScoreTable` key -> (column, worker index), later keys winning as in a dict built in order."""
        for k, s in enumerate(scorers, start=1):
            self.where.update((key, (k, i)) for i, key in enumerate(self.keys[s]))
        self.load = [0.0] * n
        self.requests = [0] * n
        self.mark = -1
        """`InFlight.changes_since` position of the last update (-1: never updated)."""
        self.pos = {name: i for i, name in enumerate(e.names)}
        self.counts = [0] * n
        """Each worker's work (tokens) among the recent `mixed` decisions (the load bound's share check)."""
        self.counts_k = 0
        """Their sum."""
        self.counts_seq = -1
        """`PickerState.seq` when `counts` was last brought up to date (-1: never)."""
        self.dirty: list[int] = []
        """Positions whose view changed since the last `refresh` (their ledger signals are due)."""

    def moved(self, old: list[WorkerView], new: list[WorkerView], cost: Any) -> ViewColumns:
        """These columns for a new view of the same workers (`new`, position for position the
        workers of `old`): what a worker's view gives is recomputed only where its `WorkerView`
        is another object, and its ledger signals at the next `refresh`. O(workers) identity
        checks; the work is proportional to the views that changed."""
        changed = [i for i in range(len(new)) if new[i] is not old[i]]
        if not changed:
            return self
        base, reqs0, kv = self.base, self.reqs0, self.kv_usage
        dw, per_req = cost.decode_token_weight, cost.per_request_tokens
        for i in changed:
            w = new[i]
            base[i] = side_load(w, dw, per_req)
            reqs0[i] = w.queued_requests + w.running_requests
            kv[i] = w.kv_usage
        if self.fixed:  # view-only scores: a new list (earlier decisions' score tables hold the old one)
            n = len(new)
            cols = Columns([0.0] * n, [0.0] * n, [1.0] * n, [0] * n, None, kv, 0, changed, new)
            for s, vals in self.fixed.items():
                vals = vals.copy()
                for i, x in zip(changed, SCORERS[s](VIEW_ONLY_REQUEST, cols), strict=True):
                    vals[i] = x
                self.fixed[s] = vals
        self.dirty.extend(changed)
        return self

    def refresh(self, e: Eligible, inflight: InFlight, dw: float, per_req: float) -> None:
        """Bring every worker's load and requests up to date: those whose in-flight entries
        changed since last asked, or whose view changed (`moved`), are recomputed (`ledger_load`;
        `dw`, `per_req`: the cost's decode token weight and per-request tokens)."""
        load, requests, base, reqs0, ws = self.load, self.requests, self.base, self.reqs0, e.ws
        changed, mark = inflight.changes_since(self.mark) if self.mark >= 0 else (None, inflight.changes_since(0)[1])
        self.mark = mark
        n = len(ws)
        due = [changed is None] * n
        if changed is not None:
            mark_changed(due, self.pos, changed)
            for i in self.dirty:
                due[i] = True
        self.dirty = []
        refresh_due(ws, due, base, reqs0, load, requests, inflight, dw, per_req)

    def share_counts(self, names: list[str], seq: int, seen: dict[str, int]) -> tuple[list[int], int]:
        """Each worker's work (tokens) among the recent `mixed` decisions, and their sum (the load
        bound's share check): `counts`, rebuilt from `seen` (the pool's counts) unless the picks
        since (`PickerState.seq` still `seq`) have kept it current (`picked`)."""
        if self.counts_seq != seq:
            self.counts = [seen.get(name, 0) for name in names]
            self.counts_k = sum(self.counts)
            self.counts_seq = seq
        return self.counts, self.counts_k

    def picked(self, name: str, work: int, dropped: tuple[str, int] | None, seq_before: int, seq: int) -> None:
        """`name` was chosen for `work` tokens (`dropped` fell out of the recent window), moving
        `PickerState.seq` from `seq_before` to `seq`: the share counts follow if they were current."""
        if self.counts_seq != seq_before:
            return
        pos = self.pos
        if dropped is not None and dropped[0] in pos:
            self.counts[pos[dropped[0]]] -= dropped[1]
            self.counts_k -= dropped[1]
        self.counts[pos[name]] += work
        self.counts_k += work
        self.counts_seq = seq
