"""The lean HTTP server (`fleetwise.emulator.server`) in front of an emulated replica, on
127.0.0.1: the same answers as uvicorn (the reference) for the same requests, and HTTP/1.1 as
clients use it (keep-alive, pipelining, HTTP/1.0, chunked bodies, 100-continue, bad requests,
a client going away mid-stream, a stop with a response in flight)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from emu_helpers import cfg, run, sse_events

from fleetwise.emulator.app import create_app
from fleetwise.emulator.server import serve

WALL_S = 20.0


@contextlib.asynccontextmanager
async def lean(**kw: Any) -> AsyncIterator[tuple[Any, int]]:
    """An emulator on the lean server, on a free port of 127.0.0.1; stopped on exit."""
    app = create_app(cfg(**kw))
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(app.state.front, lambda: app.router.lifespan_context(app), "127.0.0.1", 0,
                                     on_ready=ready.set_result, stop=stop))
    try:
        yield app, await asyncio.wait_for(ready, WALL_S)
    finally:
        stop.set()
        await asyncio.wait_for(task, WALL_S)


@contextlib.asynccontextmanager
async def reference(**kw: Any) -> AsyncIterator[tuple[Any, int]]:
    """The same emulator on uvicorn."""
    app = create_app(cfg(**kw))
    server = uvicorn.Server(uvicorn.Config(app.state.front, host="127.0.0.1", port=0, log_level="warning",
                                           access_log=False))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    for _ in range(int(WALL_S / 0.01)):
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield app, int(server.servers[0].sockets[0].getsockname()[1])
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, WALL_S)


async def raw(port: int, data: bytes, until: bytes = b"", close_after: bool = False) -> bytes:
    """Write `data` on a new connection; read until `until` is in what came back, or EOF."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    got = b""
    try:
        while not (until and until in got):
            chunk = await asyncio.wait_for(reader.read(65536), WALL_S)
            if not chunk:
                break
            got += chunk
    finally:
        if close_after or until:
            writer.close()
    return got


REQUESTS: list[tuple[str, str, Any]] = [
    ("GET", "/health", None),
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", {"prompt": "hello there", "max_tokens": 5, "ignore_eos": True}),
    ("POST", "/v1/completions", {"prompt": "stream it", "max_tokens": 4, "ignore_eos": True, "stream": True,
                                 "stream_options": {"include_usage": True}}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                      "ignore_eos": True}),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": -1}),
    ("GET", "/v1/completions", None),
    ("GET", "/nowhere", None),
    ("POST", "/fleetwise/kv/pull", {"remote_request_id": "none"}),
]


def normal(text: str) -> str:
    return re.sub(r'"created":\d+', '"created":0', re.sub(r"(cmpl|chatcmpl)-[0-9a-f]{32}", "ID", text))


async def answers(server: Any) -> list[tuple[int, str, str]]:
    out = []
    async with server(time_scale=50.0) as (_, port), httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
        for method, path, body in REQUESTS:
            r = await c.request(method, path, json=body, timeout=WALL_S)
            out.append((r.status_code, r.headers.get("content-type", ""), normal(r.text)))
    return out


def test_the_lean_server_answers_as_uvicorn_does():
    got, want = run(answers(lean)), run(answers(reference))
    assert got == want
    assert [s for s, _, _ in got] == [200, 200, 200, 200, 200, 400, 405, 404, 400]
    assert sse_events(got[3][2])[-1] == "[DONE]"


def test_keep_alive_pipelining_http10_chunked_bodies_and_100_continue():
    body = json.dumps({"prompt": "hello", "max_tokens": 2, "ignore_eos": True}).encode()
    post = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body), body)

    async def go() -> None:
        async with lean(time_scale=50.0) as (_, port):
            # two requests in one write: two answers, in order, on the one connection
            got = await raw(port, post + b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n", until=b"HTTP/1.1 200 OK\r\ncontent-length: 0")
            assert got.count(b"HTTP/1.1 200 OK") == 2 and got.index(b'"text_completion"') < got.rindex(b"HTTP/1.1")
            # HTTP/1.0: the server closes after the answer
            got = await raw(port, b"GET /health HTTP/1.0\r\n\r\n")
            assert got.startswith(b"HTTP/1.1 200 OK") and b"connection: close" in got
            # a chunked request body, and expect: 100-continue
            chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            got = await raw(port, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
                                  b"transfer-encoding: chunked\r\n\r\n" + chunked, until=b'"usage"')
            assert got.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
            # not HTTP at all: 400 and the connection closed
            got = await raw(port, b"BLAH \x01\x02 nonsense\r\n\r\n")
            assert got.startswith(b"HTTP/1.1 400 Bad Request") and b"connection: close" in got
    run(go())


def test_a_client_gone_mid_stream_aborts_its_request_and_a_stop_lets_a_response_finish():
    async def go() -> None:
        async with lean(time_scale=20.0) as (app, port):
            rep = app.state.replica
            body = json.dumps({"prompt": "long one", "max_tokens": 2000, "ignore_eos": True, "stream": True})
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (
                len(body), body.encode()))
            first = await asyncio.wait_for(reader.readuntil(b"\n\n"), WALL_S)
            assert b"transfer-encoding: chunked" in first
            assert rep.engine.num_running == 1
            writer.close()
            for _ in range(200):
                if rep.engine.num_running == 0:
                    break
                await asyncio.sleep(0.01)
            assert rep.engine.num_running == 0 and rep.engine.pool.num_used == 0
        # a stop while a response is in flight: it finishes (within the grace) before shutdown
        stop_seen: list[bytes] = []

        body = json.dumps({"prompt": "a b c", "max_tokens": 60, "ignore_eos": True}).encode()
        async with lean(time_scale=50.0) as (app, port):
            task = asyncio.create_task(raw(port, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n"
                                                 b"\r\n%s" % (len(body), body), until=b'"usage"'))
            await asyncio.sleep(0.05)
        stop_seen.append(await asyncio.wait_for(task, WALL_S))
        assert stop_seen[0].startswith(b"HTTP/1.1 200 OK") and b'"finish_reason":"length"' in stop_seen[0]
    run(go())


def test_a_request_carries_when_its_bytes_reached_the_socket():
    """`fleetwise.rx`: the kernel's receive time, on this machine's monotonic clock, between the
    client's send and the app's first line even when the process was busy in between."""
    import sys
    import time

    if not sys.platform.startswith("linux"):
        pytest.skip("SO_TIMESTAMPNS receive timestamps are Linux's")

    seen: list[tuple[float, float]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append((scope["extensions"]["fleetwise.rx"]["monotonic_s"], time.monotonic()))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    @contextlib.asynccontextmanager
    async def nothing() -> AsyncIterator[None]:
        yield

    async def go() -> tuple[float, float]:
        stop = asyncio.Event()
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(serve(app, nothing, "127.0.0.1", 0, on_ready=ready.set_result, stop=stop))
        port = await ready
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sent = time.monotonic()
        writer.write(b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        time.sleep(0.05)  # the server's loop is blocked meanwhile: the bytes wait in the socket
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WALL_S)).startswith(b"HTTP/1.1 204")
        writer.close()
        stop.set()
        await asyncio.wait_for(task, WALL_S)
        return sent, time.monotonic()

    sent, _ = run(go())
    rx, handled = seen[0]
    assert sent - 0.001 <= rx < sent + 0.02 and handled >= sent + 0.05  # stamped on arrival, not when handled
