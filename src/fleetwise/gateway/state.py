"""The gateway's state and the verdicts every stage records.

`GatewayState` holds one process's config, policy, backends, tenants, telemetry, ledger writer and
idempotency store, and the few actions every stage of the request path shares: a fault on a
backend's record (breaker, counters, stall hold), a released reservation, an answer sent, the
usage record written. The stages build on it in the order a request meets them.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import time
from collections.abc import Callable
from typing import Any, get_args

from fleetwise.core.feedback import Cancelled, WorkerDown, WorkerUp
from fleetwise.core.views import FleetView, RoutingDecision
from fleetwise.gateway.backends import Backend, Backends, Decision
from fleetwise.gateway.call import (
    Call,
    Send,
    log,
)
from fleetwise.gateway.config import GatewayConfig, Role
from fleetwise.gateway.idempotency import IdempotencyStore
from fleetwise.gateway.kv_zmq import ZmqKvEventFeed
from fleetwise.gateway.limits import TenantLimiter
from fleetwise.gateway.metering import open_writer
from fleetwise.gateway.openai import (
    error_body,
)
from fleetwise.gateway.prompt_tokens import make_tokenizer
from fleetwise.gateway.retry_budget import RetryBudget
from fleetwise.gateway.telemetry import Telemetry
from fleetwise.gateway.upstream import Upstream
from fleetwise.routing import make_policy

__all__ = ["GatewayState"]


class GatewayState:
    """One gateway process's state: config, policy, backends, limits, telemetry, ledger."""

    def __init__(self, cfg: GatewayConfig, *, admin_token: str | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 dashboard: Callable[[dict[str, Any]], str] | None = None) -> None:
        self.cfg = cfg
        self.dashboard = dashboard
        """Renders the /admin/fleet document as the live page served at /dashboard (None: no page)."""
        self._clock = clock
        self._t0 = clock()
        self.policy = make_policy(cfg.routing, seed=cfg.seed)
        self.backends = Backends(cfg.breaker, cfg.recent_decisions, cfg.scrape.panic_threshold)
        for b in cfg.backends:
            self.backends.upsert(b)
        self.admin_token = admin_token if admin_token is not None else (
            cfg.admin_token or os.environ.get(cfg.admin_token_env) or None)
        self.metrics_token = cfg.metrics_token or os.environ.get(cfg.metrics_token_env) or None
        """Bearer token /metrics requires (None: open)."""
        self.limiters: dict[str, TenantLimiter] = {}
        self.tenant_of_key: dict[str, TenantLimiter] = {}
        for t in cfg.tenants:
            lim = self.limiters[t.name] = TenantLimiter(t)
            for k in t.api_keys:
                self.tenant_of_key[k] = lim
        self.default_limiter = TenantLimiter(cfg.default_tenant)
        self.telemetry = Telemetry(self.backends, self.now, self.policy.report)
        self.retry_budget = RetryBudget(cfg.retries.budget_percent, cfg.retries.min_retry_concurrency)
        self.upstream = Upstream(cfg.timeouts.connect_s, cfg.timeouts.first_byte_s, cfg.timeouts.idle_s)
        self.discovered_models: dict[str, frozenset[str]] = {}
        self.contexts: dict[str, dict[str, int]] = {}
        """Each backend's context length per model (`max_model_len` of its /v1/models)."""
        self._ids = itertools.count()
        self._id_prefix = f"{os.getpid() & 0xFFFFFFFF:08x}"
        """Request ids are this process's id then a counter, 32 hex digits in all: a UUID's form,
        which some servers require of `X-Request-Id` (llama-cpp-python's answers 400 otherwise)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        """Fire-and-forget requests in flight (KV releases), kept referenced until done."""
        self._file_backends: set[str] = set()
        self._file_mtime: float | None = None
        self._fleet_key: tuple[Any, ...] | None = None
        self._fleet_workers: FleetView | None = None
        self.block_bytes = max(1, round(cfg.limits.hash_block_tokens * cfg.limits.chars_per_token))
        self.idempotency = IdempotencyStore(cfg.idempotency.ttl_s, cfg.idempotency.max_bytes)
        """Keys in flight and the answers of completed ones (`Idempotency-Key` replays)."""
        self.ledger = open_writer(cfg)
        """Usage metering: the ledger behind its background writer and spool (None: no ledger)."""
        self.telemetry.watch_ledger(self.ledger)
        self.wants_hashes = bool(getattr(self.policy, "wants_kv_events", True))
        """Prompt prefix hashes are computed only for policies that read the prefix index."""
        self.tokenizer = make_tokenizer(cfg.tokenizer)
        """Prompt -> token ids for exact lengths and id hashes (None: estimate from characters)."""
        self.kv_feeds: dict[str, tuple[ZmqKvEventFeed, asyncio.Task[None]]] = {}
        """Each followed backend's KV-event subscription and the task running it."""

    def now(self) -> float:
        """Seconds since the gateway started (the clock of every view and feedback event)."""
        return self._clock() - self._t0

    def known_models(self) -> frozenset[str]:
        """Models a request may name: the configured list, else what live backends report."""
        if self.cfg.models:
            return frozenset(self.cfg.models)
        out: set[str] = set()
        for name in self.backends.live:
            out |= self.discovered_models.get(name, frozenset())
        return frozenset(out)

    def not_serving(self, model: str) -> frozenset[str]:
        """Live backends whose last /v1/models answer does not list `model` (one restarted with
        another model or version) while another one does: a request for `model` goes to those
        that list it. None listing it excludes none (a configured model's answer is the backends')."""
        out = frozenset(name for name in self.backends.live
                        if (ms := self.discovered_models.get(name)) is not None and model not in ms)
        return out if len(out) < len(self.backends.live) else frozenset()

    def _fault(self, b: Backend, kind: str) -> None:
        b.faults += 1
        held = b.breaker.held
        b.breaker.fault(self.now(), self.backends.may_eject(b))
        if b.breaker.held and not held:
            role = b.spec.role
            log.warning("breaker of %s kept closed: %d of %d %s backends already have open breakers "
                        "(breaker.max_ejection_percent %s)", b.name,
                        sum(m.breaker.opened_at_s is not None for m in self.backends.live.values()
                            if m.spec.role == role),
                        sum(m.spec.role == role for m in self.backends.live.values()), role,
                        self.cfg.breaker.max_ejection_percent)
        self.telemetry.upstream_errors.labels(b.name, kind).inc()
        if kind == "timeout" and b.probe_ok and self.cfg.stall.enabled and self.cfg.stall.probe_interval_s > 0:
            # A stalled request: the backend counts as failing its health checks until a probe passes.
            b.probe_ok = False
            self._health_verdict(b, False)

    def _health_verdict(self, b: Backend, ok: bool) -> None:
        """One health observation: `health_failures` in a row take `b` out, one success brings it back
        (while its role is in a panic, `b` stays routable either way: `_sync_panic`)."""
        role = b.spec.role
        if ok:
            b.health_failures = 0
            if not b.healthy:
                b.healthy = True
                b.breaker.success()
                if role not in self.backends.panic:
                    self._worker_up(b)
                self._sync_panic(role)
        else:
            b.health_failures += 1
            if b.healthy and b.health_failures >= self.cfg.scrape.health_failures:
                b.healthy = False
                if role not in self.backends.panic:
                    self.policy.observe(WorkerDown(self.now(), b.name, "health check failed"))
                self._sync_panic(role)

    def _worker_up(self, b: Backend) -> None:
        self.policy.observe(WorkerUp(self.now(), b.name, b.spec.model_version))
        feed = self.kv_feeds.get(b.name)
        if feed is not None:  # WorkerUp emptied its prefix index: take the engine's contents again
            feed[0].resubscribe()

    def _sync_panic(self, *roles: str) -> None:
        """Enter or leave a panic for each of `roles` (all when none named): its backends down on
        health checks alone go back to the policy while it lasts (never an empty fleet from health
        verdicts alone, Envoy's panic threshold) and leave again when it ends."""
        for role in roles or get_args(Role):
            if not self.backends.update_panic(role):
                continue
            panic = role in self.backends.panic
            down = [b for b in self.backends.live.values() if b.spec.role == role and not b.healthy]
            log.warning("%s %s backends: %d of %d fail their health checks (panic_threshold %s)",
                        "routing to all" if panic else "health verdicts apply again to", role, len(down),
                        sum(b.spec.role == role for b in self.backends.live.values()),
                        self.cfg.scrape.panic_threshold)
            for b in down:
                if panic:
                    self._worker_up(b)
                else:
                    self.policy.observe(WorkerDown(self.now(), b.name, "health check failed"))

    def _release(self, rid: str, worker: str, why: str) -> None:
        """Release the policy's reservation for a request that ends without a verdict on the
        backend's speed (removed backend, client error, client gone): `Cancelled`."""
        self.policy.observe(Cancelled(self.now(), rid, worker, why))

    def _note(self, b: Backend, rid: str, now: float, kind: str, d: RoutingDecision) -> None:
        b.selected += 1
        if self.cfg.recent_decisions:
            score = d.scores.get(b.name)
            b.recent.append(Decision(rid, now, kind, d.reason, score))

    async def _send_bytes(self, send: Send, call: Call, status: int, data: bytes, ctype: str, backend: str) -> None:
        call.refused = status >= 400
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", ctype.encode("latin-1")), (b"content-length", str(len(data)).encode()),
            (b"x-request-id", call.rid.encode()), (b"x-fleetwise-backend", backend.encode())]})
        await send({"type": "http.response.body", "body": data})
        now = self.now()
        self.telemetry.first_byte(call.endpoint, now - call.arrival_s)
        self.telemetry.request_done(call.endpoint, now - call.arrival_s)
        self.telemetry.answered(call.endpoint, status)

    async def _send_error(self, send: Send, endpoint: str, status: int, message: str, type_: str,
                          param: str | None, code: str | int | None, retry_after_s: float | None) -> None:
        data = error_body(status, message, type_, param, code)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        if retry_after_s is not None:
            headers.append((b"retry-after", str(max(1, math.ceil(retry_after_s))).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
        self.telemetry.answered(endpoint, status)

    async def _meter_end(self, call: Call, status: Any, reason: str, delivered: int) -> None:
        """Record the request's usage once (no-op without a ledger)."""
        if call.meter is not None and not call.meter.ended:
            call.meter.delivered_tokens = delivered
            await call.meter.end(status, reason, time.time())
