"""Routing plugins: filters, scorers and pickers, composed by `ComposedPolicy`.

- A filter keeps the workers a request may go to, or says why none may.
- A scorer maps the candidates' `vector.Columns` (one list per signal: load, own cost,
  slowness, outstanding requests, cached prefix, KV usage...) to the scores in [0, 1] of the
  workers a decision kept, all of them in one call; the policy sums them by weight.
- A picker chooses one position from the candidates' names and their totals (max with a
  seeded tie-break, round-robin, random, power-of-two).

Each plugin has this one implementation, over columns, whichever path calls it (the colocated
pick, each side of a P/D pair, a picker's totals), so a new scorer is as fast as the built-in
ones by construction. Parameter models live in `fleetwise.spec.routing` (each plugin's `Params`).
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
from fleetwise.routing.signals import Columns
from fleetwise.spec.routing import CostParams
from fleetwise.spec.routing_plugins import ROUTING_PLUGINS

__all__ = [
    "FIELD_FILTERS",
    "FILTERS",
    "PICKERS",
    "SCORERS",
    "Candidate",
    "PickerState",
    "apply_filters",
    "candidate_columns",
    "clamp01",
    "has_token_backlog",
    "kv_headroom",
    "own_cost",
    "own_cost_at",
    "side_load",
    "view_load",
]


@dataclass(slots=True, init=False)
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

    def __init__(self, view: WorkerView, requests: int, load: float, own: float, slowness: float = 1.0,
                 prefix_blocks: int = 0, kv_room: float = 0.0) -> None:
        # Its own `__init__`, compiled to plain stores (the generated one runs interpreted: core/views.py).
        self.view, self.requests, self.load, self.own = view, requests, load, own
        self.slowness, self.prefix_blocks, self.kv_room = slowness, prefix_blocks, kv_room

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
    return own_cost_at(req, cached_blocks, cost.decode_token_weight, cost.per_request_tokens, decode_tokens)


def own_cost_at(req: RouteRequest, cached_blocks: int, dw: float, per_req: float, decode_tokens: float) -> float:
    """`own_cost` with the cost's decode token weight `dw` and per-request tokens `per_req` as plain floats."""
    uncached = max(req.prompt_tokens - cached_blocks * req.hash_block_tokens, 0)
    return uncached + dw * decode_tokens + per_req


def view_load(w: WorkerView, cost: CostParams, side: str = "mixed") -> float:
    """Work a view reports ahead of a request on `side`, in token equivalents (a token backlog the
    view lacks counts 0: see `has_token_backlog`): on a mixed worker `queued_prefill + dw *
    running_decode + per_request * (queued + running)`; on a prefill worker `queued_prefill +
    per_request * queued`; on a decode worker `dw * running_decode + per_request * (queued + running)`."""
    return side_load(w, cost.decode_token_weight, cost.per_request_tokens, side)


def side_load(w: WorkerView, dw: float, per_req: float, side: str = "mixed") -> float:
    """`view_load` with the cost's decode token weight `dw` and per-request tokens `per_req` as
    plain floats (a hot path's, read once per decision rather than per worker)."""
    if side == "prefill":
        return (w.queued_prefill_tokens or 0) + per_req * w.queued_requests
    if side == "decode":
        return dw * (w.running_decode_tokens or 0) + per_req * (w.queued_requests + w.running_requests)
    return (w.queued_prefill_tokens or 0) + dw * (w.running_decode_tokens or 0) + per_req * (
        w.queued_requests + w.running_requests)


def kv_headroom(w: WorkerView, need_tokens: int) -> float:
    """KV fraction left after admitting `need_tokens` (`1 - kv_usage` without a capacity)."""
    free = 1.0 - w.kv_usage
    return free - need_tokens / w.kv_capacity_tokens if w.kv_capacity_tokens > 0 else free


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
FIELD_FILTERS = frozenset({"healthy", "model_version", "region", "role"})
"""Filters that read of a view only its worker's name, health, model version, region and role
(and the workers reported down): a new view equal in those fields keeps the same workers."""


# ---- scorers: columns -> the kept workers' scores in [0, 1] -----------------------------------

