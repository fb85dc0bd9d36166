"""One request in flight on an emulated replica (`Live`), a prefill replica's KV lease
(`Lease`), the replica's counters (`ReplicaStatus`), how long a request runs (`output_length`,
one pass per step: `single_passes`) and the columns of its finished-request records: the state
`EmulatedReplica` keeps per request, which the stream responses (`fleetwise.emulator.streams`)
read."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetwise.core.openai_request import ApiError
from fleetwise.emulator.generation import TokenStream
from fleetwise.emulator.protocol import GenRequest
from fleetwise.engine.driver import EngineDriver

__all__ = ["MAX_RECORDS", "RECORD_COLUMNS", "Lease", "Live", "ReplicaStatus", "output_length", "single_passes"]

MAX_RECORDS = 100_000
"""Finished requests kept for `GET /fleetwise/requests` (about 10 MB)."""
RECORD_COLUMNS = ("id", "arrival_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
                  "finish_reason", "scheduled_s", "kv_pull_start_s", "kv_pull_end_s", "finish_seen_s",
                  "first_token_seen_s")
"""Columns of `GET /fleetwise/requests`: arrival = when the request reached the server; first
token and finish = the step ends that produced them (scheduled times); scheduled = the start of
the step that first ran it; KV pull start and end (decode role) = when the pull was sent and
answered; finish seen = when the process handled the finishing step (its deadline overrun is
finish seen - finish), first token seen likewise for the first token's step. A stage that did not
happen is null."""


def output_length(req: GenRequest, room: int, eos: Callable[[], int]) -> tuple[int, str]:
    """Tokens a request generates and its finish reason, as vLLM decides them: `max_tokens` (else
    the `room` left in the context) is a cap; without `ignore_eos` the output ends earlier at the
    model's EOS (`eos()`: the seeded length model's draw for this prompt), reason `stop`; a request
    that reaches its cap ends with `length` (vLLM checks the cap before the EOS)."""
    cap = room if req.max_tokens is None else min(req.max_tokens, room)
    if not req.ignore_eos:
        n = eos()
        if n < cap:
            return n, "stop"
    return cap, "length"


def single_passes(driver: EngineDriver, now_s: float) -> tuple[float, float]:
    """Horizons (0, 0): every step is one pass, so tokens stream pass by pass."""
    return 0.0, 0.0


@dataclass(eq=False, slots=True)
class Live:
    """One request in flight: what the client asked, how far it got, and when (modelled s)."""

    rid: str
    eid: str
    req: GenRequest
    digest: int
    target: int
    """Tokens this request will generate (max_tokens, or the length model's draw)."""
    finish_reason: str
    arrival_s: float
    emitted: int = 0
    sched_s: float | None = None
    first_token_s: float | None = None
    first_token_seen_s: float | None = None
    """When the process handled the step end that produced the first token (modelled s)."""
    last_token_s: float = 0.0
    finish_s: float | None = None
    pull_start_s: float | None = None
    """Decode role: when the KV pull was sent, and when it came back (modelled s)."""
    pull_end_s: float | None = None
    pull_id: int | None = None
    """Decode role: the pull on the KV port until it lands."""
    hold: asyncio.TimerHandle | None = None
    """Decode role: the clock is held for this request's pull answer (the hold's wall timeout)."""
    hold_since: float = 0.0
    """time.monotonic() when the hold began."""
    gated: bool = False
    """Decode role: in the engine from its pull's landing on this port, before the prefill's
    answer came; nothing streams to the client until it does."""
    admitted: bool = False
    """The engine holds the request (it reached the engine at its arrival on the clock)."""
    done: bool = False
    error: ApiError | None = None
    kv_transfer_params: dict[str, Any] | None = None
    tokens: TokenStream | None = None
    on_change: Callable[[], None] | None = None
    """Runs on every change (tokens, end, error, gate opened), inside the step end (or abort)
    that made it, before the driver schedules its next step: a pushed stream writes its chunks
    there (`fleetwise.emulator.streams.PushStream`), a finished request its answer (`AnswerAtEnd`)."""
    _waiter: asyncio.Future[None] | None = None

    def notify(self) -> None:
        if self.on_change is not None:
            self.on_change()
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        """Until more tokens, the end, or an error."""
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter
        self._waiter = None

    def text(self, start: int, stop: int) -> str:
        """Generated text of positions [start, stop)."""
        if self.tokens is None:
            self.tokens = TokenStream(self.req.prompt_ids)
        return self.tokens.text(start, stop)


@dataclass(slots=True)
class Lease:
    """A prefill replica's hold on a finished request's KV until a decode replica pulls it."""

    live: Live
    prompt_tokens: int
    start_s: float = 0.0
    """Modelled time the KV was leased (the hand-off)."""
    expires: asyncio.TimerHandle | None = None


@dataclass
class ReplicaStatus:
    """Counters the load generator and tests read besides /metrics."""

    steps: int = 0
    overrun_sum_s: float = 0.0
    overrun_max_s: float = 0.0
    busy_s: float = 0.0
    requests: int = 0
    pull_holds: int = 0
    """KV pulls that landed here before their answer came, so the clock waited for it."""
    pull_late: int = 0
    """KV pulls whose answer came after `KV_PULL_HOLD_MAX_S` (they reached the engine late)."""
    pull_hold_wall_s: float = 0.0
    """Wall seconds the clock was held for pull answers, summed over pulls."""
    pull_speculated: int = 0
    """KV pulls that reached the engine at their landing on this port, ahead of the answer."""
    pull_early: int = 0
    """Of those, pulls the prefill's port landed later (the engine got them early by the gap)."""
    extra: dict[str, float] = field(default_factory=dict)
