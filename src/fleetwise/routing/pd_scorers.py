"""Scorers of prefill/decode pair selection: `kv_room` (decode profile) and `handoff` (pair scorer).

A P/D fleet is routed by two profiles of the same machinery (filters, scorers, picker), one per
side, and by pair scorers that rank a prefill->decode pair as a whole. `kv_room` is an ordinary
scorer that reads `Columns.kv_room` (`Candidate.kv_room`, set on decode candidates); a pair scorer maps every pair
`(prefill, decode)` to [0, 1], keyed `"<prefill>-><decode>"`, given the fleet's KV link views.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from fleetwise.core.views import KvLinkView, RouteRequest, WorkerView, kv_format_of
from fleetwise.routing.plugins import Candidate, clamp01
from fleetwise.routing.vector import Columns
from fleetwise.spec.kv_format import kv_compat
from fleetwise.spec.routing_plugins import ROUTING_PLUGINS

Pair = tuple[Candidate, Candidate]
Links = Mapping[tuple[str, str], KvLinkView]
PairScorerFn = Callable[[RouteRequest, Sequence[Pair], Links], dict[str, float]]


def pair_key(p: Candidate, d: Candidate) -> str:
    """`"<prefill>-><decode>"`: how a pair's score is keyed in totals and decisions."""
    return f"{p.view.name}->{d.view.name}"


def compatible_pairs(cp: Sequence[Candidate], cd: Sequence[Candidate]) -> tuple[list[Pair], str]:
    """Every (prefill, decode) pair whose KV formats are compatible (`kv_compat`: model version,
    KV encoding, block size, TP layout), and when none is, the first pair's refusal."""
    pf = [(p, kv_format_of(p.view)) for p in cp]
    df = [(d, kv_format_of(d.view)) for d in cd]
    pairs = [(p, d) for p, a in pf for d, b in df if kv_compat(a, b).ok]
    if pairs or not pf or not df:
        return pairs, ""
    (p, a), (d, b) = pf[0], df[0]
    return pairs, f"no decode replica can take a prefill replica's KV ({p.name}->{d.name}: {kv_compat(a, b).reason})"


@ROUTING_PLUGINS.implements("scorer", "kv_room")
def score_kv_room(req: RouteRequest, c: Columns) -> list[float]:
    """KV fraction left after admitting the request, `max(kv_room, 0)` (0 on a non-decode candidate)."""
    room = c.kv_room
    return [clamp01(room[i]) for i in c.kept] if room is not None else [0.0] * len(c.kept)


def healthy_bandwidth(links: Links) -> float:
    """The best bandwidth of a healthy link in bytes/s (0 when none is)."""
    return max((lk.bandwidth_bytes_per_s for lk in links.values() if lk.healthy), default=0.0)


@ROUTING_PLUGINS.implements("pair_scorer", "handoff")
def score_handoff(req: RouteRequest, pairs: Sequence[Pair], links: Links) -> dict[str, float]:
    """The share of the best healthy link's bandwidth a new transfer on the pair's KV link would get,
    `(bandwidth / best) / (1 + active_transfers)`: a busy link or a degraded one (a fault leaves it
    healthy at a fraction of its bandwidth) delays the hand-off; 1 without a link view."""
    best = healthy_bandwidth(links)
    out = {}
    for p, d in pairs:
        lk = links.get((p.view.name, d.view.name))
        if lk is None:
            out[pair_key(p, d)] = 1.0
            continue
        rel = min(lk.bandwidth_bytes_per_s / best, 1.0) if best > 0 else 1.0
        out[pair_key(p, d)] = rel / (1 + lk.active_transfers)
    return out


PAIR_SCORERS: dict[str, PairScorerFn] = ROUTING_PLUGINS.implementations("pair_scorer")
"""Every pair scorer by name (the registry's live mapping)."""


def kv_headroom(w: WorkerView, need_tokens: int) -> float:
    """KV fraction left after admitting `need_tokens` (`1 - kv_usage` without a capacity)."""
    free = 1.0 - w.kv_usage
    return free - need_tokens / w.kv_capacity_tokens if w.kv_capacity_tokens > 0 else free


def reachable_pairs(pairs: list[Pair], links: Links, fraction: float) -> list[Pair]:
    """The pairs whose KV link (if any) has at least `fraction` of the best healthy bandwidth
    (bytes/s), or every pair when none has."""
    floor = fraction * healthy_bandwidth(links)
    return [(p, d) for p, d in pairs if (lk := links.get((p.name, d.name))) is None
            or lk.bandwidth_bytes_per_s >= floor] or pairs
