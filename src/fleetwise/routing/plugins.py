"""Routing plugins: filters, scorers and pickers, composed by `ComposedPolicy`.

- A filter keeps the workers a request may go to, or says why none may.
- A scorer maps each candidate to [0, 1] (higher is better); the policy sums them by weight.
- A picker chooses one candidate from the totals (max with a seeded tie-break, round-robin,
  random, power-of-two).

Signals come precomputed in `Candidate` (load, this request's own cost, slowness, prefix match);
scorers read them as `vector.Columns` (one list per signal), so every scorer is a pure function
of its inputs, easy to test with exact numbers, and fast on the default policy's columns path. Parameter
models live in `fleetwise.spec.routing` (each plugin's `Params`).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fleetwise.core.views import RouteRequest, WorkerView
from fleetwise.routing import kernels
from fleetwise.routing.vector import Columns
from fleetwise.spec.routing import CostParams, LoadBoundParams
from fleetwise.spec.routing_plugins import ROUTING_PLUGINS

__all__ = [
    "FILTERS",
    "PICKERS",
    "SCORERS",
    "Candidate",
    "PickerState",
    "apply_filters",
    "candidate_columns",
    "clamp01",
    "has_token_backlog",
    "load_bound",
    "own_cost",
    "score_candidates",
    "weighted_totals",
]


@dataclass(slots=True)
class Candidate:
    """One eligible worker with the signals the scorers read."""

    view: WorkerView
    requests: int
    """Queued + running (from the view) + dispatched since the view was taken."""
    load: float
    """Token-equivalent work already ahead on the worker (view + own in-flight estimate)."""
    own: float
    """This request's token-equivalent cost on this worker (uncached prompt, decode, overhead)."""
    slowness: float = 1.0
    """Feedback factor relative to the fleet (1 = average), divided by the worker's weight."""
    prefix_blocks: int = 0
    """Leading prompt blocks the prefix index says this worker holds."""
    kv_room: float = 0.0
    """KV fraction left after admitting the request (decode candidates of a P/D fleet; 0 elsewhere)."""

    @property
    def name(self) -> str:
        return self.view.name

    @property
    def cost(self) -> float:
        """Predicted cost of sending the request here: `(load + own) * slowness`."""
        return (self.load + self.own) * self.slowness

    @property
    def current(self) -> float:
        """Work already ahead, corrected by slowness: `load * slowness`."""
        return self.load * self.slowness


def clamp01(x: float) -> float:
    """Clamp to [0, 1]; NaN counts as 0."""
    return 0.0 if not x > 0 else min(1.0, float(x))


def _clamp01(x: float) -> float:
    """`clamp01` of a float (the scorers' hot path: no conversion, no `min` call)."""
    return 0.0 if not x > 0 else (x if x < 1.0 else 1.0)


def own_cost(req: RouteRequest, cached_blocks: int, cost: CostParams, decode_tokens: float) -> float:
    """`max(prompt - cached_blocks * hash_block_tokens, 0) + decode_token_weight * decode_tokens + per_request`.

    `cached_blocks` counts matched entries of `req.block_hashes`, each covering
    `req.hash_block_tokens` prompt tokens (not the engine's KV block size); `decode_tokens` is
    the expected output (the policy's prediction; 0 on a prefill-only worker).
    """
    uncached = max(req.prompt_tokens - cached_blocks * req.hash_block_tokens, 0)
    return uncached + cost.decode_token_weight * decode_tokens + cost.per_request_tokens


def view_load(w: WorkerView, cost: CostParams) -> float:
    """Work a view reports: `queued_prefill + dw * running_decode + per_request * (queued + running)`
    (a token backlog the view lacks counts 0: see `has_token_backlog`)."""
    return (
        (w.queued_prefill_tokens or 0)
        + cost.decode_token_weight * (w.running_decode_tokens or 0)
        + cost.per_request_tokens * (w.queued_requests + w.running_requests)
    )


