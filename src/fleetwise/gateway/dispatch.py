"""The route and dispatch stages: ask the policy, send to the chosen backend or P/D pair (the
prefill leg, then the decode leg), retry before the first byte, migrate a stream broken after it,
and free a prefill's KV whose hand-off was refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace
from typing import Any

from fleetwise.core.feedback import Cancelled, Dispatched, Failed
from fleetwise.core.views import RoutingDecision
from fleetwise.gateway.backends import Backend
from fleetwise.gateway.call import (
    CLIENT_CLOSED_STATUS,
    DONE_EVENT,
    INCLUDE_USAGE,
    KV_RELEASE_PATH,
    PD_PREFILL_PARAMS,
    Call,
    ClientGone,
    Receive,
    Retry,
    Send,
)
from fleetwise.gateway.migration import (
    COUNTED_USAGE,
    continuation,
    streamed_text,
)
from fleetwise.gateway.openai import (
    MAX_ERROR_BODY_BYTES,
    with_stream_options,
)
from fleetwise.gateway.relay import BUSY_STATUS, RelayStage
from fleetwise.gateway.upstream import FAULT_ERRORS
from fleetwise.routing.base import reason_kind

__all__ = ["DispatchStage"]


class DispatchStage(RelayStage):
    """Routing, dispatching, retrying and migrating one request."""

    async def _route_and_send(self, call: Call, send: Send, receive: Receive) -> None:
        budget = self.retry_budget
        budget.active += 1
        try:
            await self._attempts(call, send, receive)
        finally:
            budget.active -= 1
            if call.retry_slot:
                budget.give()

    async def _attempts(self, call: Call, send: Send, receive: Receive) -> None:
        """Route and send, retrying within `retries` and the retry budget."""
        tried: set[str] = set(self.not_serving(str(call.body.get("model"))))
        last: Retry | None = None
        reprefills = 0  # hand-offs lost after a finished prefill, bounded by failure_domains.max_reprefills
        refused = ""
        for attempt in range(self.cfg.retries.max_retries + 1):
            if last is not None and not call.retry_slot and (refused := self._retry_refused(call)):
                break
            now = self.now()
            d = self.policy.route(call.route, self.fleet(now, frozenset(tried)))
            kind = d.kind or reason_kind(d.reason)
            self.telemetry.decided(kind)
            if d.worker is None:
                if last is not None:
                    break
                await self._send_error(send, call.endpoint, 503, f"no backend can take this request: {d.reason}",
                                       "service_unavailable", None, "no_backend", 1.0)
                return
            dec = self.backends.get(d.worker)
            pre = self.backends.get(d.prefill_worker) if d.prefill_worker else None
            if dec is None or (d.prefill_worker and pre is None):  # removed between view and route
                self._release(call.rid, d.worker, "backend removed")
                tried.add(d.worker)
                continue
            self._note(dec, call.rid, now, kind, d)
            if pre is not None:
                self._note(pre, call.rid, now, kind, d)
            if call.meter is not None:
                call.meter.attempt("prefill" if last is None else "reprefill", "first" if last is None else last.cause,
                                   (pre.spec.pool, pre.name) if pre is not None else None, (dec.spec.pool, dec.name),
                                   call.route.prompt_tokens)
            rr = call.route
            self.policy.observe(Dispatched(now, call.rid, d.worker, rr.prompt_tokens, rr.block_hashes,
                                           d.prefill_worker))
            try:
                await self._dispatch(call, d, dec, pre, send, receive)
                return
            except ClientGone:  # bill what was delivered: nothing
                await self._meter_end(call, "cancelled", "client_gone", 0)
                self._release(call.rid, d.worker, "client gone")
                self.telemetry.answered(call.endpoint, CLIENT_CLOSED_STATUS)
                return
            except Retry as r:
                last = r
                tried.add(r.backend.name)
                self._attempt_ended(call, r)
                if r.cause == "handoff":  # the prefill ran and its KV is gone: another try is a re-prefill
                    if not self.cfg.failure_domains.may_reprefill(reprefills, 0):
                        break
                    reprefills += 1
                if attempt < self.cfg.retries.max_retries:
                    self.telemetry.retries.labels(r.cause).inc()
        await self._send_failed(call, send, last, refused)

    def _retry_refused(self, call: Call) -> str:
        """Take a retry slot of the budget for `call` (`Call.retry_slot`); when it is spent, why not."""
        if self.retry_budget.take():
            call.retry_slot = True
            return ""
        self.telemetry.retries_refused.inc()
        return (f"; no retry: the retry budget is spent ({self.retry_budget.retrying} retries in flight, "
                f"at most {self.retry_budget.limit()})")

    async def _send_failed(self, call: Call, send: Send, last: Retry | None, refused: str) -> None:
        """The client's answer when no attempt got a first byte: 429 when the last backend was busy, else 502."""
        detail = f"{last.cause} on {last.backend.name}: {last.detail}" if last else "no attempt"
        if last is not None and last.cause == "busy":
            await self._send_error(send, call.endpoint, BUSY_STATUS, f"every backend tried is busy ({detail}){refused}; "
                                   "retry after the Retry-After seconds", "rate_limit_exceeded", None,
                                   "backends_busy", last.retry_after_s)
            return
        await self._send_error(send, call.endpoint, 502, f"backends failed before answering ({detail}){refused}",
                               "upstream_error", None, "upstream_failed", None)

    def _attempt_ended(self, call: Call, r: Retry) -> None:
        """Tell the policy how an attempt ended: released when the backend did no work for it (never
        reached, or busy: a 429), a failure on the backend's record otherwise."""
        ended = Cancelled if r.cause in ("connect", "busy") else Failed
        self.policy.observe(ended(self.now(), call.rid, r.backend.name, r.cause))

    async def _dispatch(self, call: Call, d: RoutingDecision, dec: Backend, pre: Backend | None,
                        send: Send, receive: Receive, body: dict[str, Any] | None = None) -> None:
        """Send `body` (default: the client's) to the pair or replica `d` chose and relay the answer."""
        headers = {"content-type": "application/json", "x-request-id": call.rid}
        payload = call.raw if body is None else json.dumps(body).encode()
        body = call.body if body is None else body
        opts = None
        if call.track:  # a migration needs the exact count of tokens delivered
            opts = COUNTED_USAGE
        elif call.meter is not None and call.stream and not call.include_usage:
            # Metering bills the engine's token count: ask for it, and strip it from the relay.
            opts = INCLUDE_USAGE
        if opts is not None:
            payload = with_stream_options(payload, body, opts)
            body = {**body, "stream_options": {**(body.get("stream_options") or {}), **opts}}
        if pre is not None:
            try:
                kv = await self._prefill(call, pre, headers, send, body)
            except ClientGone:  # a prefill that ended as the client left holds KV no decode leg will take
                self._free_kv(pre, {"remote_request_id": call.rid})
                raise
            if kv is None:
                return  # the prefill leg's client error was relayed
            payload = json.dumps({**body, "kv_transfer_params": kv}).encode()
            self.backends.handoff_started(call.rid, pre.name, dec.name)
        try:
            broken = await self._relay(call, dec, payload, headers, send, receive)
        except Retry as r:
            if pre is None:
                raise
            self._free_kv(pre, kv)  # the decode leg never took the KV: free it now, not at the lease's end
            if r.cause != "handoff":
                raise
            self._fault(pre, "handoff")  # the KV the prefill held is gone: try another pair
            raise Retry(pre, r.cause, r.detail) from None
        except ClientGone:
            if pre is not None:  # the client left while the decode leg was answering: its KV may wait unpulled
                self._free_kv(pre, kv)
            raise
        finally:
            untaken = self.backends.handoff_ended(call.rid)
        if pre is not None and (call.refused or (call.gone and untaken)):
            # the decode side refused the hand-off (a 4xx relayed), or the client left before its first event
            self._free_kv(pre, kv)
        if broken is not None:
            await self._decode_failed(call, broken.backend, broken.kind, send, receive, broken.events)

    def _free_kv(self, pre: Backend, kv: dict[str, Any]) -> None:
        """Ask the prefill replica to free the KV it leased for a hand-off that will not happen (as
        vLLM's NIXL connector frees on abort); best effort, in the background. Without the prefill's
        answer, `kv` names the request by the X-Request-Id sent (as `fleetwise emulate` names it)."""
        rid = kv.get("remote_request_id")
        if not isinstance(rid, str):
            return
        body = json.dumps({"remote_request_id": rid, "remote_engine_id": kv.get("remote_engine_id")}).encode()
        self.telemetry.kv_released.inc()

        async def release() -> None:
            with contextlib.suppress(*FAULT_ERRORS):
                async with self.upstream.post(pre.spec.url + KV_RELEASE_PATH, body,
                                              {"content-type": "application/json"},
                                              read_s=self.cfg.scrape.timeout_s) as r:
                    await r.read(MAX_ERROR_BODY_BYTES)

        task = asyncio.get_running_loop().create_task(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _prefill(self, call: Call, b: Backend, headers: dict[str, str], send: Send,
                       body: dict[str, Any]) -> Any:
        """The prefill leg: `max_tokens` 1, not streamed, `do_remote_decode`; returns the
        `kv_transfer_params` for the decode leg (None when a client error was relayed)."""
        leg = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": dict(PD_PREFILL_PARAMS)}
        if "max_completion_tokens" in leg:
            leg["max_completion_tokens"] = 1
        leg.pop("stream_options", None)
        status, data, ctype = await self._request_whole(b, call, json.dumps(leg).encode(), headers, None)
        if status >= 400 and call.resumed:  # the client already has a stream: no error response now
            raise Retry(b, "continuation_refused", f"HTTP {status}")
        if status >= 400:
            await self._send_bytes(send, call, status, data, ctype, b.name)
            return None
        try:
            kv = json.loads(data)["kv_transfer_params"]
        except (ValueError, KeyError, TypeError):
            kv = None
        if not isinstance(kv, dict):
            self._fault(b, "protocol")
            raise Retry(b, "protocol", "prefill answer has no kv_transfer_params (is the backend started "
                                        "with a KV connector?)")
        self.telemetry.pd_handoffs.inc()
        return kv

    async def _decode_failed(self, call: Call, b: Backend, kind: str, send: Send, receive: Receive,
                             events: int) -> None:
        """A stream broke after its first byte: continue it on another replica when the failure
        domains say `migrate` (prompt + the text delivered, the remaining budget), else (or when
        no continuation can be sent) end it with an error event (docs/failure-domains.md)."""
        self.policy.observe(Failed(self.now(), call.rid, b.name, kind))
        tried = {b.name, *self.not_serving(str(call.body.get("model")))}
        fd = self.cfg.failure_domains
        while call.track and fd.may_migrate(call.migrations):
            remaining = (call.route.max_output_tokens or 0) - call.delivered
            chat = call.endpoint == "chat"
            body = continuation(call.body, chat, streamed_text(call.events, chat), remaining)
            if body is None:
                break
            call.migrations += 1
            if remaining <= 0:  # every token arrived; only the end of the stream was lost
                await self._meter_end(call, "completed", "", call.delivered)
                with contextlib.suppress(OSError):
                    await send({"type": "http.response.body", "body": DONE_EVENT, "more_body": False})
                self.telemetry.answered(call.endpoint, 200)
                return
            now = self.now()
            rr = replace(call.route, prompt_tokens=call.route.prompt_tokens + call.delivered,
                         max_output_tokens=remaining)
            d = self.policy.route(rr, self.fleet(now, frozenset(tried)))
            dec = self.backends.get(d.worker) if d.worker else None
            pre = self.backends.get(d.prefill_worker) if d.prefill_worker else None
            if dec is None or (d.prefill_worker and pre is None):
                break
            self._note(dec, call.rid, now, d.kind or reason_kind(d.reason), d)
            if call.meter is not None:
                call.meter.attempt("migration", kind, (pre.spec.pool, pre.name) if pre is not None else None,
                                   (dec.spec.pool, dec.name), call.meter.prompt_tokens + call.delivered)
            self.policy.observe(Dispatched(now, call.rid, dec.name, rr.prompt_tokens, rr.block_hashes,
                                           d.prefill_worker))
            self.telemetry.migrations.inc()
            call.resumed, call.base = True, call.delivered
            try:
                await self._dispatch(call, d, dec, pre, send, receive, body)
                return
            except Retry as r:  # the continuation failed before its first token: another one
                tried.add(r.backend.name)
                self._attempt_ended(call, r)
                b, kind = r.backend, r.cause
        await self._meter_end(call, "failed", f"stream_broken_{kind}", call.delivered if call.track else events)
        await self._stream_broken(call, b, kind, send)
