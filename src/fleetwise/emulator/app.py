"""The HTTP face of an emulated replica: vLLM's OpenAI-compatible routes plus admin and KV routes.

`create_app(cfg)` returns a Starlette app; uvicorn serves it (`fleetwise emulate`), tests drive
it in-process through an ASGI transport. Routes:

- `POST /v1/completions`, `POST /v1/chat/completions` (stream or not), `GET /v1/models`,
  `GET /health`, `GET /metrics` (vLLM names, `fleetwise:` extras), `GET /version`;
- `POST /admin/faults`, `GET /admin/faults` (bearer token; 401 without it);
- `GET /kv_events`: a stream of KV event batches, one JSON object per line;
- `POST /fleetwise/kv/pull` (prefill role: a decode replica pulls a leased request's KV) and
  `GET /fleetwise/status` (replica counters in modelled seconds) and `GET /fleetwise/requests`
  (the most recent finished requests, modelled seconds).
"""

from __future__ import annotations

import asyncio
import hmac
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fleetwise import __version__
from fleetwise.emulator.config import EmulatorConfig
from fleetwise.emulator.faults import FaultError
from fleetwise.emulator.protocol import (
    ApiError,
    ChunkWriter,
    GenRequest,
    Kind,
    full_response,
    parse_body,
    parse_request,
)
from fleetwise.emulator.replica import RECORD_COLUMNS, EmulatedReplica, Live
from fleetwise.live.eager import start_now
from fleetwise.perf.roofline import PerfModel

CRASH_EXIT_CODE = 1
"""Exit status of a `crash` fault."""
ARRIVAL_KEY = "fleetwise.arrival_s"
"""ASGI scope key: when the request reached the replica (modelled s), stamped on entry."""
KV_PULL_TIMEOUT_S = 30.0
"""Wall seconds a decode replica waits for a prefill replica to answer a KV pull."""


class StreamDropped(Exception):
    """Raised inside a streaming body to cut the connection (the `drop_streams` fault)."""


class AnswerAtEnd(Response):
    """A non-streaming answer written by the step end (or abort) that finishes its request,
    inside it (`Live.on_done`, `start_now`): a prefill replica's hand-off reaches its socket
    before the driver schedules the next step, not on a later turn of the loop."""

    def __init__(self, live: Live, watcher: asyncio.Task[None], build: Callable[[], Response]) -> None:
        super().__init__(status_code=200)
        self.live, self.watcher, self.build = live, watcher, build

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        live = self.live
        sent: asyncio.Future[asyncio.Future[None]] = asyncio.get_running_loop().create_future()

        def answer() -> None:
            self.watcher.cancel()
            if sent.done():
                return
            try:
                sent.set_result(start_now(self.build()(scope, receive, send)))
            except Exception as err:  # raised where the handler awaits it, not in the step end
                sent.set_exception(err)

        if live.done and not live.gated:
            answer()
        else:
            live.on_done = answer
        try:
            written = await sent
        finally:
            live.on_done = None
            self.watcher.cancel()
        await written


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def _crash_process() -> None:
    os._exit(CRASH_EXIT_CODE)


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


