"""A gateway and its responders on 127.0.0.1 in one event loop, started and stopped per test.

`async with running_fleet(...) as f:` yields the gateway, its responders, an aiohttp client on the
gateway's address and helpers to read SSE streams and the gateway's metrics. Every wait is
bounded (`run()` wraps the scenario in a timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import uvicorn
from responder import Responder

from fleetwise.emulator.app import create_app
from fleetwise.emulator.config import EmulatorConfig
from fleetwise.gateway import BackendSpec, Gateway, GatewayConfig
from fleetwise.gateway.server import listening_socket, uvicorn_server

SCENARIO_TIMEOUT_S = 60.0
"""Longest any one test scenario may run before it fails (a hang is a failure, never a stall)."""
FAST_SCRAPE = {"interval_s": 0.05, "timeout_s": 0.5, "health_interval_s": 0.05, "health_failures": 1,
               "watch_interval_s": 0.05}
"""Scrape and health periods for tests (fast, so state changes show within a few tenths of a second)."""
ADMIN = "test-admin-token"
MODEL = "llama-3.1-8b"
"""The model emulated replicas serve."""
TIME_SCALE = 100.0
"""Emulated hardware runs 100x faster than real time."""
TOKEN = "emu-admin"
"""Admin token of emulated replicas."""


def run(scenario: Callable[[], Awaitable[None]], timeout_s: float = SCENARIO_TIMEOUT_S) -> None:
    """Run an async scenario to completion within `timeout_s`."""
    asyncio.run(asyncio.wait_for(scenario(), timeout_s))


LAG_TICK_S = 0.01
"""Period of the event-loop lag monitor (s)."""


@contextlib.asynccontextmanager
async def loop_lag() -> AsyncIterator[list[float]]:
    """Yield a one-item list holding the longest the shared event loop (gateway, emulators and
    clients alike) was late for a LAG_TICK_S sleep while the block ran: the host's stall, which
    every request in flight then carried, on top of what the gateway did."""
    worst = [0.0]
    loop = asyncio.get_running_loop()

    async def tick() -> None:
        while True:
            t0 = loop.time()
            await asyncio.sleep(LAG_TICK_S)
            worst[0] = max(worst[0], loop.time() - t0 - LAG_TICK_S)

    task = asyncio.create_task(tick())
    try:
        yield worst
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@dataclass
class Fleet:
    gw: Gateway
    responders: list[Responder]
    client: aiohttp.ClientSession
    url: str

    def admin_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {ADMIN}"}

    async def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
        """POST JSON (or raw bytes); returns (status, parsed JSON or raw text, headers)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.client.post(self.url + path, data=data,
                                    headers={"content-type": "application/json", **(headers or {})}) as r:
            raw = await r.read()
            try:
                doc: Any = json.loads(raw)
            except ValueError:
                doc = raw.decode("utf-8", "replace")
            return r.status, doc, dict(r.headers)

    async def stream(self, path: str, body: dict[str, Any],
                     headers: dict[str, str] | None = None) -> tuple[int, list[Any], dict[str, str]]:
        """POST a streaming request; returns (status, SSE data payloads parsed, headers)."""
        async with self.client.post(self.url + path, json=body, headers=headers or {}) as r:
            raw = await r.read()
            if r.status != 200:
                return r.status, [json.loads(raw)], dict(r.headers)
            events = []
            for block in raw.decode().split("\n\n"):
                if block.startswith("data: "):
                    payload = block[6:]
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
            return r.status, events, dict(r.headers)

    async def metrics(self) -> dict[str, float]:
        """The gateway's /metrics as {series: value}."""
        async with self.client.get(self.url + "/metrics") as r:
            text = await r.text()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    async def wait_for(self, cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
        """Poll `cond` every 10 ms until true; fail after `timeout_s`."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while not cond():
            if loop.time() > end:
                raise AssertionError("condition not reached in time")
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running_fleet(n: int = 2, *, roles: tuple[str, ...] | None = None, versions: tuple[str, ...] | None = None,
                        admin_token: str | None = ADMIN, responder_kw: dict[str, Any] | None = None,
                        **cfg: Any) -> AsyncIterator[Fleet]:
    """`n` responders and a gateway in front of them (config fields as keyword arguments)."""
    rs = [Responder(engine_id=f"engine-{i}", **(responder_kw or {})) for i in range(n)]
    for r in rs:
        await r.start()
    backends = [BackendSpec(url=r.url, name=f"b{i}", role=(roles[i] if roles else "mixed"),  # type: ignore[arg-type]
                            model_version=(versions[i] if versions else "v1")) for i, r in enumerate(rs)]
    doc: dict[str, Any] = {"backends": [b.model_dump() for b in backends], "scrape": FAST_SCRAPE, **cfg}
    gw = Gateway(GatewayConfig.model_validate(doc), admin_token=admin_token)
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn_server(gw)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    client = aiohttp.ClientSession()
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while not server.started:
            if task.done() or loop.time() > end:
                raise AssertionError("gateway did not start")
            await asyncio.sleep(0.01)
        yield Fleet(gw, rs, client, f"http://127.0.0.1:{port}")
    finally:
        await client.close()
        server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        for r in rs:
            await r.stop()


@contextlib.asynccontextmanager
async def emulators(roles: tuple[str, ...], each: list[dict[str, Any]] | None = None,
                    **emu: Any) -> AsyncIterator[list[tuple[Any, str]]]:
    """One emulator app per role, each on its own 127.0.0.1 port (real sockets); `emu` sets
    further EmulatorConfig fields (`time_scale` replaces TIME_SCALE), `each[i]` those of the i-th emulator alone."""
    socks = [listening_socket("127.0.0.1", 0) for _ in roles]
    scale = emu.pop("time_scale", TIME_SCALE)
    servers, tasks, out = [], [], []
    for k, (role, sock) in enumerate(zip(roles, socks, strict=True)):
        port = sock.getsockname()[1]
        cfg = EmulatorConfig(model=MODEL, gpu="h100-sxm", role=role, time_scale=scale,  # type: ignore[arg-type]
                             admin_token=TOKEN, port=port, engine_id=f"{role}-{port}",
                             **{**emu, **(each[k] if each else {})})
        app = create_app(cfg)
        server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
        servers.append(server)
        tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
        out.append((app, f"http://127.0.0.1:{port}"))
    try:
        while not all(s.started for s in servers):
            await asyncio.sleep(0.01)
        yield out
    finally:
        for s in servers:
            s.should_exit = True
        for t in tasks:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(t, 10)


@contextlib.asynccontextmanager
async def served_gateway(doc: dict[str, Any]) -> AsyncIterator[tuple[Gateway, str]]:
    """A gateway built from config document `doc`, serving on a free 127.0.0.1 port."""
    gw = Gateway(GatewayConfig.model_validate(doc), admin_token=ADMIN)
    sock = listening_socket("127.0.0.1", 0)
    server = uvicorn_server(gw)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                raise AssertionError("gateway did not start")
            await asyncio.sleep(0.01)
        yield gw, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
