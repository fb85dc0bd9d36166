"""`kv_link`: this replica's KV port keeps `bandwidth_factor` of its bandwidth (a degraded NIC or
path): the transfers on it, a prefill's egress or a decode's ingress, share the slower port as the
simulator's do (`perf.kv_share.SharedPorts.set_factor`). A link down (factor 0) is refused: the
emulator's KV pulls have no failure path for a transfer cut on the wire."""

from __future__ import annotations

import math
from typing import Any

from fleetwise.emulator.faults import FaultKind, register
from fleetwise.spec import faults as vocab


@register
class KvLink(FaultKind):
    spec = vocab.KvLinkFault
    state_field = "kv_link_factor"

    def refused(self, p: Any) -> str:
        if p.bandwidth_factor > 0:
            return ""
        return ("bandwidth_factor=0 (link down) would cut transfers on the wire, which an emulated replica's KV "
                "pulls cannot fail yet; give a factor above 0, or run it in the simulator")

    def compose(self, values: list[Any]) -> Any:
        """Overlapping link faults multiply, as the simulator's `KvLinkKind`."""
        return math.prod(values)
