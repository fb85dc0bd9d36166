"""Serving a `Gateway`: uvicorn with the project's connection limits (`fleetwise.live.http`), on
a listening socket with TCP_NODELAY, so the first SSE chunk after the response headers is never
held back waiting for the client's delayed ACK; or several worker processes sharing the port
(`serve_workers`)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn

from fleetwise.gateway.app import Gateway
from fleetwise.live import http
from fleetwise.live.http import listening_socket

__all__ = ["listening_socket", "serve", "serve_workers", "uvicorn_server"]


def uvicorn_server(gw: Gateway, log_level: str = "warning",
                   on_ready: Callable[[], None] | None = None) -> uvicorn.Server:
    """A uvicorn server for the gateway's app with its `http` limits and `limits.max_body_bytes`;
    `on_ready` is called once it serves, after the gateway's start (backends file read)."""
    return http.uvicorn_server(gw.app(), gw.cfg.http, gw.cfg.limits.max_body_bytes, log_level, on_ready)


def serve(gw: Gateway, host: str, port: int, log_level: str = "warning", sock: socket.socket | None = None,
          on_ready: Callable[[], None] | None = None) -> None:
    """Serve until interrupted (blocking), on `sock` or a new socket on host:port; `on_ready()` once serving."""
    uvicorn_server(gw, log_level, on_ready).run(sockets=[sock or listening_socket(host, port)])


def serve_workers(make_gateway: Callable[[], Gateway], host: str, port: int, workers: int,
                  log_level: str = "warning", on_bound: Callable[[int], None] | None = None) -> int:
    """Serve from `workers` processes on one port (SO_REUSEPORT), each with its own `Gateway`
    built by `make_gateway` after the fork (`on_bound` hears the port bound, the system's pick
    under port 0); the exit status once all have stopped."""
    return http.run_workers(host, port, workers,
                            lambda sock: serve(make_gateway(), host, int(sock.getsockname()[1]), log_level, sock),
                            on_bound)
