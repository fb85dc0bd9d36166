"""Connection-level abuse against both HTTP servers (the gateway and the emulator, each served by
`fleetwise.live.http`), with raw sockets on 127.0.0.1: idle and half-sent connections closed,
a Content-Length larger than the body and stalled chunks timed out, header count and size
limited, bodies over the limit refused while reading, idle keep-alive connections closed; the
server keeps serving throughout. Short limits so each case takes about a second; the bounds the
asserts allow are generous (a loaded 2-core machine meets them)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fleetwise.emulator.app import create_app
from fleetwise.emulator.config import EmulatorConfig
from fleetwise.gateway.app import Gateway
from fleetwise.gateway.config import GatewayConfig
from fleetwise.live.http import listening_socket, uvicorn_server
from fleetwise.spec.http import HttpLimitsSpec

LIMITS = HttpLimitsSpec(header_timeout_s=0.5, body_timeout_s=0.5, keep_alive_timeout_s=0.5, max_header_bytes=8192,
                        max_headers=20)
MAX_BODY = 64 * 1024
CLOSED_WITHIN_S = 8.0
"""A connection the server must close is closed within this (the limits are 0.5 s)."""
WALL_S = 60.0


@contextlib.asynccontextmanager
async def served(kind: str) -> AsyncIterator[int]:
    """The gateway (one unreachable backend: these cases never reach it) or an emulator, served
    with `LIMITS` on a free port; stopped on exit."""
    if kind == "gateway":
        cfg = GatewayConfig.model_validate({"backends": [{"url": "http://127.0.0.1:9", "name": "b0"}], "http": LIMITS,
                                            "limits": {"max_body_bytes": MAX_BODY}})
        gw = Gateway(cfg, admin_token="t")
        server = uvicorn_server(gw.app(), cfg.http, cfg.limits.max_body_bytes)
    else:
        emu = EmulatorConfig(model="llama-3.1-8b", gpu="h100-sxm", time_scale=100.0, http=LIMITS)
        server = uvicorn_server(create_app(emu).state.front, emu.http, MAX_BODY)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    sock = listening_socket("127.0.0.1", 0)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(int(WALL_S / 0.01)):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(task, 20)


async def answer(reader: asyncio.StreamReader, within_s: float = CLOSED_WITHIN_S) -> tuple[int | None, bytes]:
    """(status, everything) the server sends until it closes the connection; status None when it
    closed without a word. Fails if it is still open after `within_s`."""
    data = b""
    try:
        async with asyncio.timeout(within_s):
            while chunk := await reader.read(65536):
                data += chunk
    except TimeoutError:
        raise AssertionError(f"connection still open after {within_s} s; got {data[:100]!r}") from None
    except ConnectionResetError:
        pass
    return (int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None), data


async def send_quietly(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write and drain, ignoring a server that has closed already (it refused midway)."""
    with contextlib.suppress(ConnectionError):
        writer.write(data)
        await writer.drain()


async def healthy(port: int) -> None:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    status, _ = await answer(r)
    assert status == 200
    w.close()


def run(coro: Any) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, WALL_S)
    return asyncio.run(bounded())


SERVERS = ["gateway", "emulator"]
HEAD = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


@pytest.mark.parametrize("kind", SERVERS)
def test_idle_and_half_sent_connections_are_closed(kind: str) -> None:
    async def go() -> None:
        async with served(kind) as port:
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(40)]
            half = [await asyncio.open_connection("127.0.0.1", port) for _ in range(40)]
            for _, w in half:
                w.write(HEAD[:30])  # the head stops midway (slowloris)
            got_idle = await asyncio.gather(*(answer(r) for r, _ in idle))
            got_half = await asyncio.gather(*(answer(r) for r, _ in half))
            assert {s for s, _ in got_idle} == {None}  # closed without a word: nothing was asked
            assert {s for s, _ in got_half} == {408}
            assert b'"error"' in got_half[0][1] and b"connection: close" in got_half[0][1]
            for _, w in idle + half:
                w.close()
            await healthy(port)
    run(go())


@pytest.mark.parametrize("kind", SERVERS)
def test_a_body_shorter_than_its_length_and_stalled_chunks_time_out(kind: str) -> None:
    async def go() -> None:
        async with served(kind) as port:
            r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            w1.write(HEAD + b"content-length: 1000\r\n\r\n" + b'{"prompt": ')
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            w2.write(HEAD + b"transfer-encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n")
            assert (await answer(r1))[0] == 408
            assert (await answer(r2))[0] == 408
            await healthy(port)
    run(go())


