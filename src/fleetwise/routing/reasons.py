"""What a routing decision says about itself: the reason of a `max` pick (its leading signal,
the load bound, slowness, ties) and of a P/D pair, with token counts written compactly."""

from __future__ import annotations

import math
from typing import Final

from fleetwise.core.views import KvLinkView, RouteRequest
from fleetwise.routing.plugins import Candidate
from fleetwise.routing.score_rows import clear_nearest
from fleetwise.spec.routing import PolicyParams

__all__ = ["fixed", "fmt_tokens", "max_reason", "pair_reason"]


FIXED_SCALES: Final[tuple[float, ...]] = (1.0, 10.0, 100.0)
"""`10 ** digits` of the `digits` `fixed` writes itself (0, 1 or 2 decimals). Typed as a tuple of
any length: mypyc keeps a `Final` fixed-length tuple unboxed and its check that the value is set
is inverted (every read raised `NameError`)."""


def fixed(x: float, digits: int) -> str:
    """`f"{x:.{digits}f}"`, the same text, written from the nearest integer of `|x| * 10 **
    digits` where that is clearly not a tie (`score_rows.clear_nearest`: it is then the correctly
    rounded decimal the builtin writes) and `digits` is 0, 1 or 2; ties, NaN, infinities, huge
    values and other `digits` take the builtin. The sign is `x`'s, as the builtin writes it
    (`-0.0` included)."""
    if 0 <= digits < len(FIXED_SCALES):
        scale = FIXED_SCALES[digits]
        m = clear_nearest(abs(x) * scale)
        if m == m:  # not NaN
            n = int(m)
            sign = "-" if math.copysign(1.0, x) < 0 else ""
            if not digits:
                return f"{sign}{n}"
            unit = int(scale)
            frac = str(n % unit)  # below `unit`: at most `digits` figures, one short at most (digits 1 or 2)
            return f"{sign}{n // unit}.{frac if len(frac) == digits else '0' + frac}"
    return f"{x:.{digits}f}"


def fmt_tokens(x: float) -> str:
    """Compact token count: 950, 12.3k, 4.1M."""
    if abs(x) >= 1e6:
        return f"{fixed(x / 1e6, 1)}M"
    return f"{fixed(x / 1e3, 1)}k" if abs(x) >= 1e4 else fixed(x, 0)


def max_reason(params: PolicyParams, req: RouteRequest, c: Candidate, per: dict[str, dict[str, float]],
               bound: float | None, excluded: list[str], tied: int) -> tuple[str, str]:
    """The reason of a `max` pick of `c` (scorers `per`, load bound in tokens or None, workers
    over it, `tied` equal best), and the decision kind: its leading signal."""
    n = len(req.block_hashes)
    if "prefix" in per and c.prefix_blocks > 0:
        lead, head = "prefix", f"prefix {c.prefix_blocks}/{n} blocks on {c.name}"
    elif "requests" in per and "load" not in per:
        lead, head = "least-outstanding", f"least-outstanding {c.name} ({c.requests} outstanding)"
    elif "load" in per:
        lead, head = "least-cost", f"least-cost {c.name} (cost {fmt_tokens(c.cost)} tok)"
    else:
        lead, head = "tie", f"tie {c.name}"
    parts = [head]
    if bound is not None:
        limit = bound + c.own * c.slowness  # the bound plus this request's own cost (granularity)
        parts.append(f"{c.name} load {fmt_tokens(c.current)} within bound {fmt_tokens(limit)}")
    if excluded:
        parts.append(f"over bound: {', '.join(excluded)}")
    if abs(c.slowness - 1.0) > params.feedback.deadband:  # a factor the feedback did not round to 1
        parts.append(f"slowness x{fixed(c.slowness, 2)}")
    if tied > 1:
        parts.append(f"tie of {tied} broken {params.tie_break}")
    return "; ".join(parts), lead


def pair_reason(req: RouteRequest, p: Candidate, d: Candidate, lk: KvLinkView | None) -> str:
    """The reason of a P/D pair pick: the prefill's prefix and cost, the decode's KV headroom, the link's load."""
    pre = f"prefix {p.prefix_blocks}/{len(req.block_hashes)} blocks" if p.prefix_blocks else "no prefix"
    return (f"pair {p.name}->{d.name}: prefill {pre}, cost {fmt_tokens(p.cost)} tok; "
            f"decode kv headroom {fixed(d.kv_room, 2)}; link {lk.active_transfers if lk else 0} active")
