"""`HttpLimitsSpec`: the connection-level limits and timeouts of fleetwise's HTTP servers (the
gateway and the emulator), with safe defaults; `fleetwise.live.http` enforces them."""

from __future__ import annotations

from pydantic import Field

from fleetwise.spec.base import Spec

HEADER_TIMEOUT_S = 10.0
"""Seconds a request head (request line and headers) may take to arrive, from the connection's
first byte or the next request's: a half-sent head is answered 408 and closed (slowloris).
Go's `http.Server.ReadHeaderTimeout` is commonly set to 5-10 s; nginx's `client_header_timeout`
is 60 s for slow links."""
BODY_TIMEOUT_S = 30.0
"""Seconds a request body may take to arrive after its head (a Content-Length larger than the
body, or chunks that stop, are answered 408 and closed). A whole body, not the gap between
reads (nginx's `client_body_timeout`), so a drip-fed body cannot hold a connection forever."""
KEEP_ALIVE_TIMEOUT_S = 75.0
"""Seconds an idle keep-alive connection is kept between requests (nginx's `keepalive_timeout`
default; longer than the usual 60 s idle timeout of the load balancers in front, so the server
is not the side that closes a connection the client is about to reuse)."""
MAX_HEADER_BYTES = 64 * 1024
"""Bytes of a request head (request line and headers): 431 above (nginx's
`large_client_header_buffers` is 4 x 8 KiB; 64 KiB leaves room for long tokens and cookies)."""
MAX_HEADERS = 100
"""Header lines per request: 431 above (Python's `http.client` and Apache's `LimitRequestFields`
stop at 100)."""

class HttpLimitsSpec(Spec):
    """Connection-level limits of an HTTP server (the body limit is the server's own
    `max_body_bytes`, enforced while the body is read)."""

    header_timeout_s: float = Field(default=HEADER_TIMEOUT_S, gt=0.0, le=3600.0)
    """Seconds for a request head to arrive (408 after)."""
    body_timeout_s: float = Field(default=BODY_TIMEOUT_S, gt=0.0, le=3600.0)
    """Seconds for a request body to arrive after its head (408 after)."""
    keep_alive_timeout_s: float = Field(default=KEEP_ALIVE_TIMEOUT_S, gt=0.0, le=3600.0)
    """Seconds an idle connection is kept between requests."""
    max_header_bytes: int = Field(default=MAX_HEADER_BYTES, ge=1024, le=16 * 1024 * 1024)
    """Largest request head in bytes (431 above)."""
    max_headers: int = Field(default=MAX_HEADERS, ge=8, le=10_000)
    """Most header lines per request (431 above)."""
