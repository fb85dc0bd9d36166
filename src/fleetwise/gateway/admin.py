"""The gateway's HTTP surface besides completions: models, health, readiness, metrics, the admin
API and the dashboard, and the ASGI application that routes completions straight to `handle`.
"""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from fleetwise.errors import SpecError
from fleetwise.gateway.admit import AdmitStage
from fleetwise.gateway.call import (
    Receive,
    Send,
    error_response,
    not_allowed,
    not_found,
)
from fleetwise.gateway.config import BackendSpec
from fleetwise.gateway.metering import ledger_ready
from fleetwise.spec.base import validate
from fleetwise.spec.inputs import parse_json

__all__ = ["AdminSurface"]


class AdminSurface(AdmitStage):
    """The ASGI application and every route but the completions."""

    def app(self) -> FastPath:
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
            Route("/v1/completions", Endpoint(self, chat=False), methods=["POST"]),
            Route("/v1/chat/completions", Endpoint(self, chat=True), methods=["POST"]),
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
        app.add_exception_handler(404, not_found)
        app.add_exception_handler(405, not_allowed)
        return FastPath(self, app)

    async def _models(self, _: Request) -> Response:
        data = [{"id": m, "object": "model", "owned_by": "fleetwise"} for m in sorted(self.known_models())]
        return JSONResponse({"object": "list", "data": data})

    async def _health_ep(self, _: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def _readiness(self, _: Request) -> Response:
        now = self.now()
        n = sum(b.available(now) for b in self.backends.live.values())
        roles = self.backends.routable_roles(now)
        serves = roles.get("mixed", 0) > 0 or (roles.get("prefill", 0) > 0 and roles.get("decode", 0) > 0)
        metering_ok, ledger = ledger_ready(self.ledger, self.cfg)
        ready = serves and metering_ok
        doc: dict[str, Any] = {"ready": ready, "available_backends": n, "routable": roles,
                               "panic": sorted(self.backends.panic)}
        if ledger is not None:
            doc["ledger"] = ledger
        return JSONResponse(doc, status_code=200 if ready else 503)

    async def _metrics(self, request: Request) -> Response:
        if self.metrics_token and not hmac.compare_digest(request.headers.get("authorization", "").encode(),
                                                          f"Bearer {self.metrics_token}".encode()):
            return error_response(401, "/metrics: missing or wrong bearer token (metrics_token_env)",
                                   "authentication_error")
        return Response(self.telemetry.render(), media_type="text/plain; version=0.0.4")

    def _admin_refusal(self, request: Request, presented: str | None = None) -> Response | None:
        if not self.admin_token:
            return error_response(403, "admin API disabled: set the admin token (admin_token_env) to enable it",
                                   "permission_error")
        got = presented if presented is not None else request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {self.admin_token}".encode()):
            return error_response(401, "admin API: missing or wrong bearer token", "authentication_error")
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
            "panic": sorted(self.backends.panic),
            "ejection": {"max_ejection_percent": self.cfg.breaker.max_ejection_percent,
                         "capped": self.backends.capped_roles()},
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
            return error_response(400, str(err))
        new = self.add_backend(spec)
        return JSONResponse({"name": spec.key, "added": new}, status_code=201 if new else 200)

    async def _admin_backend_delete(self, request: Request) -> Response:
        refused = self._admin_refusal(request)
        if refused:
            return refused
        name = request.path_params["name"]
        if not self.remove_backend(name):
            return error_response(404, f"backend {name!r} not found; GET /admin/backends lists them", "not_found")
        return JSONResponse({"name": name, "removed": True})


class FastPath:
    """Routes POSTs to the two completion paths without Starlette's router (the hot path); the
    rest, including the same paths with other methods (405), goes to the Starlette app."""

    def __init__(self, gw: AdminSurface, app: Starlette) -> None:
        self.gw, self.app = gw, app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            if path == "/v1/completions":
                return await self.gw.handle(scope, receive, send, False)
            if path == "/v1/chat/completions":
                return await self.gw.handle(scope, receive, send, True)
        await self.app(scope, receive, send)  # type: ignore[arg-type]


class Endpoint:
    """A raw ASGI endpoint for one completion route (no per-request Request/Response objects)."""

    def __init__(self, gw: AdminSurface, chat: bool) -> None:
        self.gw, self.chat = gw, chat

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await self.gw.handle(scope, receive, send, self.chat)
