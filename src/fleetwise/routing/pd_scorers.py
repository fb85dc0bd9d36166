"""Pair scorers of prefill/decode pair selection (`handoff`) and the `PairColumns` they read.

A P/D fleet is routed by two profiles of the same machinery (filters, scorers, picker), one per
side, and by pair scorers that rank a prefill->decode pair as a whole. A pair scorer maps the
pairs' `PairColumns` (each pair's prefill and decode views and KV link view, one list per field)
to one score in [0, 1] per pair, all of them in one call. The decode profile's `kv_room` is an
ordinary scorer (`plugins.score_kv_room`, over `Columns.kv_room`; `plugins.kv_headroom` its signal).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleetwise.core.views import KvLinkView, RouteRequest, WorkerView
from fleetwise.spec.routing_plugins import ROUTING_PLUGINS


@dataclass(slots=True)
class PairColumns:
    """The pairs a P/D decision scores, as columns: one element per pair, in the decision's order."""

    prefill: list[WorkerView]
    """Each pair's prefill worker's view."""
    decode: list[WorkerView]
    """Each pair's decode worker's view."""
    links: list[KvLinkView | None]
    """Each pair's KV link view (None: the fleet view has none for it)."""
    best_bandwidth: float
    """The best bandwidth of a healthy link in the fleet view, bytes/s (0 when none is)."""


PairScorerFn = Callable[[RouteRequest, PairColumns], list[float]]
"""A pair scorer: the request and the pairs' `PairColumns` -> one score in [0, 1] per pair, in order."""


@ROUTING_PLUGINS.implements("pair_scorer", "handoff")
def score_handoff(req: RouteRequest, c: PairColumns) -> list[float]:
    """The share of the best healthy link's bandwidth a new transfer on the pair's KV link would get,
    `(bandwidth / best) / (1 + active_transfers)`: a busy link or a degraded one (a fault leaves it
    healthy at a fraction of its bandwidth) delays the hand-off; 1 without a link view."""
    best = c.best_bandwidth
    return [1.0 if lk is None else (min(lk.bandwidth_bytes_per_s / best, 1.0) if best > 0 else 1.0)
            / (1 + lk.active_transfers) for lk in c.links]


PAIR_SCORERS: dict[str, PairScorerFn] = ROUTING_PLUGINS.implementations("pair_scorer")
"""Every pair scorer by name (the registry's live mapping)."""
LINK_ONLY_PAIR_SCORERS = frozenset({"handoff"})
"""Pair scorers that read only `PairColumns.links` and `best_bandwidth`, pair by pair, and not the
request: computed once per link views over every pair, then picked out for each decision's pairs."""