ScorerFn = Callable[[RouteRequest, Columns], list[float]]
"""A scorer: the request and the candidates' `Columns` -> one score in [0, 1] per worker of
`Columns.kept`, in that order (the one implementation every routing path calls)."""


@ROUTING_PLUGINS.implements("scorer", "load")
def score_load(req: RouteRequest, c: Columns) -> list[float]:
    """`min cost / cost`, cost `(load + own) * slowness`: 1 for the cheapest worker, 0.5 for one twice as expensive."""
    return kernels.load_scores(c.load, c.own, c.slowness, c.kept)


@ROUTING_PLUGINS.implements("scorer", "requests")
def score_requests(req: RouteRequest, c: Columns) -> list[float]:
    """`min r / r` with `r = (requests + 1) / weight`: fewest outstanding requests per unit of
    weight scores 1 (with equal weights, `(min requests + 1) / (requests + 1)`)."""
    w = c.weight
    r = c.requests
    xs = [float(x + 1) for x in r] if w is None else [(r[i] + 1) / w[i] for i in range(len(r))]
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


@ROUTING_PLUGINS.implements("scorer", "kv_room")
def score_kv_room(req: RouteRequest, c: Columns) -> list[float]:
    """KV fraction left after admitting the request, `max(kv_room, 0)` (0 on a non-decode candidate)."""
    room = c.kv_room
    return [kernels.clamped(room[i]) for i in c.kept] if room is not None else [0.0] * len(c.kept)


SCORERS: dict[str, ScorerFn] = ROUTING_PLUGINS.implementations("scorer")
"""Every scorer by name (the registry's live mapping)."""


def candidate_columns(req: RouteRequest, cs: Sequence[Candidate]) -> Columns:
    """`cs` as the columns scorers read, every candidate kept."""
    return Columns([c.load for c in cs], [c.own for c in cs], [c.slowness for c in cs], [c.requests for c in cs],
                   [c.prefix_blocks for c in cs], [c.view.kv_usage for c in cs], len(req.block_hashes),
                   list(range(len(cs))), [c.view for c in cs], [c.view.weight for c in cs], [c.kv_room for c in cs])


def apply_filters(req: RouteRequest, ws: list[WorkerView], down: frozenset[str],
                  filters: Sequence[str]) -> tuple[list[WorkerView], str]:
    """The workers every one of `filters` keeps, in order, or none and the first emptying filter's reason."""
    for f in filters:
        ws, why = FILTERS[f](req, ws, down)
        if not ws:
            return [], why
    return ws, ""


# ---- pickers -----------------------------------------------------------------------------------


