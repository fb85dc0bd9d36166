"""`fail_requests`: new generation requests are refused with `status` (503 by default) and an
OpenAI-style error body; requests already running continue. Also the live effect of
`decode_full`: a full decode replica answers the hand-off 503, so the prefill side frees the KV
and the request is prefilled again, as in the simulator."""

from __future__ import annotations

from fleetwise.emulator.faults import FaultKind, register
from fleetwise.emulator.faults.replay import LiveAction, interval_actions, live_effect
from fleetwise.spec import faults as vocab
from fleetwise.spec.plan import PlanSpec

DECODE_FULL_STATUS = 503
"""What a decode replica with no room for new KV answers the hand-off (vLLM's "service unavailable")."""


@register
class FailRequests(FaultKind):
    spec = vocab.FailRequests
    state_field = "fail_status"


@live_effect(vocab.DecodeFull)
def _decode_full(f: vocab.DecodeFull, plan: PlanSpec) -> list[LiveAction]:
    """The decode replica (or every one) refuses new requests with 503 for the interval."""
    return interval_actions(f, plan, {"kind": FailRequests.name, "status": DECODE_FULL_STATUS},
                            "refuses new KV (decode full)", role="decode")
