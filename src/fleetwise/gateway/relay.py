"""The relay stage: send one attempt to one backend and relay its answer to the client.

Streams are relayed event by event within the stall bounds (`gateway.stall`); a fault before the
first relayed byte raises `Retry`; a stream broken after it is returned to the dispatch stage
(which migrates it or ends it). Whole answers are read within their bound, and a client that
leaves meanwhile closes the upstream request (`ClientGone`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass

from fleetwise.core.feedback import Completed, FirstToken
from fleetwise.gateway.backends import Backend
from fleetwise.gateway.call import (
    CLIENT_CLOSED_STATUS,
    ERROR_EVENT_STATUS,
    Call,
    Receive,
    Retry,
    Send,
    hold_back,
    unless_gone,
    usage_tokens,
    watch_disconnect,
)
from fleetwise.gateway.loops import FleetLoops
from fleetwise.gateway.migration import (
    relay_events,
)
from fleetwise.gateway.openai import MAX_ERROR_BODY_BYTES
from fleetwise.gateway.stall import first_token_bound_s, fleet_ttft_s, next_token_bound_s
from fleetwise.gateway.upstream import (
    ERROR_EVENT,
    FAULT_ERRORS,
    ErrorEvent,
    SseFramer,
    UpstreamBroken,
    UpstreamResponse,
    fault_kind,
    not_an_answer,
)

__all__ = ["BUSY_STATUS", "Broken", "RelayStage", "busy"]

BUSY_STATUS = 429
"""A backend (or the proxy in front of it) shedding load: RFC 6585 s4, Too Many Requests. Not
the client's fault and not a broken backend: the request is tried on another one."""
BUSY_RETRY_S = 1.0
"""Retry-After (s) when a busy backend sends none, or the HTTP-date form (RFC 9110 s10.2.3)."""


@dataclass(frozen=True, slots=True)
class Broken:
    """A stream that broke after its first byte: the backend, the fault kind, the events relayed."""

    backend: Backend
    kind: str
    events: int