def has_token_backlog(w: WorkerView) -> bool:
    """The view reports both token backlogs (the simulator's and the emulator's do; a real vLLM
    `/metrics` does not). Without them the `load` scorer and the load bound count, in their
    place, the tokens of every request the policy's in-flight ledger holds for the worker."""
    return w.queued_prefill_tokens is not None and w.running_decode_tokens is not None


TIE_TOLERANCE = 1e-9
"""Totals (and loads against the load bound) this close count as equal: the same scores summed in
another order differ by about 1e-16 relative, far below it; real differences are far above."""


# ---- filters: (request, workers) -> (kept, reason when nothing is kept) ----------------------

FilterFn = Callable[[RouteRequest, list[WorkerView], frozenset[str]], tuple[list[WorkerView], str]]


@ROUTING_PLUGINS.implements("filter", "healthy")
def _healthy(req: RouteRequest, ws: list[WorkerView], down: frozenset[str]) -> tuple[list[WorkerView], str]:
    kept = [w for w in ws if w.healthy and w.name not in down]
    return kept, "no healthy worker"


@ROUTING_PLUGINS.implements("filter", "model_version")
def _model_version(req: RouteRequest, ws: list[WorkerView], down: frozenset[str]) -> tuple[list[WorkerView], str]:
    if req.model_version is None:
        return ws, ""
    have = sorted({w.model_version for w in ws})
    kept = [w for w in ws if w.model_version == req.model_version]
    return kept, f"no worker serves model_version {req.model_version!r} (have {', '.join(have) or 'none'})"


@ROUTING_PLUGINS.implements("filter", "region")
def _region(req: RouteRequest, ws: list[WorkerView], down: frozenset[str]) -> tuple[list[WorkerView], str]:
    """Soft: prefer the request's region, fall back to every region rather than reject."""
    if req.region is None:
        return ws, ""
    kept = [w for w in ws if w.region == req.region]
    return (kept or ws), ""


@ROUTING_PLUGINS.implements("filter", "role")
def _role(req: RouteRequest, ws: list[WorkerView], down: frozenset[str]) -> tuple[list[WorkerView], str]:
    """Keep mixed workers, or prefill and decode workers when the fleet is disaggregated."""
    pd = [w for w in ws if w.role != "mixed"]
    has_pd = any(w.role == "prefill" for w in pd) and any(w.role == "decode" for w in pd)
    mixed = [w for w in ws if w.role == "mixed"]
    return (mixed or (pd if has_pd else [])), "no mixed worker and no complete prefill/decode pool"


FILTERS: dict[str, FilterFn] = ROUTING_PLUGINS.implementations("filter")
"""Every filter by name (the registry's live mapping)."""


# ---- scorers: columns -> the kept workers' scores in [0, 1] -----------------------------------

ScorerFn = Callable[[RouteRequest, Columns], list[float]]
"""A scorer: the request and the candidates' `Columns` -> one score in [0, 1] per worker of
`Columns.kept`, in that order. One implementation serves the default policy's columns fast path
and every per-candidate path (`score_candidates`)."""


@ROUTING_PLUGINS.implements("scorer", "load")
def score_load(req: RouteRequest, c: Columns) -> list[float]:
    """`min cost / cost`, cost `(load + own) * slowness`: 1 for the cheapest worker, 0.5 for one twice as expensive."""
    return kernels.load_scores(c.load, c.own, c.slowness, c.kept)


@ROUTING_PLUGINS.implements("scorer", "requests")
def score_requests(req: RouteRequest, c: Columns) -> list[float]:
    """`min r / r` with `r = (requests + 1) / weight`: fewest outstanding requests per unit of
    weight scores 1 (with equal weights, `(min requests + 1) / (requests + 1)`)."""
    w = c.weight
    xs = [float(r + 1) for r in c.requests] if w is None else [(r + 1) / x for r, x in zip(c.requests, w, strict=True)]
    return kernels.min_ratio_scores(xs, c.kept)


