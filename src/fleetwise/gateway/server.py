"""Serving a `Gateway`: uvicorn with the project's connection limits (`fleetwise.live.http`), on
a listening socket with TCP_NODELAY, so the first SSE chunk after the response headers is never
held back waiting for the client's delayed ACK."""

from __future__ import annotations

import uvicorn

from fleetwise.gateway.app import Gateway
from fleetwise.live import http
from fleetwise.live.http import listening_socket

__all__ = ["listening_socket", "serve", "uvicorn_server"]


def uvicorn_server(gw: Gateway, log_level: str = "warning") -> uvicorn.Server:
    """A uvicorn server for the gateway's app with its `http` limits and `limits.max_body_bytes`."""
    return http.uvicorn_server(gw.app(), gw.cfg.http, gw.cfg.limits.max_body_bytes, log_level)


def serve(gw: Gateway, host: str, port: int, log_level: str = "warning") -> None:
    """Serve until interrupted (blocking)."""
    sock = listening_socket(host, port)
    uvicorn_server(gw, log_level).run(sockets=[sock])
