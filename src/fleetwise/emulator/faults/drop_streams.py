"""`drop_streams`: streamed responses (running and new) are cut once they have sent
`after_tokens` tokens: the connection closes without a finish reason or `[DONE]`."""

from __future__ import annotations

from typing import Any

from fleetwise.emulator.faults import FaultKind, register
from fleetwise.spec import faults as vocab


@register
class DropStreams(FaultKind):
    spec = vocab.DropStreams
    state_field = "drop_after_tokens"

    def compose(self, values: list[Any]) -> Any:
        """The earliest cut of the instances in force."""
        return min(values)
