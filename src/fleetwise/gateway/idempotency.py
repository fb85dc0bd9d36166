"""`Idempotency-Key` semantics (Stripe's, and the IETF httpapi draft's): a key names one request.

- the first request with a key runs; while it is in flight, the same key again is a 409;
- once it completed, the same key with the same body gets the stored answer again (status,
  content type and body, with `idempotent-replayed: true`), served by the gateway alone: no
  backend work and nothing billed twice, and never service without a bill;
- the same key with a different body is a 422 (the key was reused by mistake);
- a first request that did not complete (failed, cancelled, refused) stores nothing, so the
  client's retry with the key runs again (the ledger then replaces the failed attempt).

Answers are kept in memory for `ttl_s`, within a byte budget (oldest kept answer dropped first;
a key still in flight is never dropped, so it cannot run twice at once). A key the
ledger shows completed whose answer is no longer kept (expired, or another gateway process served
it) is a 409 naming the fix (a new key), never a second, unbilled run.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fleetwise.gateway.openai import ClientError

__all__ = ["IdempotencyStore", "Recorder", "fingerprint", "key_error"]

Send = Callable[[dict[str, Any]], Awaitable[None]]


def fingerprint(raw: bytes) -> bytes:
    """What makes two requests with one key "the same": a digest of the body bytes."""
    return hashlib.blake2b(raw, digest_size=16).digest()


@dataclass
class _Entry:
    print_: bytes
    at_s: float
    done: bool = False
    status: int = 0
    content_type: bytes = b"application/json"
    body: bytes = b""


def key_error(status: int, message: str, code: str) -> ClientError:
    """A 409/422 naming the Idempotency-Key header."""
    return ClientError(status, message, param="Idempotency-Key", type_="invalid_request_error", code=code)


class IdempotencyStore:
    """Keys in flight and completed answers, per tenant, within `ttl_s` and `max_bytes`."""

    def __init__(self, ttl_s: float, max_bytes: int) -> None:
        self.ttl_s, self.max_bytes = ttl_s, max_bytes
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._bytes = 0
        self.replayed = 0

    def begin(self, tenant: str, key: str, print_: bytes, now_s: float) -> _Entry | None:
        """Claim `key` for a new run (None), or the completed entry to answer with; 409/422 otherwise."""
        self._expire(now_s)
        e = self._entries.get((tenant, key))
        if e is None:
            self._entries[(tenant, key)] = _Entry(print_, now_s)
            return None
        if e.print_ != print_:
            raise key_error(422, f"Idempotency-Key {key!r} was used with a different request body; send a new key "
                                 "for a new request", "idempotency_key_reused")
        if not e.done:
            raise key_error(409, f"a request with Idempotency-Key {key!r} is still in progress; retry after it "
                                 "finishes", "idempotency_key_in_use")
        self.replayed += 1
        return e

    def finish(self, tenant: str, key: str, status: int, content_type: bytes, body: bytes, keep: bool) -> None:
        """The run of `key` ended: keep its answer (`keep`: it completed) or forget the key."""
        e = self._entries.get((tenant, key))
        if e is None or e.done:
            return
        if not keep or len(body) > self.max_bytes:
            del self._entries[(tenant, key)]
            return
        e.done, e.status, e.content_type, e.body = True, status, content_type, body
        self._bytes += len(body)
        while self._bytes > self.max_bytes:  # oldest kept answer first; a key in flight holds no bytes, stays
            old_key = next(k for k, kept in self._entries.items() if kept.done)
            self._bytes -= len(self._entries.pop(old_key).body)

    def _expire(self, now_s: float) -> None:
        while self._entries:
            k, e = next(iter(self._entries.items()))
            if now_s - e.at_s < self.ttl_s:
                return
            del self._entries[k]
            self._bytes -= len(e.body)


@dataclass
class Recorder:
    """Wraps an ASGI `send`, keeping the status, content type and body it sends (for `finish`)."""

    send: Send
    status: int = 0
    content_type: bytes = b""
    parts: list[bytes] = field(default_factory=list)

    async def __call__(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            self.status = msg["status"]
            self.content_type = next((v for k, v in msg.get("headers", []) if k == b"content-type"), b"")
        elif msg["type"] == "http.response.body":
            self.parts.append(msg.get("body", b""))
        await self.send(msg)

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)
