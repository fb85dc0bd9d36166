"""A lean HTTP/1.1 server for one emulated replica's ASGI app (`fleetwise emulate --server lean`,
the default; `--server uvicorn` is the reference, and tests check both answer alike).

Why it exists: every wall microsecond an emulator spends is `time_scale` modelled microseconds
of latency. On the development VM, a request's way through uvicorn, from its bytes arriving to
the first line of the ASGI app, took 0.4-0.7 ms of CPU when the process had been idle for
50 ms (its memory gone cold between requests), against 0.19 ms here; at time scale 5 that is
1-2.5 modelled ms on each hop of a request (see docs/emulator.md, "Time").

What it does, per connection: reads the socket with recvmsg and SO_TIMESTAMPNS
(`StampedTransport`), so each request carries when its bytes reached the socket (scope extension
`fleetwise.rx`, this machine's monotonic seconds), parses requests with httptools (as uvicorn's
default does), builds the ASGI HTTP scope, and runs the app in a task started by the read that
completed the request. Responses go out with the app's content-length or in chunked transfer
encoding; a response's head leaves with its first body message, in one write. Keep-alive (HTTP/1.0 and `connection: close` close after the
response); pipelined requests are served in order (reading pauses while a response is in
flight); `expect: 100-continue` is answered; a send waits while the socket's buffer is over its
high-water mark; `receive()` returns the body, then `http.disconnect` once the client has gone
or the response is complete. Malformed HTTP gets a 400 and the connection is closed; an app
error before its response started gets a 500. Not spoken: upgrades (WebSocket), TLS, HTTP/2.

Lifespan: `serve` runs the app's startup and shutdown (`lifespan_context`) around the listening
socket, and stops on SIGINT or SIGTERM: it stops accepting, lets responses in flight finish for
up to `SHUTDOWN_GRACE_S`, closes what is left, then runs the app's shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import struct
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from http import HTTPStatus
from typing import Any

import httptools

__all__ = ["LeanHttp", "serve"]

LOG = logging.getLogger("fleetwise.emulator.server")
SHUTDOWN_GRACE_S = 5.0
LISTEN_BACKLOG = 1024
"""Pending connections the listening socket queues."""
"""Wall seconds responses in flight get to finish after SIGINT/SIGTERM."""
RX_EXTENSION = "fleetwise.rx"
"""ASGI scope extension: `{"monotonic_s": t}`, when the request's first bytes reached the socket
(this machine's `time.monotonic()`), where the transport knows it."""
ASGI_SCOPE_VERSION = {"version": "3.0", "spec_version": "2.3"}
"""The ASGI HTTP spec version the scope declares (2.3: no `http.response.trailers`, no pathsend)."""

Asgi = Callable[[dict[str, Any], Any, Any], Any]


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase.encode())


STATUS_LINES = {int(s): _status_line(int(s)) for s in HTTPStatus}
"""Status line of every standard status code, built once."""
NO_BODY_STATUS = frozenset({204, 304})
"""Responses that carry no body (no content-length, no chunked encoding)."""


