"""The coalescing server protocol puts the same bytes on the wire as uvicorn's own, in fewer
writes: a response head leaves with the first body message."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from gw_harness import running_fleet

from fleetwise.gateway.server import _CoalescingTransport, listening_socket, uvicorn_server


class _Recorder:
    """A transport that records each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return f"info:{name}"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
CHUNKS = [b"e\r\ndata: {\"a\": 1}\r\n", b"8\r\ndata: b\r\n", b"0\r\n\r\n"]


def test_head_leaves_with_the_first_body_write() -> None:
    async def scenario() -> None:
        rec = _Recorder()
        t = _CoalescingTransport(rec, asyncio.get_running_loop())  # type: ignore[arg-type]
        for data in [HEAD, *CHUNKS]:
            t.write(data)
        assert rec.writes == [HEAD + CHUNKS[0], CHUNKS[1], CHUNKS[2]]
        assert t.get_extra_info("peername") == "info:peername"  # everything else is the transport's

        rec2 = _Recorder()
        t2 = _CoalescingTransport(rec2, asyncio.get_running_loop())  # type: ignore[arg-type]
        t2.write(HEAD)
        assert rec2.writes == []
        await asyncio.sleep(0)  # the end of the loop iteration flushes a head written alone
        await asyncio.sleep(0)
        assert rec2.writes == [HEAD]
        t2.write(HEAD)
        t2.close()  # closing flushes first
        assert rec2.writes == [HEAD, HEAD] and rec2.closed
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert rec2.writes == [HEAD, HEAD]  # the scheduled flush finds nothing more

    asyncio.run(asyncio.wait_for(scenario(), 5))


async def _raw_exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)  # the request says Connection: close
    writer.close()
    return data


def test_same_bytes_on_the_wire_as_uvicorns_protocol() -> None:
    """Raw answers of the gateway served with the coalescing protocol and with uvicorn's own, for
    requests whose answers are deterministic (the `date` header aside)."""
    requests = [
        b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 8\r\n"
        b"connection: close\r\n\r\n{\"bad\": ",
        b"GET /nowhere HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 59\r\n"
        b"connection: close\r\n\r\n{\"model\": \"m\", \"prompt\": \"hi\", \"max_tokens\": 0, \"stream\": 1}",
    ]

    async def scenario() -> None:
        async with running_fleet(1) as f:
            answers: dict[bool, list[bytes]] = {}
            for coalesce in (True, False):
                sock = listening_socket("127.0.0.1", 0)
                server = uvicorn_server(f.gw, coalesce=coalesce)
                server.config.lifespan = "off"  # the fleet's gateway is already started
                task = asyncio.create_task(server.serve(sockets=[sock]))
                while not server.started:
                    await asyncio.sleep(0.01)
                port = sock.getsockname()[1]
                answers[coalesce] = [re.sub(rb"date: [^\r]*\r\n", b"", await _raw_exchange(port, r))
                                     for r in requests]
                server.should_exit = True
                await asyncio.wait_for(task, 10)
            assert answers[True] == answers[False]
            assert [a[:12] for a in answers[True]] == [b"HTTP/1.1 200", b"HTTP/1.1 400", b"HTTP/1.1 404",
                                                       b"HTTP/1.1 400"]

    asyncio.run(asyncio.wait_for(scenario(), 60))