@pytest.mark.parametrize("kind", SERVERS)
def test_too_many_or_too_large_headers_are_431(kind: str) -> None:
    async def go() -> None:
        async with served(kind) as port:
            r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            await send_quietly(w1, HEAD + b"".join(b"x-h%d: v\r\n" % i for i in range(200)) + b"\r\n")
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(64):  # one 512 KiB header value, sent in pieces
                await send_quietly(w2, (HEAD + b"x-big: " if _ == 0 else b"") + b"a" * 8192)
            assert (await answer(r1))[0] == 431
            assert (await answer(r2))[0] == 431
            await healthy(port)
    run(go())


@pytest.mark.parametrize("kind", SERVERS)
def test_bodies_over_the_limit_are_refused_while_reading(kind: str) -> None:
    async def go() -> None:
        async with served(kind) as port:
            r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            w1.write(HEAD + b"content-length: %d\r\n\r\n" % (300 * 1024 * 1024))  # 300 MB announced, none sent
            status, data = await answer(r1)
            assert status == 413 and b"300" not in data.split(b"\r\n\r\n", 1)[0]
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            await send_quietly(w2, HEAD + b"transfer-encoding: chunked\r\n\r\n")
            sent = 0
            while sent < 16 * MAX_BODY and not r2.at_eof():
                await send_quietly(w2, b"4000\r\n" + b"a" * 0x4000 + b"\r\n")
                sent += 0x4000
                await asyncio.sleep(0)
            assert (await answer(r2))[0] == 413
            await healthy(port)
    run(go())


@pytest.mark.parametrize("kind", SERVERS)
def test_an_idle_keep_alive_connection_is_closed_and_a_live_one_serves(kind: str) -> None:
    async def go() -> None:
        async with served(kind) as port:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(3):  # a client that keeps talking keeps its connection
                w.write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
                head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), CLOSED_WITHIN_S)
                assert head.startswith(b"HTTP/1.1 200")
                length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
                await r.readexactly(length)
                await asyncio.sleep(0.1)
            status, data = await answer(r)  # then goes quiet: closed after the keep-alive timeout
            assert status is None and data == b""
    run(go())


COMMANDS = {
    "gateway": ["gateway", "--backend", "http://127.0.0.1:9"],
    "emulator": ["emulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--time-scale", "100"],
}
FD_LIMIT = 100
"""File descriptors the server process may hold in the EMFILE test (it needs about 20 to start)."""
EMFILE_CPU_S = 1.0
"""Most CPU seconds the server may spend in 3 s of being out of descriptors with clients waiting
(a busy accept loop spends all 3)."""


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVERS)
def test_out_of_file_descriptors_the_server_waits_instead_of_spinning(kind: str, tmp_path: Any) -> None:
    import os
    import resource
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fleetwise.cli.main", *COMMANDS[kind], "--port", str(port)],
                                preexec_fn=limit, start_new_session=True, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}/health"
    clients: list[socket.socket] = []
    try:
        deadline = time.monotonic() + WALL_S
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.2)
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3 * FD_LIMIT)]
        time.sleep(0.5)
        fields = lambda: open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: E731
        tck = os.sysconf("SC_CLK_TCK")
        c0 = sum(int(x) for x in fields()[11:13]) / tck
        time.sleep(3.0)
        spent = sum(int(x) for x in fields()[11:13]) / tck - c0
        assert len(os.listdir(f"/proc/{proc.pid}/fd")) >= FD_LIMIT - 1  # it really ran out
        assert spent < EMFILE_CPU_S, spent
        for c in clients:
            c.close()
        clients = []
        deadline = time.monotonic() + WALL_S
        while True:  # serving again once descriptors are free
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert log.stat().st_size < 100_000  # no log flood
    finally:
        for c in clients:
            c.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("kind", SERVERS)
def test_pipelined_requests_and_a_body_sent_in_pieces_are_served(kind: str) -> None:
    async def go() -> None:
        async with served(kind) as port:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n" * 3)  # three in one write
            for _ in range(3):
                head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), CLOSED_WITHIN_S)
                assert head.startswith(b"HTTP/1.1 200")
                length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
                await r.readexactly(length)
            body = b'{"model": "m", "prompt": [1, 2], "max_tokens": 1, "stream": 7}'  # a 400, after the whole body
            w.write(HEAD + b"content-length: %d\r\n\r\n" % len(body))
            for k in range(0, len(body), 16):
                await asyncio.sleep(0.05)
                w.write(body[k:k + 16])
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), CLOSED_WITHIN_S)
            assert head.startswith(b"HTTP/1.1 400") or head.startswith(b"HTTP/1.1 404"), head
            w.close()
    run(go())
