"""The one routing interface both drivers (simulator, live gateway) call.

A policy only decides: `route()` returns a `RoutingDecision`; the caller executes it and reports
what happened through `observe()`. Policies are pure synchronous objects: no I/O, no clock reads
(time arrives as `FleetView.now_s` and `Feedback.now_s`), no threads, randomness only from
seeded generators they own. Feeding the same object the same sequence of views and feedback
yields the same decisions, whichever driver produced them.

A policy may set `wants_kv_events = True`: its decisions read what engines cache, so a driver
should forward the engines' KV events (`KvStored`/`KvEvicted`); drivers read it with
`getattr(policy, "wants_kv_events", False)`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from fleetwise.core.feedback import Feedback
from fleetwise.core.views import FleetView, RouteRequest, RoutingDecision
from fleetwise.routing.score_rows import winning_scores  # compiled: the simulator calls it per decision

__all__ = ["RoutingPolicy", "reason_kind", "winning_scores"]


@runtime_checkable
class RoutingPolicy(Protocol):
    """Decides where each request goes; learns from the driver's feedback."""

    name: str

    def route(self, req: RouteRequest, fleet: FleetView) -> RoutingDecision:
        """Pick a worker (and a prefill worker in a P/D fleet), or reject with a reason."""
        ...

    def observe(self, fb: Feedback) -> None:
        """Update internal state from one feedback event (dispatch, tokens, completion, KV...)."""
        ...

    def report(self) -> dict[str, Any]:
        """Counters for humans and results files: decisions per reason kind, safe-mode time..."""
        ...


def reason_kind(reason: str) -> str:
    """The first word of a decision reason: only for policies that leave `RoutingDecision.kind`
    empty (the composed policy always sets it)."""
    head = reason.split(";", 1)[0].strip()
    return head.split(" ", 1)[0] if head else "none"
