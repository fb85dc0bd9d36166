"""`Meter`: one live request's usage as a driver (the gateway) sees it, written once when it ends.

The driver creates a Meter when a request is admitted, notes each attempt (`attempt`), what the
backend reported (`usage_from`) and what reached the client (`delivered_tokens`), and calls
`end(status, reason)` exactly where the request ends, before the last byte reaches the client
(see docs/failure-domains.md, crash safety). `end` hands the record to a `UsageSink` (the
gateway's `LedgerWriter`: batched on a background thread, spooled while the ledger is down), so
an event loop never blocks on the database and metering never raises; a second `end` does nothing.

Counts: prompt and cached tokens are the backend's `usage` when the answer carries it, else the
driver's estimate; delivered tokens are the backend's `completion_tokens` for a completed
answer, else the streamed content events the client received. A live driver cannot see GPU
time, so live work items carry `gpu_s = 0`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleetwise.ledger.store import Outcome
from fleetwise.ledger.usage import TOKEN_COUNT_LIMIT, Status, Usage, WorkItem, WorkKind

_USAGE = re.compile(rb'"usage"\s*:\s*(\{(?:[^{}]|\{[^{}]*\})*\})')
"""The last `"usage": {...}` object of an answer (one level of nesting: prompt_tokens_details)."""


def _count(v: Any) -> int | None:
    """A token count as a backend reports it; None for what no request can have (negative, above
    `TOKEN_COUNT_LIMIT`, not an integer), so a buggy backend's count never reaches the ledger."""
    return v if type(v) is int and 0 <= v <= TOKEN_COUNT_LIMIT else None


class UsageSink(Protocol):
    """Where a meter's record goes: `record` returns once it is durable (the ledger's outcome, or
    None when it was kept elsewhere) and never raises."""

    async def record(self, usage: Usage) -> Outcome | None: ...


@dataclass
class Meter:
    """Usage of one request in flight; `end()` records it in `sink` once."""

    sink: UsageSink
    idempotency_key: str
    request_id: str
    tenant: str
    model: str
    started_at: float
    prompt_tokens: int
    """The driver's estimate until the backend reports its count."""
    cached_tokens: int = 0
    delivered_tokens: int = 0
    prefill_pool: str = ""
    decode_pool: str = ""
    decode_backend: str = ""
    work: list[WorkItem] = field(default_factory=list)
    outcome: Outcome | None = None
    ended: bool = False
    status: Status | None = None
    """How the request ended (set by `end`)."""
    usage_seen: bool = False
    """The backend reported its counts (`usage_from` found a usage object)."""

    def attempt(self, kind: WorkKind, reason: str, prefill: tuple[str, str] | None, decode: tuple[str, str],
                context_tokens: int) -> None:
        """An attempt was sent: `prefill`/`decode` are (pool, backend) (prefill None when colocated);
        `context_tokens` the tokens its prefill computes (prompt, or prompt + streamed for a migration)."""
        pre = prefill or decode
        self.prefill_pool, self.decode_pool, self.decode_backend = pre[0], decode[0], decode[1]
        self.work.append(WorkItem(kind, reason, pre[0], pre[1], context_tokens, 0.0))

    def usage_from(self, data: bytes) -> bool:
        """Take prompt, cached and completion counts from the last `usage` object in `data`."""
        found = None
        for m in _USAGE.finditer(data):
            found = m
        if found is None:
            return False
        try:
            u = json.loads(found.group(1))
        except ValueError:
            return False
        if not isinstance(u, dict):
            return False
        prompt, done = _count(u.get("prompt_tokens")), _count(u.get("completion_tokens"))
        if prompt is not None:
            self.prompt_tokens = prompt
        details = u.get("prompt_tokens_details")
        cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
        if cached is not None:
            self.cached_tokens = min(cached, self.prompt_tokens)
        if done is not None:
            self.delivered_tokens = done
        self.usage_seen = self.usage_seen or prompt is not None or done is not None
        return prompt is not None or done is not None

    def usage(self, status: Status, reason: str, ended_at: float) -> Usage:
        """The record `end` writes (decode work = the tokens delivered)."""
        work = list(self.work)
        if self.delivered_tokens and self.work:
            last = self.work[-1]
            work.append(WorkItem("decode", "first" if len(self.work) == 1 else last.reason, self.decode_pool,
                                 self.decode_backend, self.delivered_tokens, 0.0))
        prompt = min(max(0, self.prompt_tokens), TOKEN_COUNT_LIMIT)  # never a record the ledger refuses
        return Usage(self.idempotency_key, self.request_id, self.tenant, self.model, self.prefill_pool,
                     self.decode_pool, status, reason, prompt, min(max(0, self.cached_tokens), prompt),
                     min(max(0, self.delivered_tokens), TOKEN_COUNT_LIMIT), self.started_at, ended_at, tuple(work))

    async def end(self, status: Status, reason: str, ended_at: float) -> Outcome | None:
        """Write the usage record (once; a later call returns the first outcome)."""
        if self.ended:
            return self.outcome
        self.ended, self.status = True, status
        self.outcome = await self.sink.record(self.usage(status, reason, ended_at))
        return self.outcome
