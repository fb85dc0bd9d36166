"""`slowdown`: every step takes `factor` times longer (a throttled or degraded GPU)."""

from __future__ import annotations

from pydantic import Field

from fleetwise.emulator.faults import FaultActions, FaultKind, FaultParams, FaultState, register
from fleetwise.spec.limits import MAX_FACTOR, MIN_FACTOR


class SlowdownParams(FaultParams):
    factor: float = Field(ge=MIN_FACTOR, le=MAX_FACTOR)
    """Multiplier on step time (2.0 = twice as slow)."""


@register
class Slowdown(FaultKind):
    name = "slowdown"
    params = SlowdownParams

    def apply(self, state: FaultState, p: SlowdownParams, actions: FaultActions) -> None:
        state.slowdown = p.factor

    def clear(self, state: FaultState) -> None:
        state.slowdown = 1.0