@ROUTING_PLUGINS.implements("scorer", "prefix")
def score_prefix(req: RouteRequest, c: Columns) -> list[float]:
    """Cached fraction of the prompt's blocks: `prefix_blocks / len(block_hashes)` (0 without)."""
    if c.prefix is None:
        return [0.0] * len(c.kept)
    return kernels.prefix_scores(c.prefix, c.n_hashes, c.kept)


@ROUTING_PLUGINS.implements("scorer", "kv")
def score_kv(req: RouteRequest, c: Columns) -> list[float]:
    """KV headroom: `1 - kv_usage` (reads only the view: `vector.VIEW_ONLY_SCORERS`)."""
    kv = c.kv_usage
    return [kernels.clamped(1.0 - kv[i]) for i in c.kept]


@ROUTING_PLUGINS.implements("scorer", "feedback")
def score_feedback(req: RouteRequest, c: Columns) -> list[float]:
    """`min slowness / slowness`: the fastest-looking worker scores 1."""
    return kernels.min_ratio_scores(c.slowness, c.kept)


SCORERS: dict[str, ScorerFn] = ROUTING_PLUGINS.implementations("scorer")
"""Every scorer by name (the registry's live mapping)."""


def candidate_columns(req: RouteRequest, cs: Sequence[Candidate]) -> Columns:
    """`cs` as the columns scorers read, every candidate kept."""
    return Columns([c.load for c in cs], [c.own for c in cs], [c.slowness for c in cs], [c.requests for c in cs],
                   [c.prefix_blocks for c in cs], [c.view.kv_usage for c in cs], len(req.block_hashes),
                   list(range(len(cs))), [c.view.weight for c in cs], [c.kv_room for c in cs])


def score_candidates(req: RouteRequest, cs: Sequence[Candidate], scorers: Sequence[str]) -> dict[str, dict[str, float]]:
    """Each of `scorers`' scores of `cs` by worker name (the per-candidate paths: P/D sides, pickers' totals)."""
    cols = candidate_columns(req, cs)
    names = [c.view.name for c in cs]
    return {s: dict(zip(names, SCORERS[s](req, cols), strict=True)) for s in scorers}


def apply_filters(req: RouteRequest, ws: list[WorkerView], down: frozenset[str],
                  filters: Sequence[str]) -> tuple[list[WorkerView], str]:
    """The workers every one of `filters` keeps, in order, or none and the first emptying filter's reason."""
    for f in filters:
        ws, why = FILTERS[f](req, ws, down)
        if not ws:
            return [], why
    return ws, ""


def weighted_totals(cs: Sequence[Candidate], per: dict[str, dict[str, float]], weights: dict[str, float],
                    normalise: bool = False) -> dict[str, float]:
    """Weighted sum of the scores (`per`: scorer -> worker -> score) per candidate, divided by the
    weights' sum when `normalise`."""
    wsum = sum(weights[s] for s in per) or 1.0
    terms = [(weights[s], vals) for s, vals in per.items()]
    tot: dict[str, float] = {}
    for c in cs:
        name = c.view.name
        tot[name] = sum([wt * vals[name] for wt, vals in terms])  # 0 + w1*v1 + w2*v2 ..., in scorer order
    return {k: v / wsum for k, v in tot.items()} if normalise else tot


# ---- bounded load ------------------------------------------------------------------------------


