"""The HTTP face of an emulated replica: vLLM's OpenAI-compatible routes plus admin and KV routes
(KV events go out over ZeroMQ as vLLM sends them: `emulator.kv_events`).

`create_app(cfg)` returns a Starlette app; tests drive it in-process through an ASGI transport.
`fleetwise emulate` serves its `Front` (`app.state.front`: the arrival stamped first, the hot
routes straight to their handlers, the rest through Starlette) on uvicorn with the connection
limits of `fleetwise.live.http`. Routes:

- `POST /v1/completions`, `POST /v1/chat/completions` (stream or not), `GET /v1/models`,
  `GET /health`, `GET /metrics` (vLLM names, `fleetwise:` extras), `GET /version`;
- `POST /admin/faults`, `GET /admin/faults` (bearer token; 401 without it);
- `POST /fleetwise/kv/pull` (prefill role: a decode replica pulls a leased request's KV),
  `POST /fleetwise/kv/release` (the router frees a lease whose hand-off was refused) and
  `GET /fleetwise/status` (replica counters in modelled seconds) and `GET /fleetwise/requests`
  (the most recent finished requests, modelled seconds).
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fleetwise import __version__
from fleetwise.core.openai_request import ApiError, Kind, parse_body
from fleetwise.emulator.config import EmulatorConfig
from fleetwise.emulator.faults import FaultError
from fleetwise.emulator.protocol import GenRequest, full_response, parse_request
from fleetwise.emulator.replica import EmulatedReplica
from fleetwise.emulator.running import RECORD_COLUMNS, Live
from fleetwise.emulator.streams import AnswerAtEnd, PushStream, StreamCursor
from fleetwise.perf.roofline import PerfModel

CRASH_EXIT_CODE = 1
"""Exit status of a `crash` fault."""
ARRIVAL_KEY = "fleetwise.arrival_s"
"""ASGI scope key: when the request reached the replica (modelled s), stamped on entry."""
KV_PULL_TIMEOUT_S = 30.0
"""Wall seconds a decode replica waits for a prefill replica to answer a KV pull."""


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def _crash_process() -> None:
    os._exit(CRASH_EXIT_CODE)


Handler = Callable[[Scope, Receive], Awaitable[Response]]
"""A hot route's handler: the request's scope and receive -> the response to send."""


async def read_body(receive: Receive) -> bytes:
    """The whole request body from ASGI `receive`, as Starlette's `Request.body()` reads it
    (a disconnect before the end raises `ClientDisconnect`)."""
    chunks: list[bytes] = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of header `name` (lower case), decoded as Starlette's `Headers.get` does."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None


class Front:
    """The replica's ASGI entry as `fleetwise emulate` serves it (`app.state.front`): stamps a
    request's arrival on the replica's clock before anything else (routing, the body read and
    parsed, see `submit`: that is the emulation's wall time, which the time scale would
    multiply, not the modelled server's), sends the hot routes (exact path, POST) to their
    handlers without Starlette's middleware, routing and `Request`, and everything else
    (other routes, wrong methods, lifespan) to the Starlette app, whose routes hold the same
    handlers (the reference: tests drive it in-process)."""

    def __init__(self, app: Starlette, now_s: Callable[[], float], hot: dict[str, Handler]) -> None:
        self.app, self.now_s, self.hot = app, now_s, hot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[ARRIVAL_KEY] = self.now_s()
            if scope["method"] == "POST" and not scope.get("root_path"):
                handler = self.hot.get(scope["path"])
                if handler is not None:
                    response = await handler(scope, receive)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


KvPost = Callable[[str, dict[str, Any]], Awaitable[tuple[int, Any]]]
"""`post(url, json_body) -> (status, json or text)`; raises OSError, TimeoutError or
aiohttp.ClientError when the peer cannot be reached."""
KvPull = Callable[[dict[str, Any], dict[str, Any]], Awaitable[dict[str, Any]]]


def aiohttp_post(session: aiohttp.ClientSession) -> KvPost:
    """A `KvPost` over an aiohttp session (the project's HTTP client, chosen by CPU per request)."""

    async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=KV_PULL_TIMEOUT_S)) as r:
            try:
                return r.status, await r.json(content_type=None)
            except ValueError:
                return r.status, await r.text()

    return post


