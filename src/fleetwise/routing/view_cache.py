"""The routing policy's per-view caches: the workers a view makes eligible (`Eligible`) and the
columns fast path's per-worker signals kept between decisions on one view (`ViewColumns`),
refreshed only where the in-flight ledger changed; `ScoreKeys`, the memoised score keys.

`fleetwise.routing.policy.ComposedPolicy` builds and reads them; the numbers are the ones its
per-candidate path computes (tests/routing compare the two).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fleetwise.core.views import RouteRequest, WorkerView
from fleetwise.routing.plugins import SCORERS, has_token_backlog, view_load
from fleetwise.routing.state import InFlight
from fleetwise.routing.vector import SCORE_DIGITS, VIEW_ONLY_SCORERS, Columns

__all__ = ["Eligible", "ScoreKeys", "ViewColumns", "rounded_scores"]


class Eligible:
    """The eligible workers of one view for one (model_version, region), and what every request
    routed on that view reads of them: names, report times (sorted) and view loads."""

    __slots__ = ("ws", "why", "names", "reported", "base", "backlog", "zero_scores", "vec", "weights", "unit")

    def __init__(self, ws: list[WorkerView], why: str) -> None:
        self.ws, self.why = ws, why
        self.names = [w.name for w in ws]
        self.reported = sorted(w.reported_at_s for w in ws)
        self.base: list[tuple[float, int]] | None = None
        self.backlog = True
        """Every view reports its token backlogs (else signals fall back to the ledger)."""
        self.zero_scores: dict[str, float] = dict.fromkeys(self.names, 0)
        """Every worker's total when no scorer has weight (each decision gets a copy)."""
        self.vec: ViewColumns | None = None
        """The array fast path's per-view state (built on first use)."""
        self.weights: dict[str, float] | None = (
            {w.name: w.weight for w in ws} if len({w.weight for w in ws}) > 1 else None)
        """The workers' weights, or None when they are all equal (picks are then unweighted)."""
        self.unit = all(w.weight == 1.0 for w in ws)
        """Every weight is 1 (the columns fast path divides by none)."""


class ViewColumns:
    """What the columns fast path (`ComposedPolicy` with a `max` picker) keeps per view: each
    worker's load and outstanding requests as `_candidate` computes them, recomputed only for the
    workers whose in-flight entries changed (`InFlight.changes_since`), the share check's pick
    counts, plus what depends only on the view (KV usage and view-only scores, score keys,
    positions)."""

    __slots__ = ("load", "requests", "mark", "base", "reqs0", "backlog", "kv_usage", "keys", "key_lists", "where",
                 "pos", "every", "counts", "counts_k", "counts_seq", "fixed")

    def __init__(self, e: Eligible, cost: Any, scorers: list[str], req: RouteRequest) -> None:
        ws = e.ws
        n = len(ws)
        self.base = [view_load(w, cost) for w in ws]
        self.reqs0 = [w.queued_requests + w.running_requests for w in ws]
        self.backlog = [has_token_backlog(w) for w in ws]
        self.kv_usage = [w.kv_usage for w in ws]
        self.every = list(range(n))
        """Every position (the kept workers when the load bound keeps all or is off)."""
        full = Columns([0.0] * n, [0.0] * n, [1.0] * n, [0] * n, None, self.kv_usage, 0, self.every)
        self.fixed = {s: SCORERS[s](req, full) for s in scorers if s in VIEW_ONLY_SCORERS}
        """Every worker's score by each view-only scorer (`VIEW_ONLY_SCORERS`)."""
        self.keys = {s: [f"{name}.{s}" for name in e.names] for s in scorers}
        self.key_lists = [self.keys[s] for s in scorers]
        self.where: dict[str, tuple[int, int]] = {name: (0, i) for i, name in enumerate(e.names)}
        """`ScoreTable` key -> (column, worker index), later keys winning as in the reference dict."""
        for k, s in enumerate(scorers, start=1):
            self.where.update((key, (k, i)) for i, key in enumerate(self.keys[s]))
        self.load = [0.0] * n
        self.requests = [0] * n
        self.mark = -1
        """`InFlight.changes_since` position of the last update (-1: never updated)."""
        self.pos = {name: i for i, name in enumerate(e.names)}
        self.counts = [0] * n
        """Each worker's picks among the recent `mixed` decisions (the load bound's share check)."""
        self.counts_k = 0
        """Their sum."""
        self.counts_seq = -1
        """`PickerState.seq` when `counts` was last brought up to date (-1: never)."""


    def refresh(self, e: Eligible, inflight: InFlight, cost: Any) -> None:
        """Bring every worker's load and requests up to date: those whose in-flight entries
        changed since last asked are recomputed as `ComposedPolicy._candidate` does."""
        dw, per_req = cost.decode_token_weight, cost.per_request_tokens
        since, outstanding = inflight.since, inflight.outstanding
        load, requests = self.load, self.requests
        changed, mark = inflight.changes_since(self.mark) if self.mark >= 0 else (None, inflight.changes_since(0)[1])
        self.mark = mark
        pos = self.pos
        todo: Any = range(len(e.ws)) if changed is None else [pos[n] for n in dict.fromkeys(changed) if n in pos]
        for i in todo:
            w = e.ws[i]
            name = w.name
            n_pend, tok_pend = since(name, w.reported_at_s, dw)
            x = self.base[i]
            if not self.backlog[i]:
                x += outstanding(name, dw)[1] - tok_pend
            x += tok_pend + per_req * n_pend
            load[i] = x
            requests[i] = self.reqs0[i] + n_pend

    def share_counts(self, names: list[str], seq: int, seen: Counter[str]) -> tuple[list[int], int]:
        """Each worker's picks among the recent `mixed` decisions, and their sum (as
        `plugins.load_bound` counts them): `counts`, rebuilt from `seen` (the pool's counts) unless
        the picks since (`PickerState.seq` still `seq`) have kept it current."""
        if self.counts_seq != seq:
            self.counts = [seen[name] for name in names]  # a Counter: 0 for a name not seen
            self.counts_k = sum(self.counts)
            self.counts_seq = seq
        return self.counts, self.counts_k


class ScoreKeys(dict[str, str]):
    """`<worker>.<scorer>` score keys of one scorer, built once per worker."""

    def __init__(self, scorer: str) -> None:
        super().__init__()
        self.scorer = scorer

    def __missing__(self, worker: str) -> str:
        key = self[worker] = f"{worker}.{self.scorer}"
        return key


def rounded_scores(totals: dict[str, float], per: dict[str, dict[str, float]],
                   keys_of: dict[str, ScoreKeys]) -> dict[str, float]:
    """A decision's scores: totals, then `<worker>.<scorer>` per scorer (`per`), to
    `SCORE_DIGITS` places; `keys_of` memoises each scorer's keys."""
    scores = {k: round(v, SCORE_DIGITS) for k, v in totals.items()}
    for s, vals in per.items():
        keys = keys_of.get(s)
        if keys is None:
            keys = keys_of[s] = ScoreKeys(s)
        for k, v in vals.items():
            scores[keys[k]] = round(v, SCORE_DIGITS)
    return scores
