"""Scorers of prefill/decode pair selection: `kv_room` (decode profile) and `handoff` (pair scorer).

A P/D fleet is routed by two profiles of the same machinery (filters, scorers, picker), one per
side, and by pair scorers that rank a prefill->decode pair as a whole. `kv_room` is an ordinary
scorer that reads `Candidate.kv_room` (set on decode candidates); a pair scorer maps every pair
`(prefill, decode)` to [0, 1], keyed `"<prefill>-><decode>"`, given the fleet's KV link views.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from fleetwise.core.views import KvLinkView, RouteRequest
from fleetwise.routing.plugins import Candidate, clamp01
from fleetwise.spec.routing_plugins import ROUTING_PLUGINS

Pair = tuple[Candidate, Candidate]
Links = Mapping[tuple[str, str], KvLinkView]
PairScorerFn = Callable[[RouteRequest, Sequence[Pair], Links], dict[str, float]]


def pair_key(p: Candidate, d: Candidate) -> str:
    """`"<prefill>-><decode>"`: how a pair's score is keyed in totals and decisions."""
    return f"{p.view.name}->{d.view.name}"


@ROUTING_PLUGINS.implements("scorer", "kv_room")
def score_kv_room(req: RouteRequest, cs: Sequence[Candidate]) -> dict[str, float]:
    """KV fraction left after admitting the request, `max(kv_room, 0)` (0 on a non-decode candidate)."""
    return {c.view.name: clamp01(c.kv_room) for c in cs}


@ROUTING_PLUGINS.implements("pair_scorer", "handoff")
def score_handoff(req: RouteRequest, pairs: Sequence[Pair], links: Links) -> dict[str, float]:
    """`1 / (1 + active_transfers)` on the pair's KV link (a busy link delays the hand-off); 1 without one."""
    out = {}
    for p, d in pairs:
        lk = links.get((p.view.name, d.view.name))
        out[pair_key(p, d)] = 1.0 / (1 + lk.active_transfers) if lk is not None else 1.0
    return out


PAIR_SCORERS: dict[str, PairScorerFn] = ROUTING_PLUGINS.implementations("pair_scorer")
"""Every pair scorer by name (the registry's live mapping)."""