class RelayStage(FleetLoops):
    """Relaying one attempt's answer."""

    def _whole_bound(self, b: Backend, tokens: int) -> float:
        """Seconds a non-streamed answer of `tokens` tokens from `b` may take: its first-token bound
        plus `stall.factor` x its recent TPOT per further token (the first-byte timeout without history)."""
        first = first_token_bound_s(b, fleet_ttft_s(self.backends.live.values()), self.cfg.stall, self.cfg.timeouts)
        if b.tpot_ewma_s is None or not self.cfg.stall.enabled:
            return self.cfg.timeouts.first_byte_s if tokens > 1 else first
        return min(self.cfg.timeouts.first_byte_s, first + self.cfg.stall.factor * b.tpot_ewma_s * (tokens - 1))

    async def _request_whole(self, b: Backend, call: Call, payload: bytes, headers: dict[str, str],
                             leg_tokens: int | None) -> tuple[int, bytes, str]:
        """POST and read the whole answer of `leg_tokens` tokens (None: one, a prefill leg) within its
        stall bound; backend faults (a stall is a `timeout`) raise `Retry`."""
        bound = self._whole_bound(b, 1 if leg_tokens is None else leg_tokens)
        b.in_flight += 1
        b.breaker.attempt(self.now())
        work = b.work(call.route.prompt_tokens, call.route.max_output_tokens or 0)
        try:
            status, data, ctype, retry_after = await unless_gone(None if call.resumed else call.receive, self._post_whole(
                b.spec.url + call.path, payload, headers, bound, call.bounds.body_bytes))
        except FAULT_ERRORS as err:
            kind = fault_kind(err)
            self._fault(b, kind)
            raise Retry(b, kind, str(err) or type(err).__name__) from None
        finally:
            b.done(*work)
            b.in_flight -= 1
            self.backends.released(b)
        if status == BUSY_STATUS:
            raise busy(b, retry_after)
        if status >= 500:
            self._fault(b, "5xx")
            raise Retry(b, "5xx", f"HTTP {status}")
        if status < 400:
            self._garbage(b, data, False)
        b.breaker.success()
        return status, data, ctype

    async def _post_whole(self, url: str, payload: bytes, headers: dict[str, str],
                          bound: float, limit: int) -> tuple[int, bytes, str, str | None]:
        """The whole answer within `bound` seconds in all (each read's own timeout alone would let
        a backend that trickles bytes hold the request for as long as it trickles)."""
        async with asyncio.timeout(bound), self.upstream.post(url, payload, headers, read_s=bound) as r:
            data = await r.read(limit if r.status < 400 else MAX_ERROR_BODY_BYTES)
            return r.status, data, r.headers.get("content-type", "application/json"), r.headers.get("retry-after")

    async def _relay(self, call: Call, b: Backend, payload: bytes, headers: dict[str, str], send: Send,
                     receive: Receive) -> Broken | None:
        """Send to `b` and relay its answer; faults before the first relayed byte raise `Retry`; a
        stream broken after it is returned (the dispatch stage migrates or ends it)."""
        if not call.stream:
            t0 = self.now()
            status, data, ctype = await self._request_whole(b, call, payload, headers,
                                                            call.route.max_output_tokens or 1)
            now = self.now()
            if call.meter is not None and status < 400:  # recorded before the answer leaves
                call.meter.usage_from(data)
                await call.meter.end("completed", "", time.time())
            await self._send_bytes(send, call, status, data, ctype, b.name)
            if status < 400:
                out = usage_tokens(data)
                self.policy.observe(FirstToken(now, call.rid, b.name, now - t0))
                self.policy.observe(Completed(now, call.rid, b.name, out, 0.0, now - call.arrival_s))
                b.observe_latency(now - t0, None)
            else:
                self._release(call.rid, b.name, "client error")
            return None
        return await self._relay_stream(call, b, payload, headers, send, receive)

    async def _relay_stream(self, call: Call, b: Backend, payload: bytes, headers: dict[str, str],
                            send: Send, receive: Receive) -> Broken | None:
        b.in_flight += 1
        b.breaker.attempt(self.now())
        pre_left, dec_left = b.work(call.route.prompt_tokens, call.route.max_output_tokens or 0)
        sent_any = False
        held = b""
        broken: str | None = None
        gone: list[bool] = []
        watcher: asyncio.Task[None] | None = None
        t_send = self.now()
        first_bound = first_token_bound_s(b, fleet_ttft_s(self.backends.live.values()), self.cfg.stall,
                                          self.cfg.timeouts)
        try:
            async with self.upstream.post(b.spec.url + call.path, payload, headers, read_s=first_bound) as r:
                watcher = asyncio.create_task(watch_disconnect(receive, r, gone))
                if r.status >= 400:
                    await self._refused(call, b, r, send)
                    return None
                framer = SseFramer(call.bounds.event_bytes)
                first, error = framer.cut_error(await self._first_event(b, r, framer, t_send + first_bound))
                t_first = self.now()
                self.backends.handoff_ended(call.rid)  # the decode leg has its KV
                b.done(pre_left, 0)
                pre_left = 0
                if not call.resumed:
                    await send({"type": "http.response.start", "status": 200, "headers": stream_headers(call, b)})
                sent_any = True
                held = await self._send_first(call, b, first, held, send, t_first, t_send)
                ended_by(framer, error)
                r.timeout_s = next_token_bound_s(b, self.cfg.stall, self.cfg.timeouts)
                held = await self._pump(call, r, framer, held, send)
                if not framer.finished() and not gone:  # ended well-formed, but before [DONE]: cut short
                    raise UpstreamBroken("the backend ended the stream before data: [DONE]")
        except Retry:
            raise
        except FAULT_ERRORS as err:
            if gone:  # the client left: not the backend's fault, nothing more to send
                await self._client_left(call, b, framer.events if sent_any else 0)
                return None
            kind = fault_kind(err)
            self._fault(b, kind)
            if not sent_any:
                raise Retry(b, kind, str(err) or type(err).__name__) from None
            broken = kind
        finally:
            if watcher is not None:
                watcher.cancel()
            b.done(pre_left, dec_left)
            b.in_flight -= 1
            self.backends.released(b)
        if broken is not None:
            return Broken(b, broken, framer.events)
        if gone:
            await self._client_left(call, b, framer.events)
            return None
        await self._stream_done(call, b, framer, held, t_send, t_first, send)
        return None

    async def _send_first(self, call: Call, b: Backend, first: bytes, held: bytes, send: Send,
                          t_first: float, t_send: float) -> bytes:
        """Send the stream's first event (read at `t_first`, asked for at `t_send`); returns what is held back."""
        if call.meter is not None or call.track:
            first, held = self._relayed(call, first, held)
        await send({"type": "http.response.body", "body": first, "more_body": True})
        self.telemetry.first_byte(call.endpoint, t_first - call.arrival_s)
        self.policy.observe(FirstToken(t_first, call.rid, b.name, t_first - t_send))
        return held

    async def _pump(self, call: Call, r: UpstreamResponse, framer: SseFramer, held: bytes, send: Send) -> bytes:
        """Relay whole events until the stream ends (each wait bounded by `r.timeout_s`); returns
        what is held back (the final [DONE] until the usage is recorded). An error event after
        tokens is a broken stream (`ErrorEvent`): the events before it are relayed, it is not."""
        error = b""
        partial_s: float | None = None  # when the event now arriving in pieces began to (None: none is)
        while chunk := await r.content.readany():
            out = framer.feed(chunk)
            # a piece of an event: the whole event, not each piece, is due within the bound
            partial_s = None if out else self._piece(partial_s, r.timeout_s)
            if b'{"error"' in out:  # tested inline: this loop runs once per chunk of every stream
                out, error = framer.cut_error(out)
            if call.meter is not None or call.track:
                out, held = self._relayed(call, out, held)
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
            if error or len(framer.buf) > framer.max_event_bytes:
                ended_by(framer, error)
        return held

    def _piece(self, since_s: float | None, bound_s: float) -> float:
        """An event arriving in pieces since `since_s` (None: this is its first): a stall
        (`TimeoutError`) once it has taken more than `bound_s`, so a backend that trickles bytes
        cannot hold a stream beyond the next-token bound; returns when it began."""
        now = self.now()
        if since_s is None:
            return now
        if now - since_s > bound_s:
            raise TimeoutError(f"an SSE event took over {bound_s:.2f} s to arrive (bytes trickled)")
        return since_s

    async def _refused(self, call: Call, b: Backend, r: UpstreamResponse, send: Send) -> None:
        """An error status before the stream: a 5xx (or any refusal of a continuation) is retried
        elsewhere, a client's 4xx is relayed as it is."""
        data = await r.read(MAX_ERROR_BODY_BYTES)
        if r.status == BUSY_STATUS:
            raise busy(b, r.headers.get("retry-after"))
        if r.status >= 500:
            self._fault(b, "5xx")
            raise Retry(b, "5xx", f"HTTP {r.status}")
        if call.resumed:  # the client already has a stream: no error response now
            raise Retry(b, "continuation_refused", f"HTTP {r.status}")
        b.breaker.success()
        self._release(call.rid, b.name, "client error")
        await self._send_bytes(send, call, r.status, data, r.headers.get("content-type", "application/json"), b.name)

    async def _first_event(self, b: Backend, r: UpstreamResponse, framer: SseFramer, deadline_s: float) -> bytes:
        """The stream's first whole event, by `deadline_s` (the first-token stall bound, head
        included); an empty stream or an error event raises `Retry`."""
        first = b""
        while not first:
            r.timeout_s = max(deadline_s - self.now(), 1e-3)
            chunk = await r.content.readany()
            if not chunk:
                self._fault(b, "empty")
                raise Retry(b, "empty", "stream closed before its first event")
            first = framer.feed(chunk)
            if not first:
                framer.check()
        if first.startswith(ERROR_EVENT):
            # The stream failed before any token: nothing reached the client, so it is retried. A
            # decode leg that could not get its KV (lease expired, pull failed) blames
            # `kv_transfer_params`: a failed hand-off, prefilled again elsewhere.
            cause = "handoff" if b'"kv_transfer_params"' in first else "error_event"
            if cause != "handoff":  # a failed hand-off is the prefill side's (see _dispatch)
                self._fault(b, cause)
            raise Retry(b, cause, first[6:200].decode("utf-8", "replace").strip())
        self._garbage(b, first, True)
        return first

    def _garbage(self, b: Backend, answer: bytes, stream: bool) -> None:
        """A 2xx answer (a stream's first events) no engine sends is a `protocol` fault, retried
        before anything reaches the client (`upstream.not_an_answer`)."""
        why = not_an_answer(answer, stream)
        if why is not None:
            self._fault(b, "protocol")
            raise Retry(b, "protocol", why)

    async def _client_left(self, call: Call, b: Backend, delivered: int) -> None:
        """The client disconnected mid-stream: billed as cancelled with what it received (499)."""
        call.gone = True
        await self._meter_end(call, "cancelled", "client_gone", delivered)
        self._release(call.rid, b.name, "client gone")
        self.telemetry.answered(call.endpoint, CLIENT_CLOSED_STATUS)

    async def _stream_done(self, call: Call, b: Backend, framer: SseFramer, held: bytes, t_send: float,
                           t_first: float, send: Send) -> None:
        """The stream ended well: record the usage, then send the held end ([DONE]); feedback."""
        b.breaker.success()
        now = self.now()
        n_out = usage_tokens(framer.tail) or max(framer.events - 1 - call.include_usage, 0)
        if call.meter is not None:  # recorded before [DONE] leaves (docs/failure-domains.md)
            await self._meter_end(call, "completed", "", call.delivered if call.track else
                                  call.meter.delivered_tokens if call.meter.usage_seen else n_out)
        await send({"type": "http.response.body", "body": held + framer.buf, "more_body": False})
        tpot = (now - t_first) / (n_out - 1) if n_out > 1 else 0.0
        self.policy.observe(Completed(now, call.rid, b.name, n_out, tpot, now - call.arrival_s))
        b.observe_latency(t_first - t_send, tpot if n_out > 1 else None)
        self.telemetry.request_done(call.endpoint, now - call.arrival_s)
        self.telemetry.answered(call.endpoint, 200)

    def _relayed(self, call: Call, out: bytes, held: bytes) -> tuple[bytes, bytes]:
        """Whole events from upstream -> (sent to the client now, held back): counts the tokens
        delivered, keeps the events of a migratable stream, reads the usage for the meter."""
        if call.track and not call.events and b'"usage"' not in out:
            call.track = False  # the engine does not count per chunk: no exact count, no migration
        if call.track:
            call.events.append(out)
            n = usage_tokens(out)
            if n:
                call.delivered = call.base + n
        out, held = hold_back(out, held, call.include_usage, None if call.resumed else call.meter)
        if call.track:
            out = relay_events(out, call.keep_chunk_usage, call.base)
        return out, held

    async def _stream_broken(self, call: Call, b: Backend, kind: str, send: Send) -> None:
        """End a stream that broke after its first byte: one error event, then [DONE]."""
        self.telemetry.stream_errors.inc()
        self.telemetry.answered(call.endpoint, 200)
        ev = json.dumps({"error": {"message": f"backend {b.name} failed mid-stream ({kind}); the answer is "
                                              "incomplete", "type": "upstream_error", "param": None,
                                   "code": ERROR_EVENT_STATUS}})
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": f"data: {ev}\n\ndata: [DONE]\n\n".encode(),
                        "more_body": False})


def ended_by(framer: SseFramer, error: bytes) -> None:
    """After relaying whole events: `ErrorEvent` when they ended with error event `error` (b"":
    they did not), `Oversized` when the event being received has passed its bound."""
    if error:
        raise ErrorEvent(error[6:200].decode("utf-8", "replace").strip())
    framer.check()


def stream_headers(call: Call, b: Backend) -> list[tuple[bytes, bytes]]:
    """The response headers of a relayed event stream from backend `b`."""
    return [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
            (b"x-request-id", call.rid.encode()), (b"x-fleetwise-backend", b.name.encode())]


def busy(b: Backend, retry_after: str | None) -> Retry:
    """The `Retry` (cause `busy`) for a 429 from `b`: it answered, so its breaker counts a
    success, and its `Retry-After` (delta-seconds) is kept for the client should every backend be busy."""
    b.breaker.success()
    after = float(retry_after) if retry_after is not None and retry_after.strip().isdigit() else BUSY_RETRY_S
    return Retry(b, "busy", f"HTTP {BUSY_STATUS}", after)
