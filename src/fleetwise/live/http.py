"""Serving an ASGI app over HTTP/1.1 for the live drivers (the gateway and the emulator): uvicorn,
with the connection limits it lacks added by a small protocol subclass (`GuardedHttpTools`).

Why uvicorn and not a server of our own: the emulator had one (a lean HTTP/1.1 server reading
the kernel's receive time), kept because uvicorn cost 0.4-0.7 ms more CPU per cold request. On
the user's path it is not measurable: `benchmarks/emulator_http_server.py` (one Llama-3.1-70B
TP4 replica, 150 streamed Poisson requests at 4/s, time scale 5, two alternating rounds on the
shared 2-core VM) gave a median replica CPU of 11.3 ms per request on the lean server and
11.1 ms on uvicorn, client TTFT p50 140 ms and 143 ms, p99 293 and 285 ms, TPOT p50 29.7 ms on
both (`benchmarks/results/emulator_http_server.json`): the rounds of one server differ more
than the servers do. So both servers run on uvicorn (httptools parser, uvloop when installed).

What uvicorn provides, configured here: the keep-alive timeout between requests
(`keep_alive_timeout_s`), the listen backlog, and, on an asyncio or uvloop loop, a pause in
accepting when the process runs out of file descriptors instead of a busy loop (tested). What
it lacks, added by `GuardedHttpTools`: a deadline for the request head (from a fresh
connection's start or a request's first byte: `header_timeout_s`, 408 then close; an idle new
connection is just closed), a deadline for the body after its head (`body_timeout_s`: a
Content-Length larger than the body, or chunks that stop), limits on header lines and head
bytes (431), and the body limit enforced while reading (413 on a Content-Length over the limit
before any of the body is read, or as soon as a chunked body passes it): nothing over the limit
is buffered. Refusals carry an OpenAI-style error body and close the connection. A client that
stops reading a response is dropped once its writes stayed blocked `SEND_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Generator
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from fleetwise.core.openai_request import error_body
from fleetwise.live.process import stop_with_parent
from fleetwise.spec.http import HttpLimitsSpec

__all__ = ["LISTEN_BACKLOG", "GuardedHttpTools", "guarded_protocol", "listening_socket", "run_workers",
           "uvicorn_server"]

LOG = logging.getLogger("fleetwise.live.http")
LISTEN_BACKLOG = 2048
"""Pending connections the kernel queues for a server (bursts of new clients)."""
LINGER_S = 2.0
"""Seconds a refused connection keeps reading (and dropping) what the client still sends after
the answer and a half-close, so the answer is not lost to a reset (nginx's lingering close;
its `lingering_timeout` is 5 s)."""


SEND_TIMEOUT_S = 60.0
"""Longest a response may stay blocked on a client that reads nothing (nginx's `send_timeout`
default): the connection is then dropped, so a client that stops reading cannot hold a request,
and the backend's work for it, forever."""


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that was answered and closed."""


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with head/body deadlines, head limits and the body limit
    enforced while reading (see the module docstring). `limits` and `max_body_bytes` are set
    on a subclass per server (`guarded_protocol`)."""

    limits: HttpLimitsSpec = HttpLimitsSpec()
    max_body_bytes: int = 4 * 1024 * 1024
    send_timeout_s: float = SEND_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._in_head = True
        """Reading a request head (a fresh connection waits for its first one)."""
        self._in_body = False
        self._head_bytes = self._headers = self._body_bytes = 0
        self._refused = False
        self._send_timer: asyncio.TimerHandle | None = None
        """Armed while writing is paused (the client's window is full): `send_timeout_s`."""

    # ---- deadlines -----------------------------------------------------------------------------
    def _arm(self, seconds: float, status: int, why: str) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._expired, status, why)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, status: int, why: str) -> None:
        self._timer = None
        if self._in_head and self._head_bytes == 0 and self._headers == 0:
            self._refused = True
            self.transport.close()  # nothing was sent: no one to answer
            return
        self._refuse(status, why)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s, 408, "the request head did not arrive in time")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_send_timer()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.send_timeout_s, self._send_expired)

    def resume_writing(self) -> None:
        self._stop_send_timer()
        super().resume_writing()

    def _stop_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_expired(self) -> None:
        """The client read nothing for `send_timeout_s`: drop it (the app hears a disconnect)."""
        self._send_timer = None
        LOG.info("client read nothing for %.0f s: connection dropped", self.send_timeout_s)
        self.transport.abort()

    # ---- refusing ------------------------------------------------------------------------------
    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` (when no response of this connection is under way) and close."""
        if self._refused:
            return
        self._refused = True
        self._disarm()
        c = self.cycle
        writable = (c is None or c.response_complete) if not self._in_body else not c.response_started
        writable = writable and not self.pipeline  # an earlier response is still going out: cut it instead
        if self._in_body:  # the app reading this body hears a disconnect and its sends are dropped
            c.disconnected = True
            c.message_event.set()
        t = self.transport
        if t.is_closing():
            return
        if writable:
            body = error_body(status, f"{message}; the connection is closed")
            t.write(b"".join([STATUS_LINE[status], b"content-type: application/json\r\ncontent-length: ",
                              str(len(body)).encode(), b"\r\nconnection: close\r\n\r\n", body]))
        if not t.can_write_eof():
            t.close()
            return
        t.write_eof()  # the answer, then end of stream; what the client still sends is read and dropped
        t.resume_reading()
        self._timer = self.loop.call_later(LINGER_S, t.close)

    def data_received(self, data: bytes) -> None:
        """uvicorn's `data_received`, with the head-size count and refusals kept apart from
        malformed requests (a refused request is not answered twice)."""
        if self._refused:
            return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if not self._refused:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            return
        if self._in_head and not self._refused:
            self._head_bytes += len(data)  # a head still incomplete: every byte of this read is its
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(431, f"the request head is over {self.limits.max_header_bytes} bytes")

    # ---- parser callbacks ----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._in_body = True, False
        self._head_bytes = self._headers = self._body_bytes = 0
        self._arm(self.limits.header_timeout_s, 408, "the request head did not arrive in time")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers += 1
        if self._headers > self.limits.max_headers:
            self._refuse(431, f"the request has more than {self.limits.max_headers} header lines")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        length = next((v for k, v in self.headers if k == b"content-length"), None)
        if length is not None and length.strip().isdigit() and int(length) > self.max_body_bytes:
            self._refuse(413, f"the request body is {int(length)} bytes, over the {self.max_body_bytes}-byte limit")
            raise _Refused
        super().on_headers_complete()
        self._in_body = True
        self._arm(self.limits.body_timeout_s, 408, "the request body did not arrive in time")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.max_body_bytes:
            self._refuse(413, f"the request body is over the {self.max_body_bytes}-byte limit")
            raise _Refused
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm()
        super().on_message_complete()


def guarded_protocol(limits: HttpLimitsSpec, max_body_bytes: int) -> type[GuardedHttpTools]:
    """The protocol class of one server: `GuardedHttpTools` with its limits."""
    return type("GuardedHttpTools", (GuardedHttpTools,), {"limits": limits, "max_body_bytes": max_body_bytes})


def listening_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A bound, listening TCP socket with SO_REUSEADDR and TCP_NODELAY (inherited by accepted
    connections on Linux, so a stream's first chunk never waits for a delayed ACK); with
    `reuse_port`, several processes may listen on the same port (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        s.bind((host, port))
        s.listen(LISTEN_BACKLOG)
    except OSError:
        s.close()
        raise
    s.setblocking(False)
    return s


class _Server(uvicorn.Server):
    """uvicorn's server, telling `on_ready` once the app has started (its lifespan done)."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None] | None) -> None:
        super().__init__(config)
        self.on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """uvicorn's handlers for SIGINT and SIGTERM, without its raising the signal again once
        stopped (uvicorn >= 0.29): a server stopped by Ctrl-C or SIGTERM has shut down cleanly and
        exits 0, not 130 or 143 (nor does a `--workers` parent log its workers as failed)."""
        with super().capture_signals():
            yield
            self._captured_signals.clear()


def uvicorn_server(app: Any, limits: HttpLimitsSpec, max_body_bytes: int, log_level: str = "warning",
                   on_ready: Callable[[], None] | None = None) -> uvicorn.Server:
    """A uvicorn server for `app` with `limits` (no access log: the servers' /metrics count);
    `on_ready()` once it serves."""
    config = uvicorn.Config(app, lifespan="on", access_log=False, log_level=log_level, loop="auto",
                            http=guarded_protocol(limits, max_body_bytes), backlog=LISTEN_BACKLOG,
                            timeout_keep_alive=limits.keep_alive_timeout_s)  # type: ignore[arg-type]
    return _Server(config, on_ready)


def run_workers(host: str, port: int, workers: int, serve_one: Callable[[socket.socket], None],
                on_bound: Callable[[int], None] | None = None) -> int:
    """Serve on host:port from `workers` forked processes, each on its own SO_REUSEPORT socket
    (the kernel spreads new connections over them), each running `serve_one(socket)` until it
    stops. SIGTERM or SIGINT (Ctrl-C) to this process is passed on to every worker as SIGTERM
    (SIGINT even where it was inherited ignored, as a shell starts a background job); a worker
    that exits is reported and the others keep serving. `on_bound` hears the port bound (the
    system's pick under port 0) before the workers start. Returns the highest exit status once all
    have exited (Linux: needs fork and SO_REUSEPORT)."""
    first = listening_socket(host, port, reuse_port=True)
    port = int(first.getsockname()[1])
    if on_bound is not None:
        on_bound(port)
    socks = [first, *(listening_socket(host, port, reuse_port=True) for _ in range(workers - 1))]
    pids: list[int] = []
    parent = os.getpid()
    for i, sock in enumerate(socks):
        pid = os.fork()
        if pid == 0:  # the worker: its socket only, then serve until stopped (or this process dies)
            stop_with_parent(parent)
            for j, other in enumerate(socks):
                if j != i:
                    other.close()
            status = 0
            try:
                serve_one(sock)
            except BaseException:  # noqa: BLE001 - the worker's last word, then its exit status
                LOG.exception("gateway worker %d failed", i)
                status = 1
            os._exit(status)
        pids.append(pid)
    for sock in socks:
        sock.close()

    def forward(signum: int, frame: Any) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)  # also where it was inherited ignored (a shell's background job)
    worst = 0
    left = set(pids)
    while left:
        try:
            pid, status = os.wait()
        except InterruptedError:
            continue
        left.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if left and code != 0:
            LOG.error("worker %d exited with status %d; %d still serving", pid, code, len(left))
        worst = max(worst, abs(code) if code != -signal.SIGTERM else 0)
    return worst
