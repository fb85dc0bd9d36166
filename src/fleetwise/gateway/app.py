"""`Gateway`: the OpenAI-compatible front, routing through a fleetwise policy, and the loops that
keep its fleet view current (scrapes, health checks, the watched backends file).

Per completion request: read the body (bounded) -> tenant and limits -> parse the routing fields
-> `policy.route()` on the current `FleetView` -> send to the chosen backend (for a P/D pair: the
prefill leg, then the decode leg with the returned `kv_transfer_params`) -> relay the answer
chunk by chunk. Before the first byte reaches the client, a connect error, timeout or 5xx is
retried on another eligible backend (bounded, counted); after it, a broken stream ends with an
OpenAI-style error event. Every outcome is reported to the policy (`observe`) and to the
backend's circuit breaker (faults only: a client's 4xx is not the backend's fault).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import math
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from fleetwise.core.feedback import Cancelled, Completed, Dispatched, Failed, FirstToken, WorkerDown, WorkerUp
from fleetwise.core.tokens import block_hashes
from fleetwise.core.views import FleetView, RouteRequest, RoutingDecision
from fleetwise.errors import SpecError
from fleetwise.gateway.admit import check_context, check_token_ids, vocabulary
from fleetwise.gateway.backends import Backend, Backends, Decision
from fleetwise.gateway.config import BackendSpec, GatewayConfig, TenantSpec
from fleetwise.gateway.idempotency import IdempotencyStore, Recorder, fingerprint, key_error
from fleetwise.gateway.kv_events import KvEventFeed, kv_source
from fleetwise.gateway.kv_zmq import ZmqKvEventFeed
from fleetwise.gateway.limits import TenantLimiter
from fleetwise.gateway.metering import ledger_ready, open_writer
from fleetwise.gateway.migration import (
    COUNTED_USAGE,
    client_wants_continuous,
    continuation,
    relay_events,
    streamed_text,
)
from fleetwise.gateway.openai import (
    ClientError,
    error_body,
    parse_json_body,
    parse_request,
    prompt_blocks,
    with_stream_options,
)
from fleetwise.gateway.prompt_tokens import make_tokenizer, request_ids
from fleetwise.gateway.scrape import parse_metrics
from fleetwise.gateway.stall import first_token_bound_s, fleet_ttft_s, next_token_bound_s, probe_body
from fleetwise.gateway.telemetry import Telemetry
from fleetwise.gateway.upstream import FAULT_ERRORS, SseFramer, Upstream, fault_kind
from fleetwise.ledger import IdempotencyKeyError, idempotency_key
from fleetwise.ledger.meter import Meter
from fleetwise.routing import make_policy
from fleetwise.routing.base import reason_kind
from fleetwise.spec.base import read_document, validate
from fleetwise.spec.inputs import parse_json

__all__ = ["Gateway"]

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
_EMPTY_CHOICES = re.compile(rb'"choices":\s*\[\s*\]')
"""A usage-only stream event (no choices)."""


class _ClientGone(Exception):
    """The client disconnected while a whole (non-streamed) answer was awaited: the upstream request
    was closed, so the engine aborts it; nothing was delivered."""


class _Retry(Exception):
    """A backend fault before the first byte reached the client: try another backend."""

    def __init__(self, backend: Backend, cause: str, detail: str) -> None:
        super().__init__(detail)
        self.backend, self.cause, self.detail = backend, cause, detail


@dataclass(slots=True)
class _Call:
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


def _pinned(tenant: str, field_name: str, pin: str | None, asked: str | None, header: bytes) -> str | None:
    """The tenant's pin wins over the client's header; a header contradicting it is a 403."""
    if pin is not None and asked is not None and asked != pin:
        h = header.decode()
        raise ClientError(403, f"header {h}={asked!r} contradicts tenant {tenant!r}'s {field_name} pin {pin!r}; "
                               "drop the header or send the pinned value", type_="permission_error", param=h,
                          code="pinned_by_tenant")
    return pin if pin is not None else asked


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


class Gateway:
    """One gateway process's state: config, policy, backends, limits, telemetry, loops."""

    def __init__(self, cfg: GatewayConfig, *, admin_token: str | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 dashboard: Callable[[dict[str, Any]], str] | None = None) -> None:
        self.cfg = cfg
        self.dashboard = dashboard
        """Renders the /admin/fleet document as the live page served at /dashboard (None: no page)."""
        self._clock = clock
        self._t0 = clock()
        self.policy = make_policy(cfg.routing, seed=cfg.seed)
        self.backends = Backends(cfg.breaker, cfg.recent_decisions)
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
        self.kv_feeds: dict[str, tuple[KvEventFeed | ZmqKvEventFeed, asyncio.Task[None]]] = {}
        """Each followed backend's KV-event subscription and the task running it."""

    # ---- clock, models, lifecycle --------------------------------------------------------------

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

    async def start(self) -> None:
        """Open the client pool and start the background loops (inside the serving event loop)."""
        await self.upstream.open()
        if self.cfg.backends_file:
            self.reload_backends_file()
        await asyncio.gather(self.scrape_once(), self.health_once())
        for b in self.backends.live.values():
            self._follow_kv(b)
        self._tasks = [asyncio.create_task(self._every(self.cfg.scrape.interval_s, self.scrape_once)),
                       asyncio.create_task(self._every(self.cfg.scrape.health_interval_s, self.health_once))]
        if self.cfg.backends_file:
            self._tasks.append(asyncio.create_task(self._every(self.cfg.scrape.watch_interval_s, self._watch)))
        if self.cfg.stall.enabled and self.cfg.stall.probe_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._every(self.cfg.stall.probe_interval_s, self.probe_once)))

    async def stop(self) -> None:
        """Stop the loops and close the client pool."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        for name in list(self.kv_feeds):
            await self._unfollow_kv(name)
        await self.upstream.close()
        if self.ledger is not None:
            await asyncio.to_thread(self.ledger.close)

    async def _every(self, period_s: float, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await fn()
            except Exception:  # a loop must outlive any one bad round
                log.exception("background loop %s failed", getattr(fn, "__name__", fn))

    # ---- fleet view: scrapes, health, file, admin ----------------------------------------------

    async def scrape_once(self) -> None:
        """Read every live backend's /metrics once (concurrently); failures leave the view aging."""
        bs = [b for b in self.backends.live.values() if b.spec.metrics_path is not None]
        await asyncio.gather(*(self._scrape(b) for b in bs))

    async def _scrape(self, b: Backend) -> None:
        try:
            status, data = await self.upstream.get(b.spec.url + str(b.spec.metrics_path), self.cfg.scrape.timeout_s)
        except FAULT_ERRORS:
            status, data = 0, b""
        if status != 200:
            b.scrape_errors += 1
            self.telemetry.scrapes.labels("error").inc()
            return
        b.scraped(parse_metrics(data.decode("utf-8", "replace")), self.now())
        self.telemetry.scrapes.labels("ok").inc()

    async def health_once(self) -> None:
        """Poll every live backend's health endpoint (and /v1/models unless models are configured)."""
        await asyncio.gather(*(self._health(b) for b in list(self.backends.live.values())))

    async def _health(self, b: Backend) -> None:
        ok = False
        try:
            status, _ = await self.upstream.get(b.spec.url + b.spec.health_path, self.cfg.scrape.timeout_s)
            ok = status == 200
            if ok:
                status, data = await self.upstream.get(b.spec.url + "/v1/models", self.cfg.scrape.timeout_s)
                if status == 200:
                    ms = [m for m in json.loads(data).get("data", []) if isinstance(m, dict) and "id" in m]
                    self.discovered_models[b.name] = frozenset(str(m["id"]) for m in ms)
                    self.contexts[b.name] = {str(m["id"]): int(m["max_model_len"]) for m in ms
                                             if isinstance(m.get("max_model_len"), int)}
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError):
            ok = False
        self._health_verdict(b, ok and b.probe_ok)

    def _health_verdict(self, b: Backend, ok: bool) -> None:
        """One health observation: `health_failures` in a row take `b` out, one success brings it back."""
        now = self.now()
        if ok:
            b.health_failures = 0
            if not b.healthy:
                b.healthy = True
                b.breaker.success()
                self.policy.observe(WorkerUp(now, b.name, b.spec.model_version))
                feed = self.kv_feeds.get(b.name)
                if feed is not None:  # WorkerUp emptied its prefix index: take the engine's contents again
                    feed[0].resubscribe()
        else:
            b.health_failures += 1
            if b.healthy and b.health_failures >= self.cfg.scrape.health_failures:
                b.healthy = False
                self.policy.observe(WorkerDown(now, b.name, "health check failed"))

    async def probe_once(self) -> None:
        """Actively probe every live mixed backend with a one-token completion (see `stall`)."""
        await asyncio.gather(*(self._probe(b) for b in list(self.backends.live.values()) if b.spec.role == "mixed"))

    async def _probe(self, b: Backend) -> None:
        models = self.cfg.models or tuple(sorted(self.discovered_models.get(b.name, ())))
        if not models:
            return
        bound = first_token_bound_s(b, fleet_ttft_s(self.backends.live.values()), self.cfg.stall,
                                    self.cfg.timeouts)
        try:
            async with self.upstream.post(b.spec.url + "/v1/completions", probe_body(models[0]),
                                          {"content-type": "application/json"}, read_s=bound) as r:
                await r.read()
                ok = r.status < 500
        except FAULT_ERRORS:
            ok = False
        b.probe_ok = ok
        if not ok:
            self.telemetry.upstream_errors.labels(b.name, "probe").inc()
            self._health_verdict(b, False)

    def add_backend(self, spec: BackendSpec) -> bool:
        """Add or update a backend (config file, admin API); True when new. A new one is routable
        at once; its view is stale until its first scrape."""
        b, new = self.backends.upsert(spec)
        if self.upstream.session is not None:
            if new:
                asyncio.get_running_loop().create_task(self._first_look(b))
            self._follow_kv(b)
        return new

    def _follow_kv(self, b: Backend) -> None:
        """Subscribe to `b`'s KV events when it publishes them and the policy reads a prefix index
        (a changed source starts a new subscription)."""
        feed = self.kv_feeds.get(b.name)
        src = kv_source(b.spec) if self.wants_hashes else None
        if feed is not None and feed[0].source == src:
            return
        if feed is not None:
            feed[1].cancel()
            del self.kv_feeds[b.name]
        if src is None:
            return
        z = b.spec.kv_events
        f: KvEventFeed | ZmqKvEventFeed
        if z is not None:
            f = ZmqKvEventFeed(b.name, z, self.cfg.limits.hash_block_tokens, self.policy.observe, self.now)
        else:
            f = KvEventFeed(b.name, b.spec.url + (b.spec.kv_events_path or ""), self.cfg.limits.hash_block_tokens, lambda: self.upstream.session,
                            self.policy.observe, self.now, self.cfg.timeouts.connect_s)
        self.kv_feeds[b.name] = (f, asyncio.get_running_loop().create_task(f.run()))

    async def _unfollow_kv(self, name: str) -> None:
        feed = self.kv_feeds.pop(name, None)
        if feed is not None:
            feed[1].cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feed[1]

    async def _first_look(self, b: Backend) -> None:
        await asyncio.gather(self._health(b), self._scrape(b) if b.spec.metrics_path else asyncio.sleep(0))

    def remove_backend(self, name: str) -> bool:
        """Stop routing to a backend; its in-flight requests finish (drain)."""
        b = self.backends.remove(name)
        self.discovered_models.pop(name, None)
        feed = self.kv_feeds.pop(name, None)
        if feed is not None:
            feed[1].cancel()
        if b is not None:
            self.policy.observe(WorkerDown(self.now(), name, "removed"))
        return b is not None

    def reload_backends_file(self) -> None:
        """Reconcile with `backends_file`: add/update what it lists, remove what it dropped."""
        path = Path(str(self.cfg.backends_file))
        try:
            self._file_mtime = path.stat().st_mtime
            doc = read_document(path)
            items = doc.get("backends", []) if isinstance(doc, dict) else doc
            if not isinstance(items, list):
                raise SpecError(f"{path}: expected a list of backends or {{backends: [...]}}")
            specs = [validate(BackendSpec, it, f"{path}: backends[{i}]", strict=True) for i, it in enumerate(items)]
        except (SpecError, OSError) as err:
            log.error("backends file not applied, keeping the previous fleet: %s", err)
            return
        names = {s.key for s in specs}
        for s in specs:
            self.add_backend(s)
        for gone in self._file_backends - names:
            self.remove_backend(gone)
        self._file_backends = names

    async def _watch(self) -> None:
        try:
            mtime = Path(str(self.cfg.backends_file)).stat().st_mtime
        except OSError:
            return
        if mtime != self._file_mtime:
            self.reload_backends_file()

    def fleet(self, now_s: float, exclude: frozenset[str] = frozenset()) -> FleetView:
        """The current view; the workers tuple is reused while nothing it shows changed (the
        policy memoises per tuple), so a burst of requests between scrapes pays for one build."""
        if exclude:
            return self.backends.fleet(now_s, exclude)
        key: list[Any] = [self.backends.version]
        for b in self.backends.live.values():
            if b.spec.metrics_path is None or b.breaker.opened_at_s is not None:
                return self.backends.fleet(now_s)  # time-dependent view: build afresh
            key += (b.scraped_at_s, b.healthy)
        k = tuple(key)
        if k != self._fleet_key or self._fleet_workers is None:
            self._fleet_key, self._fleet_workers = k, self.backends.fleet(now_s)
        return FleetView(now_s=now_s, workers=self._fleet_workers.workers)

    # ---- the ASGI application --------------------------------------------------------------------

    def app(self) -> _FastPath:
        """The ASGI application: completions go straight to `handle`, everything else (and the
        lifespan, which starts and stops the loops) through Starlette's router."""

        @contextlib.asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            await self.start()
            try:
                yield
            finally:
                await self.stop()

        routes = [
            Route("/v1/completions", _Endpoint(self, chat=False), methods=["POST"]),
            Route("/v1/chat/completions", _Endpoint(self, chat=True), methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/health", self._health_ep, methods=["GET"]),
            Route("/readiness", self._readiness, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
            Route("/admin/fleet", self._admin_fleet, methods=["GET"]),
            Route("/admin/backends", self._admin_backends, methods=["GET", "POST"]),
            Route("/admin/backends/{name:path}", self._admin_backend_delete, methods=["DELETE"]),
        ]
        if self.dashboard is not None:
            routes.append(Route("/dashboard", self._dashboard_page, methods=["GET"]))
        app = Starlette(routes=routes, lifespan=lifespan)
        app.add_exception_handler(404, _not_found)
        app.add_exception_handler(405, _not_allowed)
        return _FastPath(self, app)

    async def _models(self, _: Request) -> Response:
        data = [{"id": m, "object": "model", "owned_by": "fleetwise"} for m in sorted(self.known_models())]
        return JSONResponse({"object": "list", "data": data})

    async def _health_ep(self, _: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def _readiness(self, _: Request) -> Response:
        now = self.now()
        n = sum(b.available(now) for b in self.backends.live.values())
        metering_ok, ledger = ledger_ready(self.ledger, self.cfg)
        ready = n > 0 and metering_ok
        doc: dict[str, Any] = {"ready": ready, "available_backends": n}
        if ledger is not None:
            doc["ledger"] = ledger
        return JSONResponse(doc, status_code=200 if ready else 503)

    async def _metrics(self, request: Request) -> Response:
        if self.metrics_token and not hmac.compare_digest(request.headers.get("authorization", "").encode(),
                                                          f"Bearer {self.metrics_token}".encode()):
            return _error_response(401, "/metrics: missing or wrong bearer token (metrics_token_env)",
                                   "authentication_error")
        return Response(self.telemetry.render(), media_type="text/plain; version=0.0.4")

    def _admin_refusal(self, request: Request, presented: str | None = None) -> Response | None:
        if not self.admin_token:
            return _error_response(403, "admin API disabled: set the admin token (admin_token_env) to enable it",
                                   "permission_error")
        got = presented if presented is not None else request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {self.admin_token}".encode()):
            return _error_response(401, "admin API: missing or wrong bearer token", "authentication_error")
        return None

    def fleet_document(self) -> dict[str, Any]:
        """The /admin/fleet JSON (shape documented in docs/gateway.md)."""
        now = self.now()
        rep = self.policy.report()
        return {
            "now_s": round(now, 3),
            "policy": rep.get("policy"),
            "safe_mode": rep.get("safe_mode"),
            "decisions": rep.get("decisions"),
            "by_reason": rep.get("by_reason"),
            "slowness": rep.get("slowness"),
            "models": sorted(self.known_models()),
            "backends": [{**b.admin(now), "kv_events": self._kv_admin(b.name)} for b in self.backends.live.values()],
            "draining": [b.admin(now) for b in self.backends.draining.values()],
            "tenants": {n: {"active": t.active, "admitted": t.admitted, "refused": t.refused}
                        for n, t in {"default": self.default_limiter, **self.limiters}.items()},
        }

    def _kv_admin(self, name: str) -> dict[str, Any] | None:
        feed = self.kv_feeds.get(name)
        return None if feed is None else feed[0].admin()

    async def _dashboard_page(self, request: Request) -> Response:
        """The live fleet page; a browser cannot set headers, so `?token=` stands for the bearer token."""
        assert self.dashboard is not None
        token = request.query_params.get("token")
        refused = self._admin_refusal(request, None if token is None else f"Bearer {token}")
        return refused or HTMLResponse(self.dashboard(self.fleet_document()))

    async def _admin_fleet(self, request: Request) -> Response:
        return self._admin_refusal(request) or JSONResponse(self.fleet_document())

    async def _admin_backends(self, request: Request) -> Response:
        refused = self._admin_refusal(request)
        if refused:
            return refused
        if request.method == "GET":
            return JSONResponse([b.spec.model_dump() for b in self.backends.live.values()])
        try:
            doc = parse_json(await request.body(), "backend", self.cfg.limits.max_body_bytes)
            spec = validate(BackendSpec, doc, "backend")
        except SpecError as err:
            return _error_response(400, str(err))
        new = self.add_backend(spec)
        return JSONResponse({"name": spec.key, "added": new}, status_code=201 if new else 200)

    async def _admin_backend_delete(self, request: Request) -> Response:
        refused = self._admin_refusal(request)
        if refused:
            return refused
        name = request.path_params["name"]
        if not self.remove_backend(name):
            return _error_response(404, f"backend {name!r} not found; GET /admin/backends lists them", "not_found")
        return JSONResponse({"name": name, "removed": True})

    # ---- completions -------------------------------------------------------------------------------

    def _tenant(self, scope: dict[str, Any]) -> TenantLimiter:
        auth = _header(scope, b"authorization")
        key = auth[7:].strip() if auth and auth[:7].lower() == "bearer " else None
        lim = self.tenant_of_key.get(key) if key is not None else None
        if lim is not None:
            return lim
        if key is not None and self.cfg.unknown_keys == "reject":
            raise ClientError(401, "API key is not known; send `Authorization: Bearer <key>` with a key listed "
                                   "under tenants[].api_keys", type_="authentication_error", code="invalid_api_key")
        if self.cfg.require_api_key:
            raise ClientError(401, "missing or unknown API key; send `Authorization: Bearer <key>`",
                              type_="authentication_error", code="invalid_api_key")
        return self.default_limiter

    async def handle(self, scope: dict[str, Any], receive: Receive, send: Send, chat: bool) -> None:
        """One completion request, from the first body byte to the last relayed chunk."""
        arrival = self.now()
        endpoint = "chat" if chat else "completions"
        try:
            raw = await _read_body(scope, receive, self.cfg.limits.max_body_bytes)
            lim = self._tenant(scope)
            body = parse_json_body(raw, self.cfg.limits.max_body_bytes)
            lm = self.cfg.limits
            pr = parse_request(body, chat, self.known_models(), lm.max_output_tokens, lm.chars_per_token)
            spec: TenantSpec = lim.spec
            version = _pinned(spec.name, "model_version", spec.model_version, _header(scope, VERSION_HEADER),
                              VERSION_HEADER)
            region = _pinned(spec.name, "region", spec.region, _header(scope, REGION_HEADER), REGION_HEADER)
            self._check_labels(version, region)
            max_out = pr.max_tokens or lm.default_max_tokens
            ids = pr.prompt_ids if self.tokenizer is None else self._tokenize(body, chat)
            if pr.prompt_ids is not None and ids is not None:
                check_token_ids(ids, vocabulary(lm.vocab_size, self.tokenizer, pr.model))
            prompt_tokens = pr.prompt_tokens if ids is None else max(len(ids), 1)
            if pr.max_tokens is not None:  # before any prefill: a decode side would refuse it
                check_context(prompt_tokens if ids is not None else 0, pr.max_tokens, self._context(pr.model))
            key = idempotency_key(_header(scope, IDEMPOTENCY_HEADER)) if self.ledger is not None else ""
            admission = lim.admit(prompt_tokens + max_out, arrival)
        except ClientError as err:
            await self._send_error(send, endpoint, err.status, err.message, err.type, err.param, err.code,
                                   err.retry_after_s)
            return
        except IdempotencyKeyError as err:
            await self._send_error(send, endpoint, 400, str(err), "invalid_request_error", "Idempotency-Key",
                                   "invalid_idempotency_key", None)
            return
        async with admission:  # released on every way out, exactly once
            client_key = key if self.ledger is not None and _header(scope, IDEMPOTENCY_HEADER) is not None else None
            rec: Recorder | None = None
            if client_key is not None:
                if await self._idempotent_answer(send, endpoint, spec.name, client_key, raw):
                    return
                send = rec = Recorder(send)
            rid = f"{self._id_prefix}{next(self._ids):024x}"
            hashes: tuple[int, ...] = ()
            if self.wants_hashes:
                hashes = prompt_blocks(pr.prompt_text, self.block_bytes) if ids is None else \
                    block_hashes(ids, lm.hash_block_tokens)
            rr = RouteRequest(request_id=rid, prompt_tokens=prompt_tokens, max_output_tokens=max_out,
                              block_hashes=hashes, tenant=spec.name, model_version=version, region=region,
                              arrival_s=arrival, hash_block_tokens=lm.hash_block_tokens)
            call = _Call(rid, endpoint, scope["path"], arrival, raw, body, pr.stream, pr.include_usage, rr,
                         receive=receive)
            if pr.stream and self.cfg.failure_domains.may_migrate(0):
                call.track, call.keep_chunk_usage = True, client_wants_continuous(body)
            if self.ledger is not None:
                call.meter = Meter(self.ledger, key, rid, spec.name, pr.model, time.time(), prompt_tokens)
            try:
                await self._route_and_send(call, send, receive)
            finally:
                if rec is not None and client_key is not None:  # before any await: the client may retry at once
                    done = rec.status == 200 and call.meter is not None and call.meter.status == "completed"
                    self.idempotency.finish(spec.name, client_key, rec.status, rec.content_type, rec.body, done)
                if call.meter is not None and not call.meter.ended:  # every other ending: no answer
                    await asyncio.shield(call.meter.end("failed", "no_answer", time.time()))

    async def _idempotent_answer(self, send: Send, endpoint: str, tenant: str, key: str, raw: bytes) -> bool:
        """Answer a reused `Idempotency-Key` here (the stored answer, 409 or 422) and return True, or
        claim the key for this request and return False (see `gateway.idempotency`)."""
        try:
            stored = self.idempotency.begin(tenant, key, fingerprint(raw), self.now())
            if stored is None and await self._ledger_completed(tenant, key):
                self.idempotency.finish(tenant, key, 0, b"", b"", False)
                raise key_error(409, f"Idempotency-Key {key!r} already completed and its answer is no longer kept; "
                                     "send a new key for a new request", "idempotency_key_consumed")
        except ClientError as err:
            await self._send_error(send, endpoint, err.status, err.message, err.type, err.param, err.code, None)
            return True
        if stored is None:
            return False
        await send({"type": "http.response.start", "status": stored.status, "headers": [
            (b"content-type", stored.content_type), (b"content-length", str(len(stored.body)).encode()),
            (b"idempotent-replayed", b"true")]})
        await send({"type": "http.response.body", "body": stored.body})
        self.telemetry.answered(endpoint, stored.status)
        return True

    async def _ledger_completed(self, tenant: str, key: str) -> bool:
        """The ledger holds a completed row for `(tenant, key)` (False when it cannot say in time)."""
        assert self.ledger is not None
        try:
            row = await asyncio.wait_for(asyncio.to_thread(self.ledger.ledger.get, tenant, key),
                                         self.cfg.ledger_outage.commit_wait_s)
        except Exception:  # an unreachable ledger cannot say: the request runs (billed once by key anyway)
            return False
        return row is not None and row.status == "completed"

    def _context(self, model: str) -> int | None:
        """The smallest context length a live backend reports for `model` (None: none reports one)."""
        lens = [c[model] for name, c in self.contexts.items() if model in c and name in self.backends.live]
        return min(lens) if lens else None

    def _tokenize(self, body: dict[str, Any], chat: bool) -> list[int]:
        """The prompt's token ids by the configured tokenizer; a prompt it cannot encode is a 400."""
        assert self.tokenizer is not None
        try:
            return request_ids(self.tokenizer, body, chat)
        except (ValueError, TypeError, UnicodeError) as err:  # e.g. a lone surrogate from a JSON escape
            raise ClientError(400, f"{'messages' if chat else 'prompt'}: cannot be tokenized ({err})",
                              param="messages" if chat else "prompt") from None

    def _check_labels(self, version: str | None, region: str | None) -> None:
        bs = [b.spec for b in self.backends.live.values()]
        if version is not None and bs and not any(s.model_version == version for s in bs):
            known = sorted({s.model_version for s in bs})
            raise ClientError(400, f"model version {version!r} is not served; versions: {', '.join(known)}",
                              param="x-fleetwise-model-version")
        if region is not None and bs and not any(s.region == region for s in bs):
            known = sorted({s.region for s in bs})
            raise ClientError(400, f"region {region!r} has no backend; regions: {', '.join(known)}",
                              param="x-fleetwise-region")

    async def _route_and_send(self, call: _Call, send: Send, receive: Receive) -> None:
        tried: set[str] = set()
        last: _Retry | None = None
        reprefills = 0  # hand-offs lost after a finished prefill, bounded by failure_domains.max_reprefills
        for attempt in range(self.cfg.retries.max_retries + 1):
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
            except _ClientGone:  # bill what was delivered: nothing
                await self._meter_end(call, "cancelled", "client_gone", 0)
                self._release(call.rid, d.worker, "client gone")
                self.telemetry.answered(call.endpoint, CLIENT_CLOSED_STATUS)
                return
            except _Retry as r:
                last = r
                tried.add(r.backend.name)
                # never reached the backend: release; reached it and failed: a failure on its record
                ended = Cancelled if r.cause == "connect" else Failed
                self.policy.observe(ended(self.now(), call.rid, r.backend.name, r.cause))
                if r.cause == "handoff":  # the prefill ran and its KV is gone: another try is a re-prefill
                    if not self.cfg.failure_domains.may_reprefill(reprefills, 0):
                        break
                    reprefills += 1
                if attempt < self.cfg.retries.max_retries:
                    self.telemetry.retries.labels(r.cause).inc()
        detail = f"{last.cause} on {last.backend.name}: {last.detail}" if last else "no attempt"
        await self._send_error(send, call.endpoint, 502, f"backends failed before answering ({detail})",
                               "upstream_error", None, "upstream_failed", None)

    def _whole_bound(self, b: Backend, tokens: int) -> float:
        """Seconds a non-streamed answer of `tokens` tokens from `b` may take: its first-token bound
        plus `stall.factor` x its recent TPOT per further token (the first-byte timeout without history)."""
        first = first_token_bound_s(b, fleet_ttft_s(self.backends.live.values()), self.cfg.stall, self.cfg.timeouts)
        if b.tpot_ewma_s is None or not self.cfg.stall.enabled:
            return self.cfg.timeouts.first_byte_s if tokens > 1 else first
        return min(self.cfg.timeouts.first_byte_s, first + self.cfg.stall.factor * b.tpot_ewma_s * (tokens - 1))

    def _note(self, b: Backend, rid: str, now: float, kind: str, d: RoutingDecision) -> None:
        b.selected += 1
        if self.cfg.recent_decisions:
            score = d.scores.get(b.name)
            b.recent.append(Decision(rid, now, kind, d.reason, score))

    def _release(self, rid: str, worker: str, why: str) -> None:
        """Release the policy's reservation for a request that ends without a verdict on the
        backend's speed (removed backend, client error, client gone): `Cancelled`."""
        self.policy.observe(Cancelled(self.now(), rid, worker, why))

    async def _dispatch(self, call: _Call, d: RoutingDecision, dec: Backend, pre: Backend | None,
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
            kv = await self._prefill(call, pre, headers, send, body)
            if kv is None:
                return  # the prefill leg's client error was relayed
            payload = json.dumps({**body, "kv_transfer_params": kv}).encode()
        try:
            await self._relay(call, dec, payload, headers, send, receive)
        except _Retry as r:
            if pre is None:
                raise
            self._free_kv(pre, kv)  # the decode leg never took the KV: free it now, not at the lease's end
            if r.cause != "handoff":
                raise
            self._fault(pre, "handoff")  # the KV the prefill held is gone: try another pair
            raise _Retry(pre, r.cause, r.detail) from None
        if pre is not None and call.refused:  # the decode side refused the hand-off (a 4xx relayed)
            self._free_kv(pre, kv)

    def _free_kv(self, pre: Backend, kv: dict[str, Any]) -> None:
        """Ask the prefill replica to free the KV it leased for a hand-off that will not happen (as
        vLLM's NIXL connector frees on abort); best effort, in the background."""
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
                    await r.read()

        task = asyncio.get_running_loop().create_task(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _prefill(self, call: _Call, b: Backend, headers: dict[str, str], send: Send,
                       body: dict[str, Any]) -> Any:
        """The prefill leg: `max_tokens` 1, not streamed, `do_remote_decode`; returns the
        `kv_transfer_params` for the decode leg (None when a client error was relayed)."""
        leg = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": dict(PD_PREFILL_PARAMS)}
        if "max_completion_tokens" in leg:
            leg["max_completion_tokens"] = 1
        leg.pop("stream_options", None)
        status, data, ctype = await self._request_whole(b, call, json.dumps(leg).encode(), headers, None)
        if status >= 400 and call.resumed:  # the client already has a stream: no error response now
            raise _Retry(b, "continuation_refused", f"HTTP {status}")
        if status >= 400:
            await self._send_bytes(send, call, status, data, ctype, b.name)
            return None
        try:
            kv = json.loads(data)["kv_transfer_params"]
        except (ValueError, KeyError, TypeError):
            kv = None
        if not isinstance(kv, dict):
            self._fault(b, "protocol")
            raise _Retry(b, "protocol", "prefill answer has no kv_transfer_params (is the backend started "
                                        "with a KV connector?)")
        self.telemetry.pd_handoffs.inc()
        return kv

    def _fault(self, b: Backend, kind: str) -> None:
        b.faults += 1
        b.breaker.fault(self.now())
        self.telemetry.upstream_errors.labels(b.name, kind).inc()
        if kind == "timeout" and b.probe_ok and self.cfg.stall.enabled and self.cfg.stall.probe_interval_s > 0:
            # A stalled request: the backend counts as failing its health checks until a probe passes.
            b.probe_ok = False
            self._health_verdict(b, False)

    async def _request_whole(self, b: Backend, call: _Call, payload: bytes, headers: dict[str, str],
                             leg_tokens: int | None) -> tuple[int, bytes, str]:
        """POST and read the whole answer of `leg_tokens` tokens (None: one, a prefill leg) within its
        stall bound; backend faults (a stall is a `timeout`) raise `_Retry`."""
        bound = self._whole_bound(b, 1 if leg_tokens is None else leg_tokens)
        b.in_flight += 1
        b.breaker.attempt(self.now())
        work = b.work(call.route.prompt_tokens, call.route.max_output_tokens or 0)
        try:
            status, data, ctype = await _unless_gone(None if call.resumed else call.receive,
                                                     self._post_whole(b.spec.url + call.path, payload, headers, bound))
        except FAULT_ERRORS as err:
            kind = fault_kind(err)
            self._fault(b, kind)
            raise _Retry(b, kind, str(err) or type(err).__name__) from None
        finally:
            b.done(*work)
            b.in_flight -= 1
            self.backends.released(b)
        if status >= 500:
            self._fault(b, "5xx")
            raise _Retry(b, "5xx", f"HTTP {status}")
        b.breaker.success()
        return status, data, ctype

    async def _post_whole(self, url: str, payload: bytes, headers: dict[str, str],
                          bound: float) -> tuple[int, bytes, str]:
        async with self.upstream.post(url, payload, headers, read_s=bound) as r:
            data = await r.read()
            return r.status, data, r.headers.get("content-type", "application/json")

    async def _relay(self, call: _Call, b: Backend, payload: bytes, headers: dict[str, str], send: Send,
                     receive: Receive) -> None:
        """Send to `b` and relay its answer; faults before the first relayed byte raise `_Retry`."""
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
                out = _usage_tokens(data)
                self.policy.observe(FirstToken(now, call.rid, b.name, now - t0))
                self.policy.observe(Completed(now, call.rid, b.name, out, 0.0, now - call.arrival_s))
                b.observe_latency(now - t0, None)
            else:
                self._release(call.rid, b.name, "client error")
            return
        await self._relay_stream(call, b, payload, headers, send, receive)

    async def _relay_stream(self, call: _Call, b: Backend, payload: bytes, headers: dict[str, str],
                            send: Send, receive: Receive) -> None:
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
                watcher = asyncio.create_task(_watch_disconnect(receive, r, gone))
                if r.status >= 400:
                    data = await r.read()
                    if r.status >= 500:
                        self._fault(b, "5xx")
                        raise _Retry(b, "5xx", f"HTTP {r.status}")
                    if call.resumed:  # the client already has a stream: no error response now
                        raise _Retry(b, "continuation_refused", f"HTTP {r.status}")
                    b.breaker.success()
                    self._release(call.rid, b.name, "client error")
                    await self._send_bytes(send, call, r.status, data,
                                           r.headers.get("content-type", "application/json"), b.name)
                    return
                framer = SseFramer()
                first = b""
                while not first:  # the first token within the stall bound, head included
                    r.timeout_s = max(first_bound - (self.now() - t_send), 1e-3)
                    chunk = await r.content.readany()
                    if not chunk:
                        self._fault(b, "empty")
                        raise _Retry(b, "empty", "stream closed before its first event")
                    first = framer.feed(chunk)
                if first.startswith(b'data: {"error"'):
                    # The stream failed before any token: nothing reached the client, so it is
                    # retried. A decode leg that could not get its KV (lease expired, pull failed)
                    # blames `kv_transfer_params`: a failed hand-off, prefilled again elsewhere.
                    cause = "handoff" if b'"kv_transfer_params"' in first else "error_event"
                    if cause != "handoff":  # a failed hand-off is the prefill side's (see _dispatch)
                        self._fault(b, cause)
                    raise _Retry(b, cause, first[6:200].decode("utf-8", "replace").strip())
                t_first = self.now()
                b.done(pre_left, 0)
                pre_left = 0
                if not call.resumed:
                    await send({"type": "http.response.start", "status": 200, "headers": [
                        (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                        (b"x-request-id", call.rid.encode()), (b"x-fleetwise-backend", b.name.encode())]})
                sent_any = True
                if call.meter is not None or call.track:
                    first, held = self._relayed(call, first, held)
                await send({"type": "http.response.body", "body": first, "more_body": True})
                self.telemetry.first_byte(call.endpoint, t_first - call.arrival_s)
                self.policy.observe(FirstToken(t_first, call.rid, b.name, t_first - t_send))
                content = r.content
                r.timeout_s = next_token_bound_s(b, self.cfg.stall, self.cfg.timeouts)
                while True:
                    chunk = await content.readany()
                    if not chunk:
                        break
                    out = framer.feed(chunk)
                    if call.meter is not None or call.track:
                        out, held = self._relayed(call, out, held)
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
        except _Retry:
            raise
        except FAULT_ERRORS as err:
            if gone:  # the client left: not the backend's fault, nothing more to send
                await self._meter_end(call, "cancelled", "client_gone", framer.events if sent_any else 0)
                self._release(call.rid, b.name, "client gone")
                self.telemetry.answered(call.endpoint, CLIENT_CLOSED_STATUS)
                return
            kind = fault_kind(err)
            self._fault(b, kind)
            if not sent_any:
                raise _Retry(b, kind, str(err) or type(err).__name__) from None
            broken = kind
        finally:
            if watcher is not None:
                watcher.cancel()
            b.done(pre_left, dec_left)
            b.in_flight -= 1
            self.backends.released(b)
        if broken is not None:
            await self._decode_failed(call, b, broken, send, receive, framer.events)
            return
        if gone:
            await self._meter_end(call, "cancelled", "client_gone", framer.events)
            self._release(call.rid, b.name, "client gone")
            self.telemetry.answered(call.endpoint, CLIENT_CLOSED_STATUS)
            return
        b.breaker.success()
        now = self.now()
        n_out = _usage_tokens(framer.tail) or max(framer.events - 1 - call.include_usage, 0)
        if call.meter is not None:  # recorded before [DONE] leaves (docs/failure-domains.md)
            await self._meter_end(call, "completed", "", call.delivered if call.track else
                                  call.meter.delivered_tokens if call.meter.usage_seen else n_out)
        await send({"type": "http.response.body", "body": held + framer.buf, "more_body": False})
        tpot = (now - t_first) / (n_out - 1) if n_out > 1 else 0.0
        self.policy.observe(Completed(now, call.rid, b.name, n_out, tpot, now - call.arrival_s))
        b.observe_latency(t_first - t_send, tpot if n_out > 1 else None)
        self.telemetry.request_done(call.endpoint, now - call.arrival_s)
        self.telemetry.answered(call.endpoint, 200)

    async def _meter_end(self, call: _Call, status: Any, reason: str, delivered: int) -> None:
        """Record the request's usage once (no-op without a ledger)."""
        if call.meter is not None and not call.meter.ended:
            call.meter.delivered_tokens = delivered
            await call.meter.end(status, reason, time.time())

    def _relayed(self, call: _Call, out: bytes, held: bytes) -> tuple[bytes, bytes]:
        """Whole events from upstream -> (sent to the client now, held back): counts the tokens
        delivered, keeps the events of a migratable stream, reads the usage for the meter."""
        if call.track and not call.events and b'"usage"' not in out:
            call.track = False  # the engine does not count per chunk: no exact count, no migration
        if call.track:
            call.events.append(out)
            n = _usage_tokens(out)
            if n:
                call.delivered = call.base + n
        out, held = _hold_back(out, held, call.include_usage, None if call.resumed else call.meter)
        if call.track:
            out = relay_events(out, call.keep_chunk_usage, call.base)
        return out, held

    async def _decode_failed(self, call: _Call, b: Backend, kind: str, send: Send, receive: Receive,
                             events: int) -> None:
        """A stream broke after its first byte: continue it on another replica when the failure
        domains say `migrate` (prompt + the text delivered, the remaining budget), else (or when
        no continuation can be sent) end it with an error event (docs/failure-domains.md)."""
        self.policy.observe(Failed(self.now(), call.rid, b.name, kind))
        tried = {b.name}
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
            except _Retry as r:  # the continuation failed before its first token: another one
                tried.add(r.backend.name)
                ended = Cancelled if r.cause == "connect" else Failed
                self.policy.observe(ended(self.now(), call.rid, r.backend.name, r.cause))
                b, kind = r.backend, r.cause
        await self._meter_end(call, "failed", f"stream_broken_{kind}", call.delivered if call.track else events)
        await self._stream_broken(call, b, kind, send)

    async def _stream_broken(self, call: _Call, b: Backend, kind: str, send: Send) -> None:
        """End a stream that broke after its first byte: one error event, then [DONE]."""
        self.telemetry.stream_errors.inc()
        self.telemetry.answered(call.endpoint, 200)
        ev = json.dumps({"error": {"message": f"backend {b.name} failed mid-stream ({kind}); the answer is "
                                              "incomplete", "type": "upstream_error", "param": None,
                                   "code": ERROR_EVENT_STATUS}})
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": f"data: {ev}\n\ndata: [DONE]\n\n".encode(),
                        "more_body": False})

    async def _send_bytes(self, send: Send, call: _Call, status: int, data: bytes, ctype: str, backend: str) -> None:
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
                          param: str | None, code: str | None, retry_after_s: float | None) -> None:
        data = error_body(status, message, type_, param, code)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        if retry_after_s is not None:
            headers.append((b"retry-after", str(max(1, math.ceil(retry_after_s))).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
        self.telemetry.answered(endpoint, status)


class _FastPath:
    """Routes POSTs to the two completion paths without Starlette's router (the hot path); the
    rest, including the same paths with other methods (405), goes to the Starlette app."""

    def __init__(self, gw: Gateway, app: Starlette) -> None:
        self.gw, self.app = gw, app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            if path == "/v1/completions":
                return await self.gw.handle(scope, receive, send, False)
            if path == "/v1/chat/completions":
                return await self.gw.handle(scope, receive, send, True)
        await self.app(scope, receive, send)  # type: ignore[arg-type]


class _Endpoint:
    """A raw ASGI endpoint for one completion route (no per-request Request/Response objects)."""

    def __init__(self, gw: Gateway, chat: bool) -> None:
        self.gw, self.chat = gw, chat

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await self.gw.handle(scope, receive, send, self.chat)


async def _read_body(scope: dict[str, Any], receive: Receive, limit: int) -> bytes:
    """The request body, refusing more than `limit` bytes (413) without reading it all."""
    declared = _header(scope, b"content-length")
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


async def _unless_gone(receive: Receive | None, work: Awaitable[tuple[int, bytes, str]]) -> tuple[int, bytes, str]:
    """`work`'s result, or `_ClientGone` (with `work` cancelled: its upstream connection closes, so
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
        raise _ClientGone()
    return task.result()


async def _watch_disconnect(receive: Receive, upstream: Any, gone: list[bool]) -> None:
    """Close the upstream response when the client disconnects (the engine then aborts)."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            gone.append(True)
            upstream.close()
            return


def _hold_back(out: bytes, held: bytes, client_wants_usage: bool, meter: Meter | None) -> tuple[bytes, bytes]:
    """Split relayed events into (sent now, held): `[DONE]` waits until the usage is recorded, and
    the usage-only event the gateway asked for is dropped unless the client asked for it; the
    meter reads the engine's counts from it."""
    if meter is not None and b'"usage"' in out:
        meter.usage_from(out)
    if out.endswith(DONE_EVENT):
        out, held = out[:-len(DONE_EVENT)], held + DONE_EVENT
    if not client_wants_usage and _EMPTY_CHOICES.search(out):
        out = b"".join(e + b"\n\n" for e in out.split(b"\n\n") if e and not _EMPTY_CHOICES.search(e))
    return out, held


def _usage_tokens(data: bytes) -> int:
    """`usage.completion_tokens` found in an answer's last bytes (0 when absent)."""
    i = data.rfind(b'"completion_tokens"')
    if i < 0:
        return 0
    j = data.find(b":", i) + 1
    k = j
    while k < len(data) and data[k:k + 1] in b" 0123456789":
        k += 1
    try:
        return int(data[j:k])
    except ValueError:
        return 0


def _error_response(status: int, message: str, type_: str = "invalid_request_error") -> Response:
    return Response(error_body(status, message, type_), status_code=status, media_type="application/json")


async def _not_found(request: Request, exc: Exception) -> Response:
    return _error_response(404, f"no route {request.url.path}; see /v1/completions, /v1/chat/completions, /v1/models",
                           "not_found")


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return _error_response(405, f"{request.method} is not allowed on {request.url.path}", "invalid_request_error")

