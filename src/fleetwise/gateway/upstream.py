"""Talking to backends: the pooled HTTP client, fault classification and SSE relay framing.

The client is aiohttp, chosen by measured CPU per streamed request over loopback
(benchmarks/results/gateway_client_choice.json: about 12x less than httpx). Every upstream
socket gets TCP_NODELAY, so a small write (request body after headers) never waits for the
peer's delayed ACK (the ~40 ms first-byte stall of pooled connections without it).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import aiohttp

__all__ = ["FAULT_ERRORS", "SseFramer", "Upstream", "fault_kind", "nodelay_socket"]

FAULT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, TimeoutError, OSError)
"""What a backend fault looks like from the client (connect, reset, payload, timeout)."""

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
    """`timeout`, `connect` or `disconnect` for a client-side exception."""
    if isinstance(err, TimeoutError):
        return "timeout"
    if isinstance(err, aiohttp.ClientConnectorError):
        return "connect"
    return "disconnect"


class Upstream:
    """The pooled client session (created inside the running event loop)."""

    def __init__(self, connect_s: float, first_byte_s: float, idle_s: float,
                 socket_factory: Callable[[tuple[Any, ...]], socket.socket] = nodelay_socket) -> None:
        self.connect_s, self.first_byte_s, self.idle_s = connect_s, first_byte_s, idle_s
        self.socket_factory = socket_factory
        self.session: aiohttp.ClientSession | None = None
        self.request_timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=first_byte_s)

    async def open(self) -> aiohttp.ClientSession:
        """Create the session (idempotent)."""
        if self.session is None:
            conn = aiohttp.TCPConnector(limit=POOL_CONNECTIONS, keepalive_timeout=KEEPALIVE_S,
                                        socket_factory=self.socket_factory, enable_cleanup_closed=False)
            self.session = aiohttp.ClientSession(connector=conn, auto_decompress=False, skip_auto_headers=(
                "User-Agent", "Accept-Encoding"))
        return self.session

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    def post(self, url: str, data: bytes, headers: dict[str, str]) -> Any:
        """Start a POST (use as `async with`); timeouts: connect, then first byte per read."""
        assert self.session is not None, "Upstream.open() first"
        return self.session.post(url, data=data, headers=headers, timeout=self.request_timeout)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """A bounded GET (health checks, scrapes); raises on connect errors and timeouts."""
        assert self.session is not None, "Upstream.open() first"
        async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            return r.status, await r.read()


class SseFramer:
    """Cuts a byte stream at SSE event boundaries (blank line), so a relay only ever forwards
    whole events and an error event after a broken stream is never glued to half of one."""

    __slots__ = ("buf", "events", "tail")

    def __init__(self) -> None:
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
