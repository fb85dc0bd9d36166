"""`fail_requests`: new generation requests are refused with `status` (503 by default) and an
OpenAI-style error body; requests already running continue."""

from __future__ import annotations

from typing import Literal

from fleetwise.emulator.faults import FaultActions, FaultKind, FaultParams, FaultState, register


class FailParams(FaultParams):
    status: Literal[429, 500, 502, 503] = 503
    """HTTP status returned to new requests."""


@register
class FailRequests(FaultKind):
    name = "fail_requests"
    params = FailParams

    def apply(self, state: FaultState, p: FailParams, actions: FaultActions) -> None:
        state.fail_status = p.status

    def clear(self, state: FaultState) -> None:
        state.fail_status = None
