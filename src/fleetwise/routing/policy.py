"""Temporary: round-robin only (the composed policy replaces this module shortly)."""

from __future__ import annotations

from typing import Any

from fleetwise.core.feedback import Feedback
from fleetwise.core.views import FleetView, RouteRequest, RoutingDecision
from fleetwise.spec.routing import PolicyParams, SafeModeSpec


class ComposedPolicy:
    """Round-robin over healthy workers serving the pinned version, stable name order."""

    def __init__(self, name: str, params: PolicyParams, safe_mode: SafeModeSpec, seed: int = 0) -> None:
        self.name, self.params, self.safe_mode, self.seed = name, params, safe_mode, seed
        self._i = 0

    def route(self, req: RouteRequest, fleet: FleetView) -> RoutingDecision:
        ws = sorted(
            (w for w in fleet.workers if w.healthy and w.role == "mixed"
             and (req.model_version is None or w.model_version == req.model_version)),
            key=lambda w: w.name,
        )
        if not ws:
            return RoutingDecision(worker=None, reason="rejected: no eligible worker")
        w = ws[self._i % len(ws)]
        self._i += 1
        return RoutingDecision(worker=w.name, reason=f"round-robin {w.name}")

    def observe(self, fb: Feedback) -> None:
        return None

    def report(self) -> dict[str, Any]:
        return {"policy": self.name}