def load_bound(
    cs: Sequence[Candidate], recent: Sequence[str], p: LoadBoundParams
) -> tuple[list[Candidate], float, list[str]]:
    """Candidates within the load bound, the token bound itself, and the names excluded.

    Token check: `current_w <= c * mean(current) + own_w * slowness_w` (the request's own cost
    is the granularity, like the `+1` of consistent hashing with bounded loads, so an idle worker
    always qualifies). Share check: worker w may have taken at most
    `ceil(c * (k + 1) * speed_w / sum(speed))` of the last k decisions (speed = 1 / slowness).
    If the two checks together leave nobody, the token check alone applies.
    """
    current = [c.load * c.slowness for c in cs]  # `Candidate.current`, once each
    mean = sum(current) / len(cs)
    bound = p.c * mean
    by_tokens = [c for c, cur in zip(cs, current, strict=True) if cur <= bound + c.own * c.slowness + TIE_TOLERANCE]
    kept = by_tokens
    if p.share_window > 0 and recent:
        window = list(recent)[-p.share_window :]
        counts = {c.view.name: 0 for c in cs}
        for name in window:
            if name in counts:
                counts[name] += 1
        k = sum(counts.values())
        speed = {c.view.name: 1.0 / c.slowness for c in cs}
        total = sum(speed.values())
        share = p.c * (k + 1)
        both = [c for c in by_tokens if counts[c.view.name] + 1 <= math.ceil(share * speed[c.view.name] / total)]
        kept = both or by_tokens
    kept_ids = {id(c) for c in kept}  # `kept` holds objects of `cs`: identity, not field equality
    excluded = [c.name for c in cs if id(c) not in kept_ids]
    return kept, bound, excluded


# ---- pickers -----------------------------------------------------------------------------------


