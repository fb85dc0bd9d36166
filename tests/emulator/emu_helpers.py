"""Helpers for the emulator tests: an in-process app behind an ASGI transport, bounded in time."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx

from fleetwise.emulator.app import KvPost, create_app
from fleetwise.emulator.config import EmulatorConfig

T = TypeVar("T")
TEST_TIME_SCALE = 100.0
"""Tests run the modelled hardware 100x faster than real time."""
TOKEN = "secret-token"
UNTIL_S = 20.0
"""Longest wait for a condition the emulator reaches at a step boundary (a loaded 2-core machine
may take well over the modelled time to get there)."""


def cfg(**kw: Any) -> EmulatorConfig:
    base: dict[str, Any] = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "time_scale": TEST_TIME_SCALE,
                            "admin_token": TOKEN}
    base.update(kw)
    return EmulatorConfig(**base)


def run(coro: Awaitable[T], timeout_s: float = 60.0) -> T:
    """Run a test coroutine with a wall-clock bound."""
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout_s)
    return asyncio.run(bounded())


async def until(cond: Callable[[], bool], what: str, timeout_s: float = UNTIL_S) -> None:
    """Poll `cond` every 10 ms until it holds; fail naming `what` after `timeout_s` of wall time."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, f"not reached in {timeout_s:g} s: {what}"
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def serve(config: EmulatorConfig | None = None, kv_post: KvPost | None = None,
                crashes: list[int] | None = None) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """An emulator app (started) and a client talking to it in-process."""
    app = create_app(config or cfg(), kv_post=kv_post,
                     on_crash=(lambda: crashes.append(1)) if crashes is not None else None)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://emulator") as c:
            yield app, c


def metric(text: str, name: str) -> float:
    """Value of an unlabelled-by-us sample `name{...}` in Prometheus text (first match)."""
    m = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M)
    assert m is not None, f"{name} not in /metrics"
    return float(m.group(1))


def sse_events(body: str) -> list[Any]:
    """The JSON payloads of an SSE body, with '[DONE]' kept as the string."""
    import json

    out: list[Any] = []
    for block in body.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def asgi_post(apps: dict[str, Any]) -> KvPost:
    """A `KvPost` that reaches in-process apps by base URL (`http://host:port`)."""
    async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
        base = next((b for b in apps if url.startswith(b)), None)
        if base is None:
            raise ConnectionRefusedError(url)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=apps[base]), base_url=base) as c:
            r = await c.post(url[len(base):], json=body)
            return r.status_code, r.json()
    return post
