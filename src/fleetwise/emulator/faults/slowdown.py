"""`slowdown`: every step takes `factor` times longer (a throttled or degraded GPU)."""

from __future__ import annotations

from fleetwise.emulator.faults import FaultKind, register
from fleetwise.spec import faults as vocab


@register
class Slowdown(FaultKind):
    spec = vocab.Slowdown
    state_field = "slowdown"
