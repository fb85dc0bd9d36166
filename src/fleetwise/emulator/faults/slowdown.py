"""`slowdown`: every step takes `factor` times longer (a throttled or degraded GPU)."""

from __future__ import annotations

from fleetwise.emulator.faults import FaultActions, FaultKind, FaultParams, FaultState, register
from fleetwise.spec import faults as vocab


@register
class Slowdown(FaultKind):
    spec = vocab.Slowdown

    def apply(self, state: FaultState, p: FaultParams, actions: FaultActions) -> None:
        state.slowdown = p.factor  # type: ignore[attr-defined]

    def clear(self, state: FaultState) -> None:
        state.slowdown = 1.0
