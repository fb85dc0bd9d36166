"""The HTTP face of an emulated replica: vLLM's OpenAI-compatible routes plus admin and KV routes.

`create_app(cfg)` returns a Starlette app; tests drive it in-process through an ASGI transport.
`fleetwise emulate` serves its `Front` (`app.state.front`: the arrival stamped first, the hot
routes straight to their handlers, the rest through Starlette) on the lean HTTP server
(`fleetwise.emulator.server`), or on uvicorn with `--server uvicorn`. Routes:

- `POST /v1/completions`, `POST /v1/chat/completions` (stream or not), `GET /v1/models`,
  `GET /health`, `GET /metrics` (vLLM names, `fleetwise:` extras), `GET /version`;
- `POST /admin/faults`, `GET /admin/faults` (bearer token; 401 without it);
- `GET /kv_events`: a stream of KV event batches, one JSON object per line;
- `POST /fleetwise/kv/pull` (prefill role: a decode replica pulls a leased request's KV),
  `POST /fleetwise/kv/release` (the router frees a lease whose hand-off was refused) and
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
from starlette.requests import ClientDisconnect, Request
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
from fleetwise.emulator.server import RX_EXTENSION
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


MORE, END, DROP = 0, 1, 2
"""`StreamCursor.advance` states: more may come, the stream is complete, the stream is cut."""


class StreamCursor:
    """What one streamed response has sent of its request (`Live`) and what is due next: the one
    place that decides a stream's chunks, whichever way they are driven (`PushStream`, or the
    pull reference `pull_chunks`)."""

    def __init__(self, live: Live, created: int, faults: Any) -> None:
        self.live, self.faults = live, faults
        self.w = ChunkWriter(live.req, live.rid, created)
        self.sent = 0

    def advance(self) -> tuple[list[bytes], int]:
        """The chunks due now, and `MORE`, `END` (the last ones were among them) or `DROP` (cut the
        stream after sending them: the `drop_streams` fault)."""
        live, w = self.live, self.w
        out: list[bytes] = []
        while True:
            if live.error is not None:
                out.append(w.error(live.error))
                out.append(w.DONE)
                return out, END
            if live.gated:  # the KV pull is not confirmed yet
                return out, MORE
            n = live.emitted
            drop = self.faults.drop_after_tokens
            if drop is not None and n >= drop:
                if drop > self.sent:
                    out.append(w.delta(live.text(self.sent, drop), None, drop))
                    self.sent = drop
                return out, DROP
            if n > self.sent:
                last = live.done and n >= live.target
                out.append(w.delta(live.text(self.sent, n), live.finish_reason if last else None, n))
                self.sent = n
                if last:
                    break
            elif live.done:
                out.append(w.delta("", live.finish_reason, self.sent))
                break
            else:
                return out, MORE
        if live.req.include_usage:
            out.append(w.usage_chunk(self.sent))
        out.append(w.DONE)
        return out, END


async def pull_chunks(cur: StreamCursor) -> AsyncIterator[bytes]:
    """The reference way to drive a stream: a body iterator (Starlette's `StreamingResponse`)
    that waits on its request between chunks; `PushStream` must send the same bytes."""
    while True:
        chunks, state = cur.advance()
        for chunk in chunks:
            yield chunk
        if state == DROP:
            raise StreamDropped(f"stream {cur.live.rid} cut after {cur.sent} tokens (injected fault)")
        if state == END:
            return
        if not chunks:
            await cur.live.wait()


class PushStream(Response):
    """A streamed response whose chunks are written by the step end that produced them
    (`Live.on_change`), not by a task woken after it: a token reaches its socket while the step
    end runs (first tokens first, see `EmulatedReplica._on_output`), and no task or iterator
    runs per token. Sends what `pull_chunks` sends; a send that must wait for the socket holds
    the next ones back until it is done (they go out together)."""

    def __init__(self, cur: StreamCursor, watcher: asyncio.Task[None], on_end: Callable[[], None],
                 headers: dict[str, str]) -> None:
        # As StreamingResponse sets itself up: no body, hence no content-length header.
        self.status_code, self.media_type, self.background = 200, "text/event-stream", None
        self.init_headers(headers)
        self.cur, self.watcher, self.on_end = cur, watcher, on_end

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        live = self.cur.live
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        busy: asyncio.Future[None] | None = None

        def sent(f: asyncio.Future[None]) -> None:
            nonlocal busy
            busy = None
            if f.cancelled():
                return
            err = f.exception()
            if err is not None:
                if not ended.done():
                    ended.set_exception(err)
                return
            pump()

        def pump() -> None:
            nonlocal busy
            if busy is not None or ended.done():
                return
            try:
                chunks, state = self.cur.advance()
            except Exception as err:  # a bug: end the response with it, not the step end
                ended.set_exception(err)
                return
            if chunks:
                f = start_now(send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True}))
                if not f.done():
                    busy = f
                    f.add_done_callback(sent)
                    if state == MORE:
                        return
                elif f.exception() is not None:
                    ended.set_exception(f.exception())  # type: ignore[arg-type]
                    return
            if state == DROP:
                ended.set_exception(StreamDropped(f"stream {live.rid} cut after {self.cur.sent} tokens "
                                                  "(injected fault)"))
            elif state == END:
                ended.set_result(None)

        live.on_change = pump
        try:
            pump()
            await ended
            if busy is not None:
                await busy
        finally:
            live.on_change = None
            self.watcher.cancel()
            self.on_end()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class AnswerAtEnd(Response):
    """A non-streaming answer written by the step end (or abort) that finishes its request,
    inside it (`Live.on_change`, `start_now`): a prefill replica's hand-off reaches its socket
    before the driver schedules the next step, not on a later turn of the loop."""

    def __init__(self, live: Live, watcher: asyncio.Task[None], build: Callable[[], Response]) -> None:
        super().__init__(status_code=200)
        self.live, self.watcher, self.build = live, watcher, build

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        live = self.live
        sent: asyncio.Future[asyncio.Future[None]] = asyncio.get_running_loop().create_future()

        def answer() -> None:
            if sent.done() or not live.done or live.gated:
                return
            live.on_change = None
            self.watcher.cancel()
            try:
                sent.set_result(start_now(self.build()(scope, receive, send)))
            except Exception as err:  # raised where the handler awaits it, not in the step end
                sent.set_exception(err)

        live.on_change = answer
        answer()  # finished already
        try:
            written = await sent
        finally:
            live.on_change = None
            self.watcher.cancel()
        await written


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
    request's arrival on the replica's clock (when its bytes reached the socket, where the server
    says so, `RX_EXTENSION`; else now) before anything else (routing, the body read and
    parsed, see `submit`: that is the emulation's wall time, which the time scale would
    multiply, not the modelled server's), sends the hot routes (exact path, POST) to their
    handlers without Starlette's middleware, routing and `Request`, and everything else
    (other routes, wrong methods, lifespan) to the Starlette app, whose routes hold the same
    handlers (the reference: tests drive it in-process)."""

    def __init__(self, app: Starlette, now_s: Callable[[], float], time_of: Callable[[float], float],
                 hot: dict[str, Handler]) -> None:
        self.app, self.now_s, self.time_of, self.hot = app, now_s, time_of, hot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            ext = scope.get("extensions")
            rx = ext.get(RX_EXTENSION) if ext else None
            # The server says when the request's bytes reached the socket (the lean server
            # reads that from the kernel): the arrival, before this process even woke up.
            scope[ARRIVAL_KEY] = self.time_of(rx["monotonic_s"]) if rx else self.now_s()
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


def create_app(cfg: EmulatorConfig, perf: PerfModel | None = None, on_crash: Callable[[], None] | None = None,
               kv_post: KvPost | None = None, push_streams: bool = True) -> Starlette:
    """The ASGI app of one emulated replica. `on_crash` replaces process exit (tests);
    `kv_post` is how a decode replica reaches prefill replicas (default: an aiohttp session);
    `push_streams=False` streams through the pull reference (`pull_chunks`) instead of `PushStream`."""
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

    async def generate(scope: Scope, receive: Receive, kind: Kind) -> Response:
        arrival_s = scope.get(ARRIVAL_KEY)
        if not isinstance(arrival_s, float):  # an app mounted without `stamp_arrival` outside it
            arrival_s = replica.now_s()
        try:
            body = parse_body(await read_body(receive))
            req = parse_request(kind, body, cfg.name)
            prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
            rid = header(scope, b"x-request-id") or prefix + uuid.uuid4().hex
            watchers: list[asyncio.Task[None]] = []
            live = await replica.submit(req, rid, lambda lv: watchers.append(
                asyncio.create_task(_abort_on_disconnect(receive, lv))), arrival_s)
        except ApiError as err:
            replica.metrics.reject(err.status)
            return _error(err)
        watcher = watchers[0]
        if req.stream:
            cur = StreamCursor(live, replica.created, replica.faults)
            if push_streams:
                return PushStream(cur, watcher, lambda: replica.abort(live), {"x-request-id": live.rid})
            return StreamingResponse(_stream(cur, watcher), media_type="text/event-stream",
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

    async def _abort_on_disconnect(receive: Receive, live: Live) -> None:
        """Wait for the client to go away (`http.disconnect`); abort the request if it was still
        running. The body has been read, so the next message is the disconnect (servers send
        it at the latest when the response is complete)."""
        while (await receive())["type"] != "http.disconnect":
            pass
        replica.abort(live)

    async def _stream(cur: StreamCursor, watcher: asyncio.Task[None]) -> AsyncIterator[bytes]:
        try:
            async for chunk in pull_chunks(cur):
                yield chunk
        finally:  # the stream ended, failed, or was cancelled because the client went away
            watcher.cancel()
            replica.abort(cur.live)

    async def completions(scope: Scope, receive: Receive) -> Response:
        return await generate(scope, receive, "completion")

    async def chat(scope: Scope, receive: Receive) -> Response:
        return await generate(scope, receive, "chat")

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

    async def kv_pull(scope: Scope, receive: Receive) -> Response:
        try:
            body = parse_body(await read_body(receive))
            if replica.pool.role != "prefill":
                raise ApiError(400, f"this replica has role {replica.pool.role}; KV is pulled from prefill replicas")
            return JSONResponse(await replica.serve_pull(body))
        except ApiError as err:
            return _error(err)

    async def kv_release(request: Request) -> Response:
        """Free a KV lease whose hand-off was refused (the router's explicit release)."""
        try:
            body = parse_body(await request.body())
        except ApiError as err:
            return _error(err)
        rid = body.get("remote_request_id")
        if body.get("remote_engine_id") not in (None, cfg.engine_id) or not isinstance(rid, str):
            return _error(ApiError(404, f"no KV lease for remote_request_id={rid!r} on engine {cfg.engine_id}",
                                   "remote_request_id"))
        return JSONResponse({"remote_request_id": rid, "released": replica.release_lease(rid)})

    async def status(request: Request) -> Response:
        return JSONResponse(replica.report())

    async def records(request: Request) -> Response:
        return JSONResponse({"columns": RECORD_COLUMNS, "rows": list(replica.records), "origin_unix_s": replica.origin_unix_s,
                             "origin_monotonic_s": replica.origin_monotonic_s,
                             "time_scale": cfg.time_scale})

    hot: dict[str, Handler] = {"/v1/completions": completions, "/v1/chat/completions": chat,
                               "/fleetwise/kv/pull": kv_pull}

    def routed(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A hot handler as a Starlette endpoint (the same handler, reached through routing)."""
        async def endpoint(request: Request) -> Response:
            return await handler(request.scope, request.receive)
        return endpoint

    routes = [
        *(Route(path, routed(handler), methods=["POST"]) for path, handler in hot.items()),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/admin/faults", admin_faults, methods=["GET", "POST"]),
        Route("/kv_events", kv_events, methods=["GET"]),
        Route("/fleetwise/kv/release", kv_release, methods=["POST"]),
        Route("/fleetwise/status", status, methods=["GET"]),
        Route("/fleetwise/requests", records, methods=["GET"]),
    ]
    def stamp_arrival(inner: ASGIApp) -> ASGIApp:
        """Outermost: a request's arrival on the replica's clock, stamped before Starlette's
        middleware and routing, the body read and parsed (see `submit`): that is the
        emulation's wall time, which the time scale would multiply, not the modelled server's."""
        async def stamped(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and ARRIVAL_KEY not in scope:  # `Front` stamped it already
                scope[ARRIVAL_KEY] = replica.now_s()
            await inner(scope, receive, send)
        return stamped

    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(stamp_arrival)])
    app.state.replica = replica
    app.state.front = Front(app, replica.now_s, replica.time_of, hot)
    return app
