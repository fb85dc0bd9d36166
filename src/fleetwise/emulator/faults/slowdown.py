"""`slowdown`: every step takes `factor` times longer (a throttled or degraded GPU)."""

from __future__ import annotations

import math
from typing import Any

from fleetwise.emulator.faults import FaultKind, register
from fleetwise.spec import faults as vocab


@register
class Slowdown(FaultKind):
    spec = vocab.Slowdown
    state_field = "slowdown"

    def compose(self, values: list[Any]) -> Any:
        """Overlapping slowdowns multiply (3 and 5 make 15), as the simulator's `SlowdownKind`."""
        return math.prod(values)