class _Cycle:
    """One request and its response on a connection: the ASGI `receive` and `send` of one call."""

    __slots__ = ("conn", "scope", "body", "body_taken", "started", "complete", "chunked", "keep_alive",
                 "head_only", "status", "waiter", "to_send", "sent", "head")

    def __init__(self, conn: LeanHttp, scope: dict[str, Any], body: bytes, keep_alive: bool) -> None:
        self.conn, self.scope, self.body, self.keep_alive = conn, scope, body, keep_alive
        self.body_taken = self.started = self.complete = self.chunked = False
        self.head_only = scope["method"] == "HEAD"
        self.status = 0
        self.waiter: asyncio.Future[None] | None = None
        self.to_send: int | None = None
        """Bytes of body the app's content-length announced (None: chunked)."""
        self.sent = 0
        self.head = b""
        """Status line and headers, written with the first body message."""

    async def receive(self) -> dict[str, Any]:
        """The body first (whole), then `http.disconnect` once the client has gone or the response is done."""
        if not self.body_taken:
            self.body_taken = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        if not (self.conn.lost or self.complete):
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        return {"type": "http.disconnect"}

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def send(self, message: dict[str, Any]) -> None:
        """Write the response's head and body to the socket (nothing once the client has gone)."""
        conn = self.conn
        if conn.drain is not None and not conn.lost:
            await conn.drain
        if conn.lost:
            return
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected ASGI message 'http.response.start', got {kind!r}")
            self.started = True
            self.status = status = message["status"]
            head = [STATUS_LINES.get(status) or _status_line(status)]
            length = None
            for name, value in message.get("headers", ()):
                low = name.lower()
                if low == b"content-length":
                    length = int(value)
                    continue  # written below, once
                if low == b"connection" and value.lower() == b"close":
                    self.keep_alive = False
                elif low == b"transfer-encoding":
                    continue  # this server decides the framing
                head.append(b"%s: %s\r\n" % (name, value))
            if status in NO_BODY_STATUS or self.head_only:
                if length is not None:
                    head.append(b"content-length: %d\r\n" % length)
                self.to_send = 0
            elif length is not None:
                head.append(b"content-length: %d\r\n" % length)
                self.to_send = length
            else:
                self.chunked = True
                head.append(b"transfer-encoding: chunked\r\n")
            if not self.keep_alive:
                head.append(b"connection: close\r\n")
            head.append(b"\r\n")
            self.head = b"".join(head)
            return
        if kind != "http.response.body":
            raise RuntimeError(f"expected ASGI message 'http.response.body', got {kind!r}")
        if self.complete:
            raise RuntimeError("the response is complete already")
        body: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        out = self.head
        self.head = b""
        if self.head_only or self.status in NO_BODY_STATUS:
            body = b""
        if self.chunked:
            if body:
                out += b"%x\r\n%s\r\n" % (len(body), body)
            if not more:
                out += b"0\r\n\r\n"
        else:
            if self.to_send is not None and len(body) > self.to_send - self.sent:
                raise RuntimeError("response body longer than its content-length")
            self.sent += len(body)
            out += body
        if out:
            conn.transport.write(out)  # type: ignore[union-attr]
        if not more:
            if self.to_send is not None and self.sent < self.to_send and not (self.head_only or self.status in NO_BODY_STATUS):
                raise RuntimeError("response body shorter than its content-length")
            self.complete = True
            self.wake()


SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
"""Linux socket option: each read's ancillary data carries when its bytes reached the socket
(SCM_TIMESTAMPNS, a CLOCK_REALTIME timespec; <asm-generic/socket.h>)."""
RX_MAX_AGE_S = 1.0
"""A receive timestamp older than this (or in the future) means the wall clock was stepped
between the packet and the read: the read's own time is used instead."""
READ_SIZE = 256 * 1024
"""Bytes one read takes at most."""
CMSG_SPACE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 64
WRITE_HIGH, WRITE_LOW = 256 * 1024, 64 * 1024
"""Bytes buffered unsent above which the protocol is paused, and below which it resumes."""