class PickerState:
    """The mutable part of picking: the seeded generator, round-robin cursor, LRU sequence."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.rr_last: dict[str, str] = {}
        self.seq = 0
        self.last_chosen: dict[str, int] = {}
        self.weights: dict[str, float] | None = None
        """Weights of the workers being picked from, set by the policy per view (None: all equal);
        round-robin and random picks are then proportional to them."""
        self._credit: dict[str, dict[str, float]] = {}
        """Per pool: smooth weighted round-robin credit of each worker."""

    def chosen(self, name: str) -> None:
        self.seq += 1
        self.last_chosen[name] = self.seq

    def round_robin(self, names: Sequence[str], pool: str = "") -> str:
        """Next name after the previous pick in sorted order (stable when membership changes);
        with unequal `weights`, smooth weighted round-robin."""
        if self.weights is not None:
            return self.weighted_round_robin(sorted(names), self.weights, pool)
        order = sorted(names)
        last = self.rr_last.get(pool)
        nxt = next((n for n in order if last is None or n > last), order[0])
        self.rr_last[pool] = nxt
        return nxt

    def round_robin_sorted(self, order: Sequence[str], pool: str = "") -> str:
        """`round_robin` over names already sorted (bisection instead of a scan)."""
        if self.weights is not None:
            return self.weighted_round_robin(order, self.weights, pool)
        last = self.rr_last.get(pool)
        i = 0 if last is None else bisect.bisect_right(order, last)
        nxt = order[i] if i < len(order) else order[0]
        self.rr_last[pool] = nxt
        return nxt

    def weighted_round_robin(self, order: Sequence[str], weights: dict[str, float], pool: str) -> str:
        """Smooth weighted round-robin (nginx's): every worker gains its weight in credit, the
        richest (first in name order on a tie) is picked and pays the total. Over any run of
        picks each worker's share is within one pick of its weight's share, evenly interleaved."""
        credit = self._credit.setdefault(pool, {})
        total = 0.0
        best, best_c = order[0], -math.inf
        for n in order:
            w = weights.get(n, 1.0)
            total += w
            c = credit[n] = credit.get(n, 0.0) + w
            if c > best_c:
                best, best_c = n, c
        credit[best] -= total
        self.rr_last[pool] = best
        return best

    def random_sorted(self, order: Sequence[str]) -> str:
        """`random` over names already sorted."""
        if self.weights is not None:
            return self._weighted_random(order, self.weights)
        return order[int(self.rng.integers(len(order)))]

    def random(self, names: Sequence[str]) -> str:
        """A seeded choice, uniform or (with unequal `weights`) proportional to weight."""
        order = sorted(names)
        if self.weights is not None:
            return self._weighted_random(order, self.weights)
        return order[int(self.rng.integers(len(order)))]

    def _weighted_random(self, order: Sequence[str], weights: dict[str, float]) -> str:
        cum = list(itertools.accumulate(weights.get(n, 1.0) for n in order))
        i = bisect.bisect_right(cum, float(self.rng.random()) * cum[-1])
        return order[min(i, len(order) - 1)]

    def power_of_two(self, totals: dict[str, float]) -> tuple[str, str | None]:
        """Two distinct seeded samples; the higher total wins (the first sampled on a tie)."""
        order = sorted(totals)
        if len(order) == 1:
            return order[0], None
        i, j = (int(x) for x in self.rng.choice(len(order), size=2, replace=False))
        a, b = order[i], order[j]
        return (a, b) if totals[a] >= totals[b] else (b, a)

    def max(self, totals: dict[str, float], tie_break: str) -> tuple[str, int]:
        """Highest total; exact ties (within 1e-9) broken seeded-randomly, or LRU then seeded."""
        best = max(totals.values())
        tied = sorted(n for n, t in totals.items() if t >= best - TIE_TOLERANCE)
        if len(tied) > 1 and tie_break == "lru":
            oldest = min(self.last_chosen.get(n, 0) for n in tied)
            tied = [n for n in tied if self.last_chosen.get(n, 0) == oldest]
        if len(tied) == 1:
            return tied[0], 1
        return tied[int(self.rng.integers(len(tied)))], len(tied)


# ---- picker plugins: (state, names, totals, pool, tie_break) -> (name, reason, tied) ------------

TotalsFn = Callable[[], dict[str, float]]
"""The candidates' weighted totals, computed only when a picker reads them."""
PickerFn = Callable[[PickerState, Sequence[str], TotalsFn, str, str], tuple[str, str, int]]
"""A picker: chooses among `names` (pool `pool` keeps its own round-robin cursor); returns the
name, the reason text ("" for `max`: the policy explains by its scorers) and how many tied."""

PICKER_KINDS = {"round_robin": "round-robin", "random": "random", "power_of_two": "power-of-two", "max": ""}
"""The decision kind each picker gives (`max`: the kind of its leading signal, see the policy)."""


@ROUTING_PLUGINS.implements("picker", "round_robin")
def pick_round_robin(state: PickerState, names: Sequence[str], totals: TotalsFn, pool: str,
                     tie_break: str) -> tuple[str, str, int]:
    """Next name after the pool's previous pick, in name order."""
    name = state.round_robin(names, pool)
    return name, f"round-robin {name} ({len(names)} eligible)", 1


@ROUTING_PLUGINS.implements("picker", "random")
def pick_random(state: PickerState, names: Sequence[str], totals: TotalsFn, pool: str,
                tie_break: str) -> tuple[str, str, int]:
    """A seeded uniform choice."""
    name = state.random(names)
    return name, f"random {name} of {len(names)}", 1


@ROUTING_PLUGINS.implements("picker", "power_of_two")
def pick_power_of_two(state: PickerState, names: Sequence[str], totals: TotalsFn, pool: str,
                      tie_break: str) -> tuple[str, str, int]:
    """Two seeded samples; the higher total wins."""
    t = totals()
    name, other = state.power_of_two(t)
    vs = f" over {other} (score {t[name]:.2f} vs {t[other]:.2f})" if other else " (only one)"
    return name, f"power-of-two {name}{vs}", 1


@ROUTING_PLUGINS.implements("picker", "max")
def pick_max(state: PickerState, names: Sequence[str], totals: TotalsFn, pool: str,
             tie_break: str) -> tuple[str, str, int]:
    """The highest total; exact ties broken by `tie_break`."""
    name, tied = state.max(totals(), tie_break)
    return name, "", tied


PICKERS: dict[str, PickerFn] = ROUTING_PLUGINS.implementations("picker")
"""Every picker by name (the registry's live mapping)."""