def make_kv_pull(post: KvPost) -> KvPull:
    """The decode side's KV pull: POST the body to the prefill replica named in `ktp`."""

    async def pull(ktp: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        host, port = ktp.get("remote_host"), ktp.get("remote_port")
        if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
            raise ApiError(400, f"kv_transfer_params needs remote_host (string) and remote_port (integer), got "
                                f"{host!r}, {port!r}")
        try:
            status, data = await post(f"http://{host}:{port}/fleetwise/kv/pull", body)
        except (TimeoutError, OSError, aiohttp.ClientError) as err:
            raise ApiError(503, f"prefill replica {host}:{port} unreachable ({type(err).__name__})") from None
        if status != 200:
            try:
                msg = data["error"]["message"]
            except (KeyError, TypeError):
                msg = str(data)[:200]
            raise ApiError(status, f"prefill replica {host}:{port}: {msg}")
        if not isinstance(data, dict):
            raise ApiError(502, f"prefill replica {host}:{port}: answered {str(data)[:100]!r}, not a JSON object")
        return data

    return pull


class ReplicaApi:
    """The handlers of one emulated replica's routes, each a method a test can call alone: the
    generation routes take the ASGI scope and receive (`Front` calls them without Starlette),
    the others a Starlette `Request`."""

    def __init__(self, cfg: EmulatorConfig, perf: PerfModel | None, on_crash: Callable[[], None],
                 kv_post: KvPost | None) -> None:
        self.cfg = cfg
        self.session: aiohttp.ClientSession | None = None
        self.replica = EmulatedReplica(cfg, perf, on_crash, make_kv_pull(kv_post or self._default_post))

    async def _default_post(self, url: str, body: dict[str, Any]) -> tuple[int, Any]:
        if self.session is None:
            self.session = aiohttp.ClientSession()
        return await aiohttp_post(self.session)(url, body)

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Start the replica's engine loop; stop it (and the KV client) at shutdown."""
        self.replica.start()
        try:
            yield
        finally:
            await self.replica.stop()
            if self.session is not None:
                await self.session.close()

    # ---- generation ----------------------------------------------------------------------------
    async def generate(self, scope: Scope, receive: Receive, kind: Kind) -> Response:
        """One completion or chat request: parsed, admitted, answered as it runs."""
        replica = self.replica
        arrival_s = scope.get(ARRIVAL_KEY)
        if not isinstance(arrival_s, float):  # an app mounted without `stamp_arrival` outside it
            arrival_s = replica.now_s()
        try:
            req = parse_request(kind, parse_body(await read_body(receive)), self.cfg.name)
            rid = header(scope, b"x-request-id") or uuid.uuid4().hex
            created = int(time.time())  # per response, as vLLM stamps it
            watchers: list[asyncio.Task[None]] = []
            live = await replica.submit(req, rid, lambda lv: watchers.append(
                asyncio.create_task(self._abort_on_disconnect(receive, lv))), arrival_s)
        except ApiError as err:
            replica.metrics.reject(err.status)
            return _error(err)
        watcher = watchers[0]
        if req.stream:
            cur = StreamCursor(live, created, replica.faults)
            return PushStream(cur, watcher, lambda: replica.abort(live), {"x-request-id": live.rid})
        return AnswerAtEnd(live, watcher, lambda: self._answer(req, live, created))

    def _answer(self, req: GenRequest, live: Live, created: int) -> Response:
        """The response of a finished non-streaming request."""
        if live.finish_reason == "abort":
            return Response(status_code=499)  # nobody is listening (nginx's "client closed request")
        if live.error is not None:
            self.replica.metrics.reject(live.error.status)
            return _error(live.error)
        text = live.text(0, live.emitted)
        return JSONResponse(full_response(req, live.rid, created, text, live.finish_reason, live.emitted,
                                          live.kv_transfer_params), headers={"x-request-id": live.rid})

    async def _abort_on_disconnect(self, receive: Receive, live: Live) -> None:
        """Wait for the client to go away (`http.disconnect`); abort the request if it was still
        running. The body has been read, so the next message is the disconnect (servers send
        it at the latest when the response is complete)."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self.replica.abort(live)

    async def completions(self, scope: Scope, receive: Receive) -> Response:
        """`POST /v1/completions`."""
        return await self.generate(scope, receive, "completion")

    async def chat(self, scope: Scope, receive: Receive) -> Response:
        """`POST /v1/chat/completions`."""
        return await self.generate(scope, receive, "chat")

    async def kv_pull(self, scope: Scope, receive: Receive) -> Response:
        """`POST /fleetwise/kv/pull`: a decode replica pulls a leased request's KV (prefill role)."""
        try:
            body = parse_body(await read_body(receive))
            role = self.replica.pool.role
            if role != "prefill":
                raise ApiError(400, f"this replica has role {role}; KV is pulled from prefill replicas")
            return JSONResponse(await self.replica.serve_pull(body))
        except ApiError as err:
            return _error(err)

    # ---- the other routes ----------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        """`GET /v1/models`."""
        r = self.replica
        return JSONResponse({"object": "list", "data": [{
            "id": self.cfg.name, "object": "model", "created": r.created, "owned_by": "fleetwise",
            "root": self.cfg.model, "parent": None, "max_model_len": r.max_model_len, "permission": []}]})

    async def health(self, request: Request) -> Response:
        """`GET /health`."""
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        """`GET /version`."""
        return JSONResponse({"version": f"fleetwise-emulator-{__version__}"})

    async def metrics(self, request: Request) -> Response:
        """`GET /metrics` (Prometheus text)."""
        return Response(self.replica.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def _authorized(self, request: Request) -> ApiError | None:
        token = self.cfg.admin_token
        got = request.headers.get("authorization", "")
        if not token:
            return ApiError(401, "admin is disabled: start the emulator with --admin-token or "
                                 "FLEETWISE_EMULATOR_ADMIN_TOKEN")
        if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
            return ApiError(401, "missing or wrong bearer token: send `Authorization: Bearer <admin token>`")
        return None

    async def admin_faults(self, request: Request) -> Response:
        """`GET /admin/faults` (the active faults) and `POST /admin/faults` (inject one)."""
        denied = self._authorized(request)
        if denied is not None:
            return _error(denied)
        if request.method == "GET":
            return JSONResponse({"active": dict(self.replica.faults.active)})
        try:
            return JSONResponse(self.replica.inject(parse_body(await request.body())))
        except ApiError as err:
            return _error(err)
        except FaultError as err:
            return _error(ApiError(400, str(err), "kind"))

    async def status(self, request: Request) -> Response:
        """`GET /fleetwise/status`: replica counters in modelled seconds."""
        return JSONResponse(replica_report(self.replica))

    async def records(self, request: Request) -> Response:
        """`GET /fleetwise/requests`: the most recent finished requests (modelled seconds)."""
        r = self.replica
        return JSONResponse({"columns": RECORD_COLUMNS, "rows": list(r.records), "origin_unix_s": r.origin_unix_s,
                             "origin_monotonic_s": r.origin_monotonic_s, "time_scale": self.cfg.time_scale})

    async def kv_release(self, request: Request) -> Response:
        """`POST /fleetwise/kv/release`: free a KV lease whose hand-off was refused (the router's explicit release)."""
        try:
            body = parse_body(await request.body())
        except ApiError as err:
            return _error(err)
        rid = body.get("remote_request_id")
        if body.get("remote_engine_id") not in (None, self.cfg.engine_id) or not isinstance(rid, str):
            return _error(ApiError(404, f"no KV lease for remote_request_id={rid!r} on engine {self.cfg.engine_id}",
                                   "remote_request_id"))
        return JSONResponse({"remote_request_id": rid, "released": self.replica.leases.release(rid)})

    def hot(self) -> dict[str, Handler]:
        """The routes `Front` sends straight to their handlers (exact path, POST)."""
        return {"/v1/completions": self.completions, "/v1/chat/completions": self.chat,
                "/fleetwise/kv/pull": self.kv_pull}

    def routes(self) -> list[Route]:
        """Every route, the hot ones included (reached through Starlette's routing)."""
        return [*(Route(path, _routed(handler), methods=["POST"]) for path, handler in self.hot().items()),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/version", self.version, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
                Route("/admin/faults", self.admin_faults, methods=["GET", "POST"]),
                Route("/fleetwise/kv/release", self.kv_release, methods=["POST"]),
                Route("/fleetwise/status", self.status, methods=["GET"]),
                Route("/fleetwise/requests", self.records, methods=["GET"])]


def replica_report(r: EmulatedReplica) -> dict[str, Any]:
    """Replica counters (modelled seconds) for load generators and tests (`GET /fleetwise/status`)."""
    s = r.status
    return {"name": r.cfg.name, "role": r.pool.role, "time_scale": r.cfg.time_scale,
            "origin_unix_s": r.origin_unix_s, "origin_monotonic_s": r.origin_monotonic_s,
            "now_s": r.now_s(), "steps": s.steps, "busy_s": s.busy_s, "requests": s.requests,
            "overrun_mean_s": s.overrun_sum_s / s.steps if s.steps else 0.0, "overrun_max_s": s.overrun_max_s,
            "running": r.engine.num_running, "waiting": r.engine.num_waiting,
            "kv_usage": r.engine.kv_usage, "prefix_hit_rate": r.engine.prefix_hit_rate,
            "kv_capacity_tokens": r.kv_capacity_tokens, "max_model_len": r.max_model_len,
            "leases": len(r.leases.held), "faults": dict(r.faults.active),
            "pull_holds": s.pull_holds, "pull_late": s.pull_late, "pull_hold_wall_s": s.pull_hold_wall_s,
            "pull_speculated": s.pull_speculated, "pull_early": s.pull_early,
            "precise_clock": r.clock is not None and r.clock.precise,
            "spin_wall_s": r.clock.spun_s if r.clock is not None else 0.0}


def _routed(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A hot handler as a Starlette endpoint (the same handler, reached through routing)."""
    async def endpoint(request: Request) -> Response:
        return await handler(request.scope, request.receive)
    return endpoint


def _stamp_arrival(now_s: Callable[[], float]) -> Callable[[ASGIApp], ASGIApp]:
    """Middleware, outermost: a request's arrival on the replica's clock, stamped before
    Starlette's middleware and routing, the body read and parsed (see `submit`: that is the
    emulation's wall time, which the time scale would multiply, not the modelled server's)."""
    def wrap(inner: ASGIApp) -> ASGIApp:
        async def stamped(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and ARRIVAL_KEY not in scope:  # `Front` stamped it already
                scope[ARRIVAL_KEY] = now_s()
            await inner(scope, receive, send)
        return stamped
    return wrap


def create_app(cfg: EmulatorConfig, perf: PerfModel | None = None, on_crash: Callable[[], None] | None = None,
               kv_post: KvPost | None = None) -> Starlette:
    """The ASGI app of one emulated replica (`app.state.replica`, `app.state.api` its handlers,
    `app.state.front` the entry `fleetwise emulate` serves). `on_crash` replaces process exit
    (tests); `kv_post` is how a decode replica reaches prefill replicas (default: an aiohttp
    session)."""
    api = ReplicaApi(cfg, perf, on_crash or _crash_process, kv_post)
    app = Starlette(routes=api.routes(), lifespan=api.lifespan,
                    middleware=[Middleware(_stamp_arrival(api.replica.now_s))])
    app.state.replica, app.state.api = api.replica, api
    app.state.front = Front(app, api.replica.now_s, api.hot())
    return app
