"""Talking to backends: the pooled HTTP clients, fault classification and SSE relay framing.

Completions (the hot path) go through `HttpPool`: HTTP/1.1 over pooled keep-alive connections,
responses parsed by httptools (uvicorn's C parser), request head and body in one write. It does
only what a completion needs (POST, a status, headers, a body read as it arrives): 57 us of
client CPU per streamed request against aiohttp's 153 and httpx's 2350
(benchmarks/results/gateway_client_choice.json). Everything else (scrapes, health checks,
KV-event streams) uses aiohttp. Every
upstream socket gets TCP_NODELAY, so a small write (a request after its pooled connection sat
idle) never waits for the peer's delayed ACK (the ~40 ms first-byte stall without it).
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple, overload
from urllib.parse import urlsplit

import aiohttp
import httptools

__all__ = ["ERROR_EVENT", "FAULT_ERRORS", "MAX_GET_BYTES", "ConnectFailed", "ErrorEvent", "HttpPool", "Oversized", "SseFramer", "Upstream", "UpstreamBroken", "UpstreamResponse", "not_an_answer",
           "fault_kind", "nodelay_socket"]


class UpstreamBroken(ConnectionError):
    """The backend broke an exchange: closed the connection before the answer ended, or sent
    bytes that are not an HTTP/1.1 answer."""


class ErrorEvent(UpstreamBroken):
    """The backend ended a stream that had sent tokens with an SSE error event (`data: {"error": ...}`)."""


class Oversized(UpstreamBroken):
    """The backend sent more than a legitimate answer can hold (an SSE event, a body, an error
    body over its bound): a backend fault, never an unbounded buffer."""


class ConnectFailed(UpstreamBroken):
    """No connection to the backend (refused, unreachable, unknown name, TLS handshake)."""


FAULT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, TimeoutError, OSError)
"""What a backend fault looks like from the client (connect, reset, payload, timeout)."""
READ_BUFFER_BYTES = 1 << 18
"""Answer bytes buffered before reading from the backend pauses (a client slower than the backend)."""
IDLE_PER_ORIGIN = 512
"""Idle keep-alive connections kept per backend address; more are closed when released."""

MAX_GET_BYTES = 64 << 20
"""Largest answer to a scrape, health check or /v1/models: vLLM's /metrics with many LoRA adapters,
engines and histogram buckets is a few MiB."""

POOL_CONNECTIONS = 0
"""Upstream connections kept at most (0: no cap; each backend's own limits apply)."""
KEEPALIVE_S = 60.0
"""Idle pooled upstream connections are closed after this long."""


def nodelay_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """A TCP socket with TCP_NODELAY set (aiohttp's `socket_factory`)."""
    family, type_, proto = addr_info[0], addr_info[1], addr_info[2]
    s = socket.socket(family, type_, proto)
    if family in (socket.AF_INET, socket.AF_INET6):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def fault_kind(err: BaseException) -> str:
    """`timeout`, `connect`, `error_event`, `oversized` or `disconnect` for a client-side exception."""
    if isinstance(err, TimeoutError):
        return "timeout"
    if isinstance(err, aiohttp.ClientConnectorError | ConnectFailed):
        return "connect"
    if isinstance(err, ErrorEvent):
        return "error_event"
    if isinstance(err, Oversized):
        return "oversized"
    return "disconnect"


class _Origin(NamedTuple):
    """Where a URL's requests go: the pool key, and the request target and Host header."""

    key: tuple[str, str, int]
    target: bytes
    host_header: bytes


@lru_cache(maxsize=4096)
def _origin(url: str) -> _Origin:
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ConnectFailed(f"not an http(s) URL: {url!r}")
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError as err:  # a port out of range or not a number
        raise ConnectFailed(f"bad port in {url!r}: {err}") from None
    target = (u.path or "/") + (f"?{u.query}" if u.query else "")
    host = u.netloc.rpartition("@")[2]  # never send credentials written into the URL as the Host
    return _Origin((u.scheme, u.hostname, port), target.encode("latin-1"), host.encode("idna"))


class _Conn(asyncio.Protocol):
    """One keep-alive connection to a backend; feeds the answer in flight."""

    def __init__(self, key: tuple[str, str, int]) -> None:
        self.key = key
        """The pool this connection returns to."""
        self.transport: Any = None
        self.resp: UpstreamResponse | None = None
        self.lost = False

    def connection_made(self, transport: Any) -> None:  # asyncio's or uvloop's TCP transport
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        r = self.resp
        if r is None or r.parser is None:  # bytes nobody asked for: the connection is unusable
            self.close()
            return
        r.got_bytes = True
        try:
            r.parser.feed_data(data)
        except httptools.HttpParserError as err:
            r.fail(UpstreamBroken(f"malformed answer from the backend ({err})"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport; `connection_lost` ends the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.resp is not None:
            self.resp.lost(exc)

    def usable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class _Headers:
    """Response headers as received (names lowercased on lookup)."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[tuple[bytes, bytes]] = []

    @overload
    def get(self, name: str) -> str | None: ...

    @overload
    def get(self, name: str, default: str) -> str: ...

    def get(self, name: str, default: str | None = None) -> str | None:
        """The first value of header `name`, else `default`."""
        key = name.lower().encode("latin-1")
        for k, v in self.items:
            if k.lower() == key:
                return v.decode("latin-1")
        return default


class UpstreamResponse:
    """One answer from a backend: `status`, `headers.get()`, and its body as it arrives
    (`content.readany()`, `read()`); each wait for bytes is bounded by the read timeout."""

    def __init__(self, conn: _Conn, timeout_s: float) -> None:
        self.conn = conn
        self.timeout_s = timeout_s
        self.parser: Any = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers = _Headers()
        self.got_bytes = False
        self.keep_alive = False
        """The backend keeps the connection open after this answer (HTTP/1.1 without `close`)."""
        self.done = False
        """The whole answer arrived."""
        self.error: BaseException | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._paused = False
        self._until_close = False
        """The body ends when the backend closes (no length, not chunked)."""
        self._waiter: asyncio.Future[None] | None = None

    @property
    def content(self) -> UpstreamResponse:
        """The body stream (aiohttp's name for it)."""
        return self

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.items.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()  # llhttp resets it once the message ends
        chunked = (self.headers.get("transfer-encoding") or "").lower().endswith("chunked")
        self._until_close = not chunked and self.headers.get("content-length") is None and self.status not in (204, 304)
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._size += len(body)
        if self._size > READ_BUFFER_BYTES and not self._paused and self.conn.transport is not None:
            self.conn.transport.pause_reading()
            self._paused = True
        self._wake()

    def on_message_complete(self) -> None:
        self.done = True
        self._wake()

    # connection events
    def fail(self, err: BaseException) -> None:
        if not self.done and self.error is None:
            self.error = err
        self._wake()

    def lost(self, exc: Exception | None) -> None:
        if self.status and self._until_close and self.error is None:
            self.done = True
        self.fail(UpstreamBroken("the backend closed the connection before the answer ended"
                                 + (f" ({exc})" if exc else "")))

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        w = self._waiter = loop.create_future()
        timer = loop.call_later(self.timeout_s, _expire, w)
        try:
            await w
        finally:
            timer.cancel()
            self._waiter = None

    async def head(self) -> None:
        """Wait for the status line and headers."""
        while not self.status:
            if self.error is not None:
                raise self.error
            await self._wait()

    async def readany(self) -> bytes:
        """The body bytes received since the last call (waiting for some); b"" at its end."""
        while not self._chunks:
            if self.error is not None:
                raise self.error
            if self.done:
                return b""
            await self._wait()
        out = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        if self._paused and self.conn.transport is not None:
            self._paused = False
            self.conn.transport.resume_reading()
        return out

    async def read(self, limit: int) -> bytes:
        """The rest of the body; `Oversized` (the connection closed) beyond `limit` bytes."""
        declared = self.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            self.close()
            raise Oversized(f"the backend's answer is {declared} bytes; its bound is {limit}")
        parts, size = [], 0
        while chunk := await self.readany():
            size += len(chunk)
            if size > limit:
                self.close()
                raise Oversized(f"the backend's answer passed its bound of {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        """Drop the connection (the backend sees the client leave and aborts the request)."""
        self.fail(UpstreamBroken("closed by the gateway"))
        self.conn.close()


def _expire(w: asyncio.Future[None]) -> None:
    if not w.done():
        w.set_exception(TimeoutError("no bytes from the backend within the read timeout"))


class _Post:
    """`async with pool.post(...) as r`: the answer, its connection pooled again when read to the end."""

    __slots__ = ("args", "pool", "resp")

    def __init__(self, pool: HttpPool, args: tuple[str, bytes, dict[str, str], float | None]) -> None:
        self.pool, self.args = pool, args
        self.resp: UpstreamResponse | None = None

    async def __aenter__(self) -> UpstreamResponse:
        self.resp = await self.pool.request(*self.args)
        return self.resp

    async def __aexit__(self, *exc: object) -> None:
        if self.resp is not None:
            self.pool.release(self.resp)


class HttpPool:
    """POSTs over pooled HTTP/1.1 keep-alive connections (per scheme, host and port)."""

    def __init__(self, connect_s: float, read_s: float) -> None:
        self.connect_s, self.read_s = connect_s, read_s
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._tls: ssl.SSLContext | None = None

    def post(self, url: str, data: bytes, headers: dict[str, str], read_s: float | None = None) -> _Post:
        """Start a POST (use as `async with`); `read_s` bounds each wait for bytes (default the pool's)."""
        return _Post(self, (url, data, headers, read_s))

    async def request(self, url: str, data: bytes, headers: dict[str, str],
                      read_s: float | None = None) -> UpstreamResponse:
        """Send a POST and wait for the answer's head. A pooled connection the backend had
        already closed (it answers nothing at all) is replaced by a new one, once."""
        o = _origin(url)
        idle = self._idle.get(o.key)
        conn = None
        while idle:
            c = idle.pop()
            if c.usable():
                conn = c
                break
        reused = conn is not None
        if conn is None:
            conn = await self._connect(o)
        head = [b"POST ", o.target, b" HTTP/1.1\r\nHost: ", o.host_header, b"\r\nContent-Length: ",
                str(len(data)).encode(), b"\r\n"]
        for k, v in headers.items():
            head += (k.encode("latin-1"), b": ", v.encode("latin-1"), b"\r\n")
        head += (b"\r\n", data)
        msg = b"".join(head)
        read_s = self.read_s if read_s is None else read_s
        resp = self._send(conn, msg, read_s)
        try:
            await resp.head()
        except UpstreamBroken:
            conn.close()
            if not reused or resp.got_bytes:
                raise
            conn = await self._connect(o)
            resp = self._send(conn, msg, read_s)
            try:
                await resp.head()
            except BaseException:
                conn.close()
                raise
        except BaseException:
            conn.close()
            raise
        return resp

    def _send(self, conn: _Conn, msg: bytes, read_s: float) -> UpstreamResponse:
        resp = conn.resp = UpstreamResponse(conn, read_s)
        assert conn.transport is not None
        conn.transport.write(msg)
        return resp

    async def _connect(self, o: _Origin) -> _Conn:
        scheme, host, port = o.key
        loop = asyncio.get_running_loop()
        tls = None
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(lambda: _Conn(o.key), host, port, ssl=tls),
                                             self.connect_s)
        except TimeoutError:
            raise
        except (OSError, ssl.SSLError) as err:
            raise ConnectFailed(f"cannot connect to {host}:{port} ({err})") from None
        return conn

    def release(self, resp: UpstreamResponse) -> None:
        """Pool the answer's connection again when it was read to the end and may be kept."""
        conn = resp.conn
        keep = resp.done and resp.error is None and not resp._until_close and resp.keep_alive
        if not keep or not conn.usable():
            conn.close()
            return
        conn.resp = None
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= IDLE_PER_ORIGIN:
            conn.close()
            return
        idle.append(conn)

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for c in idle:
                c.close()
        self._idle.clear()


class Upstream:
    """The pooled client session (created inside the running event loop)."""

    def __init__(self, connect_s: float, first_byte_s: float, idle_s: float,
                 socket_factory: Callable[[tuple[Any, ...]], socket.socket] = nodelay_socket) -> None:
        self.connect_s, self.first_byte_s, self.idle_s = connect_s, first_byte_s, idle_s
        self.socket_factory = socket_factory
        self.session: aiohttp.ClientSession | None = None
        self.pool: HttpPool | None = None

    async def open(self) -> aiohttp.ClientSession:
        """Create the session (idempotent)."""
        if self.pool is None:
            self.pool = HttpPool(self.connect_s, self.first_byte_s)
        if self.session is None:
            conn = aiohttp.TCPConnector(limit=POOL_CONNECTIONS, keepalive_timeout=KEEPALIVE_S,
                                        socket_factory=self.socket_factory, enable_cleanup_closed=False)
            self.session = aiohttp.ClientSession(connector=conn, auto_decompress=False, skip_auto_headers=(
                "User-Agent", "Accept-Encoding"))
        return self.session

    async def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.session is not None:
            await self.session.close()
            self.session = None

    def post(self, url: str, data: bytes, headers: dict[str, str], read_s: float | None = None) -> _Post:
        """Start a completion POST (use as `async with`); timeouts: connect, then `read_s` (default
        the first-byte timeout) per wait for bytes (`UpstreamResponse.timeout_s` may change it)."""
        assert self.pool is not None, "Upstream.open() first"
        return self.pool.post(url, data, headers, read_s)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """A bounded GET (health checks, scrapes); raises on connect errors and timeouts, and
        `Oversized` for an answer over MAX_GET_BYTES."""
        assert self.session is not None, "Upstream.open() first"
        async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            parts, size = [], 0
            async for chunk in r.content.iter_any():
                size += len(chunk)
                if size > MAX_GET_BYTES:
                    raise Oversized(f"{url}: the answer passed {MAX_GET_BYTES} bytes")
                parts.append(chunk)
            return r.status, b"".join(parts)


ERROR_EVENT = b'data: {"error"'
"""How an OpenAI-compatible server's stream error event starts (vLLM's, the gateway's own)."""


SSE_FIELDS = (b":", b"event:", b"id:", b"retry:")
"""Line starts an SSE event may hold besides `data:` (a comment, the other fields; WHATWG HTML s9.2.6)."""


def not_an_answer(answer: bytes, stream: bool) -> str | None:
    """Why a backend's 2xx answer is no OpenAI-compatible engine's (None when it may be one): a
    whole answer that is not a JSON object, or a stream's first event whose data is neither a
    JSON object nor [DONE], or which holds lines SSE does not know (an HTML page, say)."""
    if stream:
        event = answer[: answer.find(b"\n\n")]
        lines = event.split(b"\n")
        data = [ln[5:].removeprefix(b" ") for ln in lines if ln.startswith(b"data:")]
        if not data:
            ok = all(ln.startswith(SSE_FIELDS) for ln in lines)
            return None if ok else f"the first SSE event is no event: {event[:80]!r}"
        answer = b"\n".join(data)
        if answer == b"[DONE]":
            return None
    try:
        doc = json.loads(answer)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        return None
    what = "the first SSE event's data" if stream else "the answer"
    return f"{what} is not a JSON object: {answer[:80]!r}"


class SseFramer:
    """Cuts a byte stream at SSE event boundaries (blank line), so a relay only ever forwards
    whole events and an error event after a broken stream is never glued to half of one."""

    __slots__ = ("buf", "events", "max_event_bytes", "tail")

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        """Longest event the backend may send (`openai.answer_bounds`); `check` raises beyond it."""
        self.buf = b""
        self.events = 0
        """`data:` events forwarded (a token count for streams without usage)."""
        self.tail = b""
        """The last whole events forwarded (searched for the final usage block)."""

    def feed(self, chunk: bytes) -> bytes:
        """The whole events completed by `chunk` (possibly empty). Line ends are relayed as LF:
        SSE also allows CRLF and CR (sse-starlette, which several OpenAI-compatible servers build
        on, writes CRLF unless told otherwise), and the relay reads events by their LF blank line."""
        if b"\r" in chunk or self.buf.endswith(b"\r"):
            chunk = self._lf(chunk)
        buf = self.buf + chunk if self.buf else chunk
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self.buf = buf
            return b""
        out, self.buf = buf[: cut + 2], buf[cut + 2:]
        self.events += out.count(b"data:")
        self.tail = out[-2048:]
        return out

    def check(self) -> None:
        """`Oversized` when the event being received has passed `max_event_bytes` (a relay calls it
        after forwarding the whole events before it)."""
        if len(self.buf) > self.max_event_bytes:
            raise Oversized(f"an SSE event from the backend passed its bound of {self.max_event_bytes} bytes")

    def cut_error(self, out: bytes) -> tuple[bytes, bytes]:
        """Whole events `out` split at the first error event: (the events before it, the error
        event and what followed, b"" without one); what follows is no longer counted in `events`."""
        if b'{"error"' not in out:  # the usual case, one C-speed scan
            return out, b""
        at = 0 if out.startswith(ERROR_EVENT) else out.find(b"\n\n" + ERROR_EVENT) + 2
        if at == 1:  # find gave -1: no error event
            return out, b""
        self.events -= out[at:].count(b"data:")
        return out[:at], out[at:]

    def finished(self) -> bool:
        """The stream's last event was `data: [DONE]` (an answer cut short ends without it)."""
        return (self.tail + self.buf).rstrip().endswith(b"data: [DONE]")

    def _lf(self, chunk: bytes) -> bytes:
        """`chunk` with CRLF and CR line ends as LF; a CR ending the chunk waits in `buf` for the
        next chunk (it may be the first half of a CRLF)."""
        if self.buf.endswith(b"\r"):
            self.buf = self.buf[:-1]
            chunk = b"\r" + chunk
        hold = chunk.endswith(b"\r")
        if hold:
            chunk = chunk[:-1]
        chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if hold:
            self.buf += chunk
            self.buf += b"\r"
            return b""
        return chunk
