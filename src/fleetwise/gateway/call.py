"""The vocabulary of one request on the gateway's path (admit -> route -> dispatch -> relay -> meter):
the request in flight (`Call`), the two ways an attempt ends early (`Retry`, `ClientGone`), the
protocol constants, and the small ASGI helpers every stage shares (body reading, disconnect
watching, usage parsing, error answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from fleetwise.core.views import RouteRequest
from fleetwise.gateway.backends import Backend
from fleetwise.gateway.openai import (
    ANSWER_BASE_BYTES,
    AnswerBounds,
    ClientError,
    error_body,
)
from fleetwise.gateway.upstream import FAULT_ERRORS
from fleetwise.ledger.meter import Meter
from fleetwise.ledger.usage import TOKEN_COUNT_LIMIT

__all__ = ["CLIENT_CLOSED_STATUS", "Call", "ClientGone", "DONE_EVENT", "EMPTY_CHOICES", "ERROR_EVENT_STATUS", "IDEMPOTENCY_HEADER", "INCLUDE_USAGE", "KV_RELEASE_PATH", "PD_PREFILL_PARAMS", "REGION_HEADER", "Receive", "Retry", "Send", "VERSION_HEADER", "error_response", "header", "hold_back", "log", "not_allowed", "not_found", "pinned", "read_body", "unless_gone", "usage_tokens", "watch_disconnect"]

log = logging.getLogger("fleetwise.gateway")

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]

VERSION_HEADER = b"x-fleetwise-model-version"
"""Request header pinning a request to a model version."""
REGION_HEADER = b"x-fleetwise-region"
"""Request header keeping a request in a region."""
KV_RELEASE_PATH = "/fleetwise/kv/release"
"""Where a prefill replica frees a leased KV whose hand-off was refused (`fleetwise emulate`)."""
PD_PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                     "remote_block_ids": None, "remote_host": None, "remote_port": None}
"""`kv_transfer_params` of a prefill leg, as vLLM's disaggregated-serving proxy sends them."""
CLIENT_CLOSED_STATUS = 499
"""Status counted (never sent) for a client that disconnected mid-stream (nginx's convention)."""
ERROR_EVENT_STATUS = 502
"""`code` of the error event that ends a stream broken after its first byte."""
IDEMPOTENCY_HEADER = b"idempotency-key"
"""Request header with the client's idempotency key (metered once per key and tenant)."""
DONE_EVENT = b"data: [DONE]\n\n"
"""The last event of an OpenAI stream; held back until the request's usage is recorded."""
INCLUDE_USAGE = {"include_usage": True}
"""`stream_options` entry asking for the usage at the end of a stream (metering)."""
EMPTY_CHOICES = re.compile(rb'"choices":\s*\[\s*\]')
"""A usage-only stream event (no choices)."""


class ClientGone(Exception):
    """The client disconnected while a whole (non-streamed) answer was awaited: the upstream request
    was closed, so the engine aborts it; nothing was delivered."""


class Retry(Exception):
    """A backend fault before the first byte reached the client: try another backend."""

    def __init__(self, backend: Backend, cause: str, detail: str, retry_after_s: float | None = None) -> None:
        super().__init__(detail)
        self.backend, self.cause, self.detail = backend, cause, detail
        self.retry_after_s = retry_after_s
        """A busy backend's `Retry-After` (cause `busy`)."""


@dataclass(slots=True)
class Call:
    """One client request in flight through the gateway."""

    rid: str
    endpoint: str
    path: str
    arrival_s: float
    raw: bytes
    body: dict[str, Any]
    stream: bool
    include_usage: bool
    route: RouteRequest
    meter: Meter | None = None
    """Usage metering (None when the gateway has no ledger)."""
    track: bool = False
    """A migratable stream: upstream puts the usage so far on every chunk, the relayed events are kept."""
    keep_chunk_usage: bool = False
    """The client asked for usage on every chunk itself."""
    events: list[bytes] = field(default_factory=list)
    """Relayed events (kept when `track`): the text a continuation prompts with."""
    delivered: int = 0
    """Tokens the client has received (when `track`)."""
    base: int = 0
    """Tokens delivered before the attempt in flight (its continuation prompt holds them)."""
    migrations: int = 0
    resumed: bool = False
    """The attempt in flight continues a stream the client already has (no new response start)."""
    receive: Receive | None = None
    """The client's ASGI receive channel (watched for a disconnect while a whole answer is awaited)."""
    refused: bool = False
    """The answer relayed was a backend's 4xx (for a P/D decode leg: the hand-off was refused)."""
    gone: bool = False
    """The client disconnected mid-stream."""
    retry_slot: bool = False
    """The request holds one of the retry budget's slots (from its first retry to its end)."""
    bounds: AnswerBounds = AnswerBounds(ANSWER_BASE_BYTES, ANSWER_BASE_BYTES)
    """The most bytes a legitimate answer takes (`openai.answer_bounds`, set at admission)."""


