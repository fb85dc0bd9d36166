"""Serving a `Gateway` with uvicorn on a listening socket that has TCP_NODELAY set.

Accepted connections inherit TCP_NODELAY from the listening socket on Linux, and asyncio sets
it on every TCP transport as well, so the first SSE chunk after the response headers is never
held back waiting for the client's delayed ACK.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn

from fleetwise.gateway.app import Gateway

__all__ = ["listening_socket", "serve", "uvicorn_server"]

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


class _Server(uvicorn.Server):
    """uvicorn's server, telling `on_ready` once the gateway has started (its backends file read)."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None] | None) -> None:
        super().__init__(config)
        self.on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()


def uvicorn_server(gw: Gateway, log_level: str = "warning",
                   on_ready: Callable[[], None] | None = None) -> uvicorn.Server:
    """A uvicorn server for the gateway's app (no access log: the gateway's /metrics counts);
    `on_ready` is called once it serves, after the gateway's start (backends file read)."""
    config = uvicorn.Config(gw.app(), lifespan="on", access_log=False, log_level=log_level,
                            timeout_keep_alive=75, loop="auto", http="auto")
    return _Server(config, on_ready)


def serve(gw: Gateway, host: str, port: int, log_level: str = "warning",
          on_ready: Callable[[], None] | None = None) -> None:
    """Serve until interrupted (blocking); `on_ready()` once serving, its backends known."""
    sock = listening_socket(host, port)
    server = uvicorn_server(gw, log_level, on_ready)
    server.run(sockets=[sock])
