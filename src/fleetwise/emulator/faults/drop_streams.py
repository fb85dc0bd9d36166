"""`drop_streams`: streamed responses (running and new) are cut once they have sent
`after_tokens` tokens: the connection closes without a finish reason or `[DONE]`."""

from __future__ import annotations

from pydantic import Field

from fleetwise.emulator.faults import FaultActions, FaultKind, FaultParams, FaultState, register


class DropParams(FaultParams):
    after_tokens: int = Field(default=1, ge=0)
    """Tokens a stream sends before it is cut (0: cut before the first token)."""


@register
class DropStreams(FaultKind):
    name = "drop_streams"
    params = DropParams

    def apply(self, state: FaultState, p: DropParams, actions: FaultActions) -> None:
        state.drop_after_tokens = p.after_tokens

    def clear(self, state: FaultState) -> None:
        state.drop_after_tokens = None
