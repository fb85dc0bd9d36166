"""The built-in scorers read one candidate at a time: the readable references the column scorers
of `fleetwise.routing.plugins` (their one implementation) are checked against in `test_vector.py`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fleetwise.core.views import RouteRequest
from fleetwise.routing.plugins import Candidate, clamp01


def load(req: RouteRequest, cs: Sequence[Candidate]) -> dict[str, float]:
    """`min cost / cost`: 1 for the cheapest worker, 0.5 for one twice as expensive."""
    costs = [(c.load + c.own) * c.slowness for c in cs]
    best = min(costs)
    return {c.view.name: clamp01(best / k) if k > 0 else 1.0 for c, k in zip(cs, costs, strict=True)}


def requests(req: RouteRequest, cs: Sequence[Candidate]) -> dict[str, float]:
    """`min r / r` with `r = (requests + 1) / weight`."""
    rs = [(c.requests + 1) / c.view.weight for c in cs]
    best = min(rs)
    return {c.view.name: clamp01(best / r) for c, r in zip(cs, rs, strict=True)}


def prefix(req: RouteRequest, cs: Sequence[Candidate]) -> dict[str, float]:
    """Cached fraction of the prompt's blocks (0 without hashes)."""
    n = len(req.block_hashes)
    if not n:
        return {c.view.name: 0.0 for c in cs}
    return {c.view.name: clamp01(c.prefix_blocks / n) for c in cs}


def kv(req: RouteRequest, cs: Sequence[Candidate]) -> dict[str, float]:
    """KV headroom: `1 - kv_usage`."""
    return {c.view.name: clamp01(1.0 - c.view.kv_usage) for c in cs}


def feedback(req: RouteRequest, cs: Sequence[Candidate]) -> dict[str, float]:
    """`min slowness / slowness`."""
    best = min(c.slowness for c in cs)
    return {c.view.name: clamp01(best / c.slowness) for c in cs}


def kv_room(req: RouteRequest, cs: Sequence[Candidate]) -> dict[str, float]:
    """`max(kv_room, 0)`, at most 1."""
    return {c.view.name: clamp01(c.kv_room) for c in cs}


REFERENCE: dict[str, Callable[[RouteRequest, Sequence[Candidate]], dict[str, float]]] = {
    "load": load, "requests": requests, "prefix": prefix, "kv": kv, "feedback": feedback, "kv_room": kv_room,
}
"""Every built-in scorer's per-candidate reading, by name."""