class StampedTransport(asyncio.Transport):
    """A TCP connection read with recvmsg, so that each read knows when its bytes reached the
    socket (`rx_monotonic`, this machine's monotonic clock) rather than when the process got
    round to them: the time the emulated server counts a request's arrival from. Writes go
    out at once when the socket takes them, the rest when it can; the protocol is paused above
    `WRITE_HIGH` unsent bytes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: LeanHttp) -> None:
        super().__init__()
        self._loop, self._sock, self._protocol = loop, sock, protocol
        self._fd = sock.fileno()
        self._buf = bytearray()
        self._closing = self._closed = self._paused = self._reading = False
        self._extra = {"socket": sock, "sockname": sock.getsockname(), "peername": sock.getpeername()}
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            self._stamped = True
        except OSError:
            self._stamped = False
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        protocol.connection_made(self)
        self.resume_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def pause_reading(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False

    def resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._loop.add_reader(self._fd, self._on_readable)
            self._reading = True

    def is_reading(self) -> bool:
        return self._reading

    def _on_readable(self) -> None:
        try:
            data, anc, _, _ = self._sock.recvmsg(READ_SIZE, CMSG_SPACE if self._stamped else 0)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self._lose(err)
            return
        if not data:
            self._lose(None)
            return
        rx = now = time.monotonic()
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
                sec, nsec = struct.unpack("qq", raw[:16])
                age = time.time() - (sec + nsec * 1e-9)  # the stamp is CLOCK_REALTIME
                if 0.0 <= age <= RX_MAX_AGE_S:  # else the wall clock was stepped meanwhile: now it is
                    rx = now - age
        self._protocol.rx_monotonic = rx
        self._protocol.data_received(data)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self._closed:
            return
        if not self._buf:
            try:
                n = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as err:
                self._lose(err)
                return
            if n == len(data):
                return
            data = memoryview(data)[n:]
            self._loop.add_writer(self._fd, self._on_writable)
        self._buf += data
        if not self._paused and len(self._buf) > WRITE_HIGH:
            self._paused = True
            self._protocol.pause_writing()

    def _on_writable(self) -> None:
        try:
            n = self._sock.send(self._buf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self._lose(err)
            return
        del self._buf[:n]
        if self._paused and len(self._buf) <= WRITE_LOW:
            self._paused = False
            self._protocol.resume_writing()
        if not self._buf:
            self._loop.remove_writer(self._fd)
            if self._closing:
                self._finish(None)

    def get_write_buffer_size(self) -> int:
        return len(self._buf)

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self.pause_reading()
        if not self._buf:
            self._loop.call_soon(self._finish, None)

    def abort(self) -> None:
        self._buf.clear()
        self._lose(None)

    def _lose(self, exc: Exception | None) -> None:
        self._closing = True
        self.pause_reading()
        self._loop.remove_writer(self._fd)
        self._buf.clear()
        self._loop.call_soon(self._finish, exc)

    def _finish(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()


class LeanHttp(asyncio.Protocol):
    """One HTTP/1.1 connection to an ASGI app (see the module docstring)."""

    def __init__(self, app: Asgi, conns: set[LeanHttp]) -> None:
        self.app, self.conns = app, conns
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.scope: dict[str, Any] | None = None
        self.cycle: _Cycle | None = None
        self.queue: deque[_Cycle] = deque()
        self.lost = False
        self.drain: asyncio.Future[None] | None = None
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.rx_monotonic: float | None = None
        """When the bytes of the current read reached the socket (`StampedTransport`), monotonic s."""
        self.msg_rx: float | None = None

    # ---- transport ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.conns.add(self)
        sock = transport.get_extra_info("sockname")
        peer = transport.get_extra_info("peername")
        self.server = (str(sock[0]), int(sock[1])) if isinstance(sock, tuple) else None
        self.client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(b"upgrades are not supported")
        except httptools.HttpParserError as err:
            self._refuse(f"malformed HTTP request: {err}".encode())

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.conns.discard(self)
        if self.drain is not None and not self.drain.done():
            self.drain.set_result(None)
        for c in (self.cycle, *self.queue):
            if c is not None:
                c.wake()

    def pause_writing(self) -> None:
        if self.drain is None or self.drain.done():
            self.drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.drain is not None and not self.drain.done():
            self.drain.set_result(None)
        self.drain = None

    def _refuse(self, why: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self.cycle is None:
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
                                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(why), why))
        self.transport.close()

    # ---- httptools callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", [], []
        self.msg_rx = self.rx_monotonic

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        p = self.parser
        parsed = httptools.parse_url(self.url)
        raw_path = parsed.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        self.scope = {
            "type": "http", "asgi": ASGI_SCOPE_VERSION, "http_version": p.get_http_version(),
            "method": p.get_method().decode("ascii"), "scheme": "http", "path": path, "raw_path": raw_path,
            "query_string": parsed.query or b"", "root_path": "", "headers": self.headers,
            "client": self.client, "server": self.server,
        }
        if self.msg_rx is not None:
            self.scope["extensions"] = {RX_EXTENSION: {"monotonic_s": self.msg_rx}}
        if self.transport is not None and any(k == b"expect" and v.lower() == b"100-continue" for k, v in self.headers):
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        scope = self.scope
        if scope is None:
            return
        self.scope = None
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        cycle = _Cycle(self, scope, body, self.parser.should_keep_alive())
        if self.cycle is None:
            self._start(cycle)
        else:  # pipelined: served after the one in flight
            self.queue.append(cycle)
            if self.transport is not None:
                self.transport.pause_reading()

    # ---- requests ----------------------------------------------------------------------------
    def _start(self, cycle: _Cycle) -> None:
        self.cycle = cycle
        # A task, as uvicorn runs each request: the app's libraries (anyio task groups, aiohttp
        # timeouts) need to run inside one.
        task = asyncio.get_running_loop().create_task(self._run(cycle))
        task.add_done_callback(lambda f: self._finished(cycle, f))

    async def _run(self, cycle: _Cycle) -> None:
        await self.app(cycle.scope, cycle.receive, cycle.send)

    def _finished(self, cycle: _Cycle, done: asyncio.Future[None]) -> None:
        err = None if done.cancelled() else done.exception()
        if err is not None:
            LOG.error("exception in ASGI application", exc_info=err)
        t = self.transport
        if t is None or self.lost:
            return
        if err is not None or not cycle.complete:
            if not cycle.started:  # nothing sent yet: say so, as uvicorn does
                t.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
                        b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error")
            t.close()  # a response cut short can only end with the connection
            return
        if not cycle.keep_alive:
            t.close()
            return
        self.cycle = None
        if self.queue:
            self._start(self.queue.popleft())
            if not self.queue and not t.is_closing():
                t.resume_reading()


async def serve(app: Asgi, lifespan: Callable[[], AbstractAsyncContextManager[Any]], host: str, port: int,
                on_ready: Callable[[int], None] | None = None, stop: asyncio.Event | None = None) -> None:
    """Serve `app` on host:port inside `lifespan()` until SIGINT/SIGTERM (or `stop` is set);
    `on_ready(port)` runs once it listens (port 0 = any free port)."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
            pass
    conns: set[LeanHttp] = set()
    async with lifespan():
        lsock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            lsock.bind((host, port))
            lsock.listen(LISTEN_BACKLOG)
        except OSError:
            lsock.close()
            raise
        lsock.setblocking(False)

        def accept() -> None:
            while True:
                try:
                    sock, _ = lsock.accept()
                except (BlockingIOError, InterruptedError):
                    return
                except OSError as err:  # out of descriptors, say: keep serving the others
                    LOG.warning("accept failed: %s", err)
                    return
                sock.setblocking(False)
                try:
                    StampedTransport(loop, sock, LeanHttp(app, conns))
                except OSError:  # gone before we looked
                    sock.close()

        loop.add_reader(lsock.fileno(), accept)
        try:
            if on_ready is not None:
                on_ready(int(lsock.getsockname()[1]))
            await stop.wait()
        finally:
            loop.remove_reader(lsock.fileno())
            lsock.close()
            await _drain(conns, SHUTDOWN_GRACE_S)
            for c in list(conns):
                if c.transport is not None:
                    c.transport.close()
            await asyncio.sleep(0)


async def _drain(conns: set[LeanHttp], grace_s: float) -> None:
    """Close idle connections at once; wait (at most `grace_s`) for busy ones to finish theirs."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while True:
        for c in list(conns):
            if c.cycle is None and c.transport is not None:
                c.transport.close()
        if not conns or loop.time() >= deadline:
            return
        await asyncio.sleep(0.02)
