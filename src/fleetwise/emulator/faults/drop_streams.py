"""`drop_streams`: streamed responses (running and new) are cut once they have sent
`after_tokens` tokens: the connection closes without a finish reason or `[DONE]`."""

from __future__ import annotations

from fleetwise.emulator.faults import FaultActions, FaultKind, FaultParams, FaultState, register
from fleetwise.spec import faults as vocab


@register
class DropStreams(FaultKind):
    spec = vocab.DropStreams

    def apply(self, state: FaultState, p: FaultParams, actions: FaultActions) -> None:
        state.drop_after_tokens = p.after_tokens  # type: ignore[attr-defined]

    def clear(self, state: FaultState) -> None:
        state.drop_after_tokens = None
