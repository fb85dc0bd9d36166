"""KV a decode worker is about to receive: the policy's own record of P/D hand-offs in flight.

A decode worker's view reports the KV blocks it holds (`kv_usage`), not the KV of requests
routed to it that are still prefilling or moving over a link; those land a prefill time later.
`IncomingKv` keeps, per decode worker, the tokens (prompt + expected output) of every request
routed to it until its first token arrives, so pair selection can subtract them from the
worker's KV headroom instead of sending every request of that interval to the same worker.
"""

from __future__ import annotations

from collections import OrderedDict

from fleetwise.routing.state import MAX_TRACKED

__all__ = ["IncomingKv"]


class IncomingKv:
    """Per decode worker: tokens of the requests routed to it whose KV has not landed yet."""

    def __init__(self) -> None:
        # Oldest first: evicting from the front of an OrderedDict is O(1); a plain dict's first
        # key after many front pops is found by skipping the deleted slots (quadratic at the cap).
        self._by_id: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._tokens: dict[str, int] = {}

    def add(self, request_id: str, worker: str, tokens: int) -> None:
        """`request_id` was routed to decode `worker` and will need `tokens` of its KV."""
        self.landed(request_id)
        self._by_id[request_id] = (worker, tokens)
        self._tokens[worker] = self._tokens.get(worker, 0) + tokens
        while len(self._by_id) > MAX_TRACKED:  # a driver that never reports back
            worker, tokens = self._by_id.popitem(last=False)[1]
            self._tokens[worker] -= tokens

    def landed(self, request_id: str) -> None:
        """The request's first token arrived (its KV is in the worker's view), or it ended."""
        hit = self._by_id.pop(request_id, None)
        if hit is not None:
            worker, tokens = hit
            self._tokens[worker] -= tokens

    def tokens(self, worker: str) -> int:
        """Tokens on their way to `worker`."""
        return self._tokens.get(worker, 0)

    def __len__(self) -> int:
        return len(self._by_id)
