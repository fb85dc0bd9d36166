"""`hang`: the engine stops stepping; requests are accepted and never progress, health stays 200
(a stuck collective or kernel: the process is alive, so liveness probes pass)."""

from __future__ import annotations

from typing import Any

from fleetwise.emulator.faults import FaultKind, register
from fleetwise.spec import faults as vocab


@register
class Hang(FaultKind):
    spec = vocab.Hang
    state_field = "hung"

    def value(self, p: Any) -> bool:
        return True