def create_app(cfg: EmulatorConfig, perf: PerfModel | None = None, on_crash: Callable[[], None] | None = None,
               kv_post: KvPost | None = None) -> Starlette:
    """The ASGI app of one emulated replica. `on_crash` replaces process exit (tests);
    `kv_post` is how a decode replica reaches prefill replicas (default: an aiohttp session)."""
    session: aiohttp.ClientSession | None = None

    async def default_post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
        nonlocal session
        if session is None:
            session = aiohttp.ClientSession()
        return await aiohttp_post(session)(url, body)

    replica = EmulatedReplica(cfg, perf, on_crash or _crash_process, make_kv_pull(kv_post or default_post))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        replica.start()
        try:
            yield
        finally:
            await replica.stop()
            if session is not None:
                await session.close()

    async def generate(request: Request, kind: Kind) -> Response:
        arrival_s = request.scope.get(ARRIVAL_KEY)
        if not isinstance(arrival_s, float):  # an app mounted without `stamp_arrival` outside it
            arrival_s = replica.now_s()
        try:
            body = parse_body(await request.body())
            req = parse_request(kind, body, cfg.name)
            prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
            rid = request.headers.get("x-request-id") or prefix + uuid.uuid4().hex
            watchers: list[asyncio.Task[None]] = []
            live = await replica.submit(req, rid, lambda lv: watchers.append(
                asyncio.create_task(_abort_on_disconnect(request, lv))), arrival_s)
        except ApiError as err:
            replica.metrics.reject(err.status)
            return _error(err)
        watcher = watchers[0]
        if req.stream:
            return StreamingResponse(_stream(live, watcher), media_type="text/event-stream",
                                     headers={"x-request-id": live.rid})
        return AnswerAtEnd(live, watcher, lambda: _answer(req, live))

    def _answer(req: GenRequest, live: Live) -> Response:
        """The response of a finished non-streaming request."""
        if live.finish_reason == "abort":
            return Response(status_code=499)  # nobody is listening (nginx's "client closed request")
        if live.error is not None:
            replica.metrics.reject(live.error.status)
            return _error(live.error)
        text = live.text(0, live.emitted)
        return JSONResponse(full_response(req, live.rid, replica.created, text, live.finish_reason, live.emitted,
                                          live.kv_transfer_params), headers={"x-request-id": live.rid})

    async def _abort_on_disconnect(request: Request, live: Live) -> None:
        """Wait for the client to go away (`http.disconnect`); abort the request if it was still
        running. The body has been read, so the next message is the disconnect (servers send
        it at the latest when the response is complete)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        replica.abort(live)

    async def _stream(live: Live, watcher: asyncio.Task[None]) -> AsyncIterator[bytes]:
        try:
            async for chunk in _chunks(live):
                yield chunk
        finally:  # the stream ended, failed, or was cancelled because the client went away
            watcher.cancel()
            replica.abort(live)

    async def _chunks(live: Live) -> AsyncIterator[bytes]:
        w = ChunkWriter(live.req, live.rid, replica.created)
        sent = 0
        faults = replica.faults
        while True:
            if live.error is not None:
                yield w.error(live.error)
                yield w.DONE
                return
            if live.gated:  # the KV pull is not confirmed yet
                await live.wait()
                continue
            n = live.emitted
            drop = faults.drop_after_tokens
            if drop is not None and n >= drop:
                if drop > sent:
                    yield w.delta(live.text(sent, drop), None, drop)
                raise StreamDropped(f"stream {live.rid} cut after {drop} tokens (injected fault)")
            if n > sent:
                last = live.done and n >= live.target
                yield w.delta(live.text(sent, n), live.finish_reason if last else None, n)
                sent = n
                if last:
                    break
            elif live.done:
                yield w.delta("", live.finish_reason, sent)
                break
            if live.emitted == sent and not live.done and live.error is None:
                await live.wait()
        if live.req.include_usage:
            yield w.usage_chunk(sent)
        yield w.DONE

    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    async def chat(request: Request) -> Response:
        return await generate(request, "chat")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": cfg.name, "object": "model", "created": replica.created, "owned_by": "fleetwise",
            "root": cfg.model, "parent": None, "max_model_len": replica.max_model_len, "permission": []}]})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def version(request: Request) -> Response:
        return JSONResponse({"version": f"fleetwise-emulator-{__version__}"})

    async def metrics(request: Request) -> Response:
        return Response(replica.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def _authorized(request: Request) -> ApiError | None:
        token = cfg.admin_token
        got = request.headers.get("authorization", "")
        if not token:
            return ApiError(401, "admin is disabled: start the emulator with --admin-token or "
                                 "FLEETWISE_EMULATOR_ADMIN_TOKEN")
        if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
            return ApiError(401, "missing or wrong bearer token: send `Authorization: Bearer <admin token>`")
        return None

    async def admin_faults(request: Request) -> Response:
        denied = _authorized(request)
        if denied is not None:
            return _error(denied)
        if request.method == "GET":
            return JSONResponse({"active": dict(replica.faults.active)})
        try:
            body = parse_body(await request.body())
            return JSONResponse(replica.inject(body))
        except ApiError as err:
            return _error(err)
        except FaultError as err:
            return _error(ApiError(400, str(err), "kind"))

    async def kv_events(request: Request) -> Response:
        q = replica.events.subscribe(replica.now_s())

        async def lines() -> AsyncIterator[bytes]:
            try:
                while True:
                    line = await q.get()
                    if line is None:
                        return
                    yield line
            finally:
                replica.events.unsubscribe(q)

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def kv_pull(request: Request) -> Response:
        try:
            body = parse_body(await request.body())
            if replica.pool.role != "prefill":
                raise ApiError(400, f"this replica has role {replica.pool.role}; KV is pulled from prefill replicas")
            return JSONResponse(await replica.serve_pull(body))
        except ApiError as err:
            return _error(err)

    async def status(request: Request) -> Response:
        return JSONResponse(replica.report())

    async def records(request: Request) -> Response:
        return JSONResponse({"columns": RECORD_COLUMNS, "rows": list(replica.records), "origin_unix_s": replica.origin_unix_s,
                             "time_scale": cfg.time_scale})

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/admin/faults", admin_faults, methods=["GET", "POST"]),
        Route("/kv_events", kv_events, methods=["GET"]),
        Route("/fleetwise/kv/pull", kv_pull, methods=["POST"]),
        Route("/fleetwise/status", status, methods=["GET"]),
        Route("/fleetwise/requests", records, methods=["GET"]),
    ]
    def stamp_arrival(inner: ASGIApp) -> ASGIApp:
        """Outermost: a request's arrival on the replica's clock, stamped before Starlette's
        middleware and routing, the body read and parsed (see `submit`): that is the
        emulation's wall time, which the time scale would multiply, not the modelled server's."""
        async def stamped(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                scope[ARRIVAL_KEY] = replica.now_s()
            await inner(scope, receive, send)
        return stamped

    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(stamp_arrival)])
    app.state.replica = replica
    return app