class PickerState:
    """The mutable part of picking: the seeded generator, round-robin cursor, LRU sequence.

    Every method takes the candidates' names in ascending order (the policy keeps its workers
    sorted by name) and, where it reads them, their totals as a list in the same order; it
    returns the chosen position."""

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

    def round_robin(self, order: Sequence[str], pool: str = "") -> int:
        """The next name after the pool's previous pick (stable when membership changes); with
        unequal `weights`, smooth weighted round-robin."""
        if self.weights is not None:
            return self.weighted_round_robin(order, self.weights, pool)
        last = self.rr_last.get(pool)
        i = 0 if last is None else bisect.bisect_right(order, last)
        if i == len(order):
            i = 0
        self.rr_last[pool] = order[i]
        return i

    def weighted_round_robin(self, order: Sequence[str], weights: dict[str, float], pool: str) -> int:
        """Smooth weighted round-robin (nginx's): every worker gains its weight in credit, the
        richest (first in name order on a tie) is picked and pays the total. Over any run of
        picks each worker's share is within one pick of its weight's share, evenly interleaved."""
        credit = self._credit.setdefault(pool, {})
        total = 0.0
        best, best_c = 0, -math.inf
        for i, n in enumerate(order):
            w = weights.get(n, 1.0)
            total += w
            c = credit[n] = credit.get(n, 0.0) + w
            if c > best_c:
                best, best_c = i, c
        credit[order[best]] -= total
        self.rr_last[pool] = order[best]
        return best

    def random(self, order: Sequence[str]) -> int:
        """A seeded choice, uniform or (with unequal `weights`) proportional to weight."""
        if self.weights is not None:
            weights = self.weights
            cum = list(itertools.accumulate(weights.get(n, 1.0) for n in order))
            i = bisect.bisect_right(cum, float(self.rng.random()) * cum[-1])
            return min(i, len(order) - 1)
        return int(self.rng.integers(len(order)))

    def power_of_two(self, totals: Sequence[float]) -> tuple[int, int]:
        """Two distinct seeded samples; the higher total wins (the first sampled on a tie).
        Returns (winner, other); other is -1 with a single candidate."""
        if len(totals) == 1:
            return 0, -1
        i, j = (int(x) for x in self.rng.choice(len(totals), size=2, replace=False))
        return (i, j) if totals[i] >= totals[j] else (j, i)

    def max(self, names: Sequence[str], totals: list[float], tie_break: str) -> tuple[int, int]:
        """(position of the highest total, how many tied): totals within `TIE_TOLERANCE` of the
        best tie, broken seeded-randomly in name order, or LRU first (then seeded)."""
        tied = kernels.tied(totals, TIE_TOLERANCE)
        if len(tied) == 1:
            return tied[0], 1
        tied.sort(key=names.__getitem__)
        if tie_break == "lru":
            last = self.last_chosen
            oldest = min(last.get(names[j], 0) for j in tied)
            tied = [j for j in tied if last.get(names[j], 0) == oldest]
            if len(tied) == 1:
                return tied[0], 1
        return tied[int(self.rng.integers(len(tied)))], len(tied)


# ---- picker plugins: (state, names, totals, pool, tie_break) -> (position, reason, tied) -------

TotalsFn = Callable[[], list[float]]
"""The candidates' weighted totals (in the order of their names), computed only when a picker reads them."""
PickerFn = Callable[[PickerState, Sequence[str], TotalsFn, str, str], tuple[int, str, int]]
"""A picker: chooses among `names` (ascending; pool `pool` keeps its own round-robin cursor);
returns the chosen position, the reason text ("" for `max`: the policy explains by its
scorers) and how many tied."""

PICKER_KINDS = {"round_robin": "round-robin", "random": "random", "power_of_two": "power-of-two", "max": ""}
"""The decision kind each picker gives (`max`: the kind of its leading signal, see the policy)."""


@ROUTING_PLUGINS.implements("picker", "round_robin")
def pick_round_robin(state: PickerState, names: Sequence[str], totals: TotalsFn, pool: str,
                     tie_break: str) -> tuple[int, str, int]:
    """Next name after the pool's previous pick, in name order."""
    i = state.round_robin(names, pool)
    return i, f"round-robin {names[i]} ({len(names)} eligible)", 1


@ROUTING_PLUGINS.implements("picker", "random")
def pick_random(state: PickerState, names: Sequence[str], totals: TotalsFn, pool: str,
                tie_break: str) -> tuple[int, str, int]:
    """A seeded uniform choice."""
    i = state.random(names)
    return i, f"random {names[i]} of {len(names)}", 1


@ROUTING_PLUGINS.implements("picker", "power_of_two")
def pick_power_of_two(state: PickerState, names: Sequence[str], totals: TotalsFn, pool: str,
                      tie_break: str) -> tuple[int, str, int]:
    """Two seeded samples; the higher total wins."""
    t = totals()
    i, j = state.power_of_two(t)
    vs = f" over {names[j]} (score {t[i]:.2f} vs {t[j]:.2f})" if j >= 0 else " (only one)"
    return i, f"power-of-two {names[i]}{vs}", 1


@ROUTING_PLUGINS.implements("picker", "max")
def pick_max(state: PickerState, names: Sequence[str], totals: TotalsFn, pool: str,
             tie_break: str) -> tuple[int, str, int]:
    """The highest total; exact ties broken by `tie_break`."""
    i, tied = state.max(names, totals(), tie_break)
    return i, "", tied


PICKERS: dict[str, PickerFn] = ROUTING_PLUGINS.implementations("picker")
"""Every picker by name (the registry's live mapping)."""
