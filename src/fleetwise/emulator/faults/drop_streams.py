"""`drop_streams`: streamed responses (running and new) are cut once they have sent
`after_tokens` tokens: the connection closes without a finish reason or `[DONE]`."""

from __future__ import annotations

from fleetwise.emulator.faults import FaultKind, register
from fleetwise.spec import faults as vocab


@register
class DropStreams(FaultKind):
    spec = vocab.DropStreams
    state_field = "drop_after_tokens"
