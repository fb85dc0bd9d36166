"""The completion client (`upstream.HttpPool`) against scripted HTTP/1.1 servers on 127.0.0.1:
keep-alive reuse, a pooled connection the server closed, answers cut short or malformed, read
timeouts, refused connections, bodies that end at close, and a reader slower than the server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from gw_harness import run

from fleetwise.gateway.upstream import (
    READ_BUFFER_BYTES,
    ConnectFailed,
    HttpPool,
    UpstreamBroken,
    fault_kind,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]
"""Serves one request on a connection (the connection's request count so far); False closes it."""

CHUNKED_OK = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
              b"7\r\ndata: a\r\n2\r\n\n\n\r\n0\r\n\r\n")


async def read_request(r: asyncio.StreamReader) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    length = next(int(ln.split(b":")[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length"))
    return head + await r.readexactly(length)


class Server:
    def __init__(self, handler: Handler) -> None:
        self.handler, self.connections, self.requests = handler, 0, []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/completions"

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = 0
        try:
            while True:
                self.requests.append(await read_request(r))
                if not await self.handler(r, w, n):
                    break
                n += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        w.close()


async def ok(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
    w.write(CHUNKED_OK)
    await w.drain()
    return True


async def post(pool: HttpPool, url: str) -> tuple[int, bytes]:
    async with pool.post(url, b'{"x": 1}', {"content-type": "application/json", "x-request-id": "r1"}) as resp:
        return resp.status, await resp.read(1 << 20)


def test_keep_alive_reuses_one_connection_and_sends_one_well_formed_request() -> None:
    async def scenario() -> None:
        async with Server(ok) as s:
            pool = HttpPool(1.0, 1.0)
            assert [await post(pool, s.url) for _ in range(3)] == [(200, b"data: a\n\n")] * 3
            assert s.connections == 1
            host = s.url.split("/")[2].encode()
            assert s.requests[0] == (b"POST /v1/completions HTTP/1.1\r\nHost: " + host + b"\r\nContent-Length: 8\r\n"
                                     b"content-type: application/json\r\nx-request-id: r1\r\n\r\n" + b'{"x": 1}')
            pool.close()
    run(scenario)


def test_a_pooled_connection_the_server_closed_is_replaced_without_a_fault() -> None:
    async def close_after_one(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        await ok(r, w, n)
        return False  # the server's keep-alive timeout, say: it closes after each answer

    async def scenario() -> None:
        async with Server(close_after_one) as s:
            pool = HttpPool(1.0, 1.0)
            assert await post(pool, s.url) == (200, b"data: a\n\n")
            await asyncio.sleep(0.05)  # the close reaches the client: the connection is not reused
            assert await post(pool, s.url) == (200, b"data: a\n\n")
            assert s.connections == 2
            pool.close()
    run(scenario)


def test_a_reused_connection_closed_in_the_race_is_retried_once_on_a_new_one() -> None:
    async def silent_close_on_second(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        if n == 1:
            return False  # read the request, answer nothing, close
        await ok(r, w, n)
        return True

    async def scenario() -> None:
        async with Server(silent_close_on_second) as s:
            pool = HttpPool(1.0, 1.0)
            assert await post(pool, s.url) == (200, b"data: a\n\n")
            assert await post(pool, s.url) == (200, b"data: a\n\n")  # second on a fresh connection
            assert s.connections == 2 and len(s.requests) == 3
            pool.close()
    run(scenario)


def test_an_answer_cut_short_is_a_disconnect() -> None:
    async def cut(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(CHUNKED_OK[:-12])  # the head and the first event, then the connection drops
        await w.drain()
        return False

    async def scenario() -> None:
        async with Server(cut) as s:
            pool = HttpPool(1.0, 1.0)
            async with pool.post(s.url, b"{}", {}) as resp:
                assert resp.status == 200
                assert await resp.content.readany() == b"data: a\r\n"[:7]
                with pytest.raises(UpstreamBroken) as err:
                    while await resp.content.readany():
                        pass
            assert fault_kind(err.value) == "disconnect"
    run(scenario)


def test_a_malformed_answer_and_a_refused_connection() -> None:
    async def garbage(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await w.drain()
        return True

    async def scenario() -> None:
        async with Server(garbage) as s:
            with pytest.raises(UpstreamBroken, match="malformed"):
                await post(HttpPool(1.0, 1.0), s.url)
            url = s.url
        await asyncio.sleep(0.05)
        with pytest.raises(ConnectFailed) as err:
            await post(HttpPool(1.0, 1.0), url)  # the server is gone: refused
        assert fault_kind(err.value) == "connect"
    run(scenario)


def test_each_wait_for_bytes_is_bounded_by_the_read_timeout() -> None:
    async def head_then_hang(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(CHUNKED_OK[:CHUNKED_OK.index(b"7\r\n")])
        await w.drain()
        await asyncio.sleep(5)
        return False

    async def scenario() -> None:
        async with Server(head_then_hang) as s:
            async with HttpPool(1.0, 0.2).post(s.url, b"{}", {}) as resp:
                assert resp.status == 200 and resp.headers.get("Content-Type") == "text/event-stream"
                t0 = asyncio.get_running_loop().time()
                with pytest.raises(TimeoutError) as err:
                    await resp.content.readany()
                assert 0.15 < asyncio.get_running_loop().time() - t0 < 1.0
                assert fault_kind(err.value) == "timeout"
    run(scenario)


def test_a_body_that_ends_at_close_and_a_reader_slower_than_the_server() -> None:
    big = bytes(range(256)) * (3 * READ_BUFFER_BYTES // 256)

    async def until_close(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + big)
        await w.drain()
        return False

    async def scenario() -> None:
        async with Server(until_close) as s:
            pool = HttpPool(1.0, 1.0)
            async with pool.post(s.url, b"{}", {}) as resp:
                got = []
                while chunk := await resp.content.readany():
                    got.append(chunk)
                    assert sum(map(len, got)) <= len(big)
                    await asyncio.sleep(0.001)  # slower than loopback: reading pauses and resumes
            assert b"".join(got) == big
            assert pool._idle.get(("http", "127.0.0.1", int(s.url.split(":")[2].split("/")[0]))) in (None, [])
    run(scenario)