def pinned(tenant: str, field_name: str, pin: str | None, asked: str | None, header: bytes) -> str | None:
    """The tenant's pin wins over the client's header; a header contradicting it is a 403."""
    if pin is not None and asked is not None and asked != pin:
        h = header.decode()
        raise ClientError(403, f"header {h}={asked!r} contradicts tenant {tenant!r}'s {field_name} pin {pin!r}; "
                               "drop the header or send the pinned value", type_="permission_error", param=h,
                          code="pinned_by_tenant")
    return pin if pin is not None else asked


def header(scope: dict[str, Any], name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


async def read_body(scope: dict[str, Any], receive: Receive, limit: int) -> bytes:
    """The request body, refusing more than `limit` bytes (413) without reading it all."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ClientError(413, f"request body is {declared} bytes; the limit is {limit}", code="body_too_large")
    parts: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientError(400, "client disconnected while sending the body")
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ClientError(413, f"request body exceeds the limit of {limit} bytes", code="body_too_large")
        parts.append(chunk)
        if not msg.get("more_body"):
            return b"".join(parts) if len(parts) != 1 else parts[0]


T = TypeVar("T")


async def unless_gone(receive: Receive | None, work: Awaitable[T]) -> T:
    """`work`'s result, or `ClientGone` (with `work` cancelled: its upstream connection closes, so
    the engine aborts) when the client disconnects first."""
    if receive is None:
        return await work
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(receive())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        if watch.result()["type"] != "http.disconnect":  # not a disconnect (the body was read): just wait
            return await task
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, *FAULT_ERRORS):
            await task
        raise ClientGone()
    return task.result()


async def watch_disconnect(receive: Receive, upstream: Any, gone: list[bool]) -> None:
    """Close the upstream response when the client disconnects (the engine then aborts)."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            gone.append(True)
            upstream.close()
            return


def hold_back(out: bytes, held: bytes, client_wants_usage: bool, meter: Meter | None) -> tuple[bytes, bytes]:
    """Split relayed events into (sent now, held): `[DONE]` waits until the usage is recorded, and
    the usage-only event the gateway asked for is dropped unless the client asked for it; the
    meter reads the engine's counts from it."""
    if meter is not None and b'"usage"' in out:
        meter.usage_from(out)
    if out.endswith(DONE_EVENT):
        out, held = out[:-len(DONE_EVENT)], held + DONE_EVENT
    if not client_wants_usage and EMPTY_CHOICES.search(out):
        out = b"".join(e + b"\n\n" for e in out.split(b"\n\n") if e and not EMPTY_CHOICES.search(e))
    return out, held


def usage_tokens(data: bytes) -> int:
    """`usage.completion_tokens` found in an answer's last bytes (0 when absent or beyond any
    request, `TOKEN_COUNT_LIMIT`)."""
    i = data.rfind(b'"completion_tokens"')
    if i < 0:
        return 0
    j = data.find(b":", i) + 1
    k = j
    while k < len(data) and data[k:k + 1] in b" 0123456789":
        k += 1
    try:
        n = int(data[j:k])
    except ValueError:
        return 0
    return n if n <= TOKEN_COUNT_LIMIT else 0


def error_response(status: int, message: str, type_: str = "invalid_request_error") -> Response:
    return Response(error_body(status, message, type_), status_code=status, media_type="application/json")


async def not_found(request: Request, exc: Exception) -> Response:
    return error_response(404, f"no route {request.url.path}; see /v1/completions, /v1/chat/completions, /v1/models",
                           "not_found")


async def not_allowed(request: Request, exc: Exception) -> Response:
    return error_response(405, f"{request.method} is not allowed on {request.url.path}", "invalid_request_error")
