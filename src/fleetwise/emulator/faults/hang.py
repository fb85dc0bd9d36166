"""`hang`: the engine stops stepping; requests are accepted and never progress, health stays 200
(a stuck collective or kernel: the process is alive, so liveness probes pass)."""

from __future__ import annotations

from fleetwise.emulator.faults import FaultActions, FaultKind, FaultParams, FaultState, register
from fleetwise.spec import faults as vocab


@register
class Hang(FaultKind):
    spec = vocab.Hang

    def apply(self, state: FaultState, p: FaultParams, actions: FaultActions) -> None:
        state.hung = True

    def clear(self, state: FaultState) -> None:
        state.hung = False
