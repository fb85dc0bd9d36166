"""`crash`: the server process exits at once (exit code 1), as an engine that dies does."""

from __future__ import annotations

from fleetwise.emulator.faults import FaultActions, FaultKind, FaultParams, FaultState, register


@register
class Crash(FaultKind):
    name = "crash"

    def apply(self, state: FaultState, p: FaultParams, actions: FaultActions) -> None:
        actions.crash()
