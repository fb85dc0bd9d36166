"""Serving a `Gateway` with uvicorn on a listening socket that has TCP_NODELAY set.

Accepted connections inherit TCP_NODELAY from the listening socket on Linux, and asyncio sets
it on every TCP transport as well, so the first SSE chunk after the response headers is never
held back waiting for the client's delayed ACK.

uvicorn writes a response's head and each body message with one `transport.write` each, so a
streamed answer's head and first event leave as two segments, and the client wakes twice before
its first byte. `CoalescingProtocol` (the default) holds the head until the next write (or the
end of the event-loop iteration), so head and first event leave together. uvicorn's own `HttpToolsProtocol` is the
reference; a test checks that both put the same bytes on the wire.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from fleetwise.gateway.app import Gateway

__all__ = ["CoalescingProtocol", "listening_socket", "serve", "uvicorn_server"]

LISTEN_BACKLOG = 2048
"""Pending connections the kernel queues for the gateway (bursts of new clients)."""


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket with SO_REUSEADDR and TCP_NODELAY."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.bind((host, port))
    s.listen(LISTEN_BACKLOG)
    s.setblocking(False)
    return s


class _CoalescingTransport:
    """A transport that holds a response head (a write starting `HTTP/1.`) until the next write,
    which leaves with it as one write, or until the end of the event-loop iteration (or anything
    that must see it first: close, a protocol switch). Other writes go straight through."""

    __slots__ = ("_t", "_loop", "_head")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._t, self._loop = transport, loop
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._t.write(head + data)
        elif data.startswith(b"HTTP/1."):
            self._head = data
            self._loop.call_soon(self.flush)
        else:
            self._t.write(data)

    def flush(self) -> None:
        """Write a held head (no-op when none is held or the connection is closing)."""
        head = self._head
        if head is not None:
            self._head = None
            if not self._t.is_closing():
                self._t.write(head)

    def close(self) -> None:
        self.flush()
        self._t.close()

    def set_protocol(self, protocol: Any) -> None:
        self.flush()
        self._t.set_protocol(protocol)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


class CoalescingProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through `_CoalescingTransport`: a response's head and
    first body message leave as one segment (one client wakeup before the first byte)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]


def uvicorn_server(gw: Gateway, log_level: str = "warning", coalesce: bool = True) -> uvicorn.Server:
    """A uvicorn server for the gateway's app (no access log: the gateway's /metrics counts);
    `coalesce=False` serves with uvicorn's own protocol (the reference)."""
    http: Any = CoalescingProtocol if coalesce else "httptools"
    config = uvicorn.Config(gw.app(), lifespan="on", access_log=False, log_level=log_level,
                            timeout_keep_alive=75, loop="auto", http=http)
    return uvicorn.Server(config)


def serve(gw: Gateway, host: str, port: int, log_level: str = "warning", coalesce: bool = True) -> None:
    """Serve until interrupted (blocking); `coalesce=False`: uvicorn's own protocol."""
    sock = listening_socket(host, port)
    server = uvicorn_server(gw, log_level, coalesce)
    server.run(sockets=[sock])
