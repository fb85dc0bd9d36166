"""The gateway's background work: scrapes, health checks, active probes, the watched backends file,
KV-event subscriptions, and the fleet view they keep current.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from fleetwise.core.feedback import WorkerDown
from fleetwise.core.views import FleetView
from fleetwise.errors import SpecError
from fleetwise.gateway.backends import Backend
from fleetwise.gateway.call import (
    log,
)
from fleetwise.gateway.config import BackendSpec, duplicate_names
from fleetwise.gateway.kv_events import kv_source
from fleetwise.gateway.kv_zmq import ZmqKvEventFeed
from fleetwise.gateway.openai import MAX_ERROR_BODY_BYTES
from fleetwise.gateway.scrape import BadSample, parse_metrics
from fleetwise.gateway.stall import first_token_bound_s, fleet_ttft_s, probe_body
from fleetwise.gateway.state import GatewayState
from fleetwise.gateway.upstream import FAULT_ERRORS
from fleetwise.spec.base import read_document, validate

__all__ = ["FleetLoops"]


def _served_models(doc: Any) -> list[dict[str, Any]]:
    """The model entries of a /v1/models answer (`{"data": [{"id": ...}, ...]}`); ValueError for
    JSON of another shape."""
    data = doc.get("data", []) if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ValueError(f"/v1/models: expected {{\"data\": [...]}}, got {type(doc).__name__}")
    return [m for m in data if isinstance(m, dict) and "id" in m]


class FleetLoops(GatewayState):
    """The loops that keep the fleet view current, and starting/stopping them."""

    async def start(self) -> None:
        """Open the client pool and start the background loops (inside the serving event loop)."""
        await self.upstream.open()
        if self.cfg.backends_file:
            self.reload_backends_file()
        await asyncio.gather(self.scrape_once(), self.health_once())
        for b in self.backends.live.values():
            self._follow_kv(b)
        self._tasks = [asyncio.create_task(self._every(self.cfg.scrape.interval_s, self.scrape_once)),
                       asyncio.create_task(self._every(self.cfg.scrape.health_interval_s, self.health_once))]
        if self.cfg.backends_file:
            self._tasks.append(asyncio.create_task(self._every(self.cfg.scrape.watch_interval_s, self._watch)))
        if self.cfg.stall.enabled and self.cfg.stall.probe_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._every(self.cfg.stall.probe_interval_s, self.probe_once)))

    async def stop(self) -> None:
        """Stop the loops and close the client pool."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        for name in list(self.kv_feeds):
            await self._unfollow_kv(name)
        await self.upstream.close()
        if self.ledger is not None:
            await asyncio.to_thread(self.ledger.close)

    async def _every(self, period_s: float, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await fn()
            except Exception:  # a loop must outlive any one bad round
                log.exception("background loop %s failed", getattr(fn, "__name__", fn))

    async def scrape_once(self) -> None:
        """Read every live backend's /metrics once (concurrently); failures leave the view aging."""
        bs = [b for b in self.backends.live.values() if b.spec.metrics_path is not None]
        await asyncio.gather(*(self._scrape(b) for b in bs))

    async def _scrape(self, b: Backend) -> None:
        try:
            status, data = await self.upstream.get(b.spec.url + str(b.spec.metrics_path), self.cfg.scrape.timeout_s)
        except FAULT_ERRORS:
            status, data = 0, b""
        try:
            load = parse_metrics(data.decode("utf-8", "replace")) if status == 200 else None
        except BadSample as err:
            if b.scrape_rejected is None:  # logged once per run of bad samples
                log.warning("backend %s: /metrics sample rejected (%s); keeping its last good view", b.name, err)
            b.scrape_rejected, load = str(err), None
        if load is None:
            b.scrape_errors += 1
            self.telemetry.scrapes.labels("error").inc()
            return
        b.scrape_rejected = None
        b.scraped(load, self.now())
        self.telemetry.scrapes.labels("ok").inc()

    async def health_once(self) -> None:
        """Poll every live backend's health endpoint (and /v1/models unless models are configured)."""
        await asyncio.gather(*(self._health(b) for b in list(self.backends.live.values())))

    async def _health(self, b: Backend) -> None:
        ok = False
        try:
            status, _ = await self.upstream.get(b.spec.url + b.spec.health_path, self.cfg.scrape.timeout_s)
            ok = status == 200
            if ok:
                status, data = await self.upstream.get(b.spec.url + "/v1/models", self.cfg.scrape.timeout_s)
                if status == 200:
                    ms = _served_models(json.loads(data))
                    self.discovered_models[b.name] = frozenset(str(m["id"]) for m in ms)
                    self.contexts[b.name] = {str(m["id"]): int(m["max_model_len"]) for m in ms
                                             if isinstance(m.get("max_model_len"), int)}
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError):
            ok = False
        self._health_verdict(b, ok and b.probe_ok)

    async def probe_once(self) -> None:
        """Actively probe every live mixed backend with a one-token completion (see `stall`)."""
        await asyncio.gather(*(self._probe(b) for b in list(self.backends.live.values()) if b.spec.role == "mixed"))

    async def _probe(self, b: Backend) -> None:
        models = self.cfg.models or tuple(sorted(self.discovered_models.get(b.name, ())))
        if not models:
            return
        bound = first_token_bound_s(b, fleet_ttft_s(self.backends.live.values()), self.cfg.stall,
                                    self.cfg.timeouts)
        try:
            async with self.upstream.post(b.spec.url + "/v1/completions", probe_body(models[0]),
                                          {"content-type": "application/json"}, read_s=bound) as r:
                await r.read(MAX_ERROR_BODY_BYTES)
                ok = r.status < 500
        except FAULT_ERRORS:
            ok = False
        b.probe_ok = ok
        if not ok:
            self.telemetry.upstream_errors.labels(b.name, "probe").inc()
            self._health_verdict(b, False)

    def add_backend(self, spec: BackendSpec) -> bool:
        """Add or update a backend (config file, admin API); True when new. A new one is routable
        at once; its view is stale until its first scrape."""
        b, new = self.backends.upsert(spec)
        self._sync_panic()
        if self.upstream.session is not None:
            if new:
                asyncio.get_running_loop().create_task(self._first_look(b))
            self._follow_kv(b)
        return new

    def _follow_kv(self, b: Backend) -> None:
        """Subscribe to `b`'s KV events when it publishes them and the policy reads a prefix index
        (a changed source starts a new subscription)."""
        feed = self.kv_feeds.get(b.name)
        src = kv_source(b.spec) if self.wants_hashes else None
        if feed is not None and feed[0].source == src:
            return
        if feed is not None:
            feed[1].cancel()
            del self.kv_feeds[b.name]
        if src is None:
            return
        assert b.spec.kv_events is not None
        f = ZmqKvEventFeed(b.name, b.spec.kv_events, self.cfg.limits.hash_block_tokens, self.policy.observe, self.now)
        self.kv_feeds[b.name] = (f, asyncio.get_running_loop().create_task(f.run()))

    async def _unfollow_kv(self, name: str) -> None:
        feed = self.kv_feeds.pop(name, None)
        if feed is not None:
            feed[1].cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feed[1]

    async def _first_look(self, b: Backend) -> None:
        await asyncio.gather(self._health(b), self._scrape(b) if b.spec.metrics_path else asyncio.sleep(0))

    def remove_backend(self, name: str) -> bool:
        """Stop routing to a backend; its in-flight requests finish (drain)."""
        b = self.backends.remove(name)
        self.discovered_models.pop(name, None)
        feed = self.kv_feeds.pop(name, None)
        if feed is not None:
            feed[1].cancel()
        if b is not None:
            self.policy.observe(WorkerDown(self.now(), name, "removed"))
            self._sync_panic()
        return b is not None

    def reload_backends_file(self) -> None:
        """Reconcile with `backends_file`: add/update what it lists, remove what it dropped."""
        path = Path(str(self.cfg.backends_file))
        try:
            self._file_mtime = path.stat().st_mtime
            doc = read_document(path)
            items = doc.get("backends", []) if isinstance(doc, dict) else doc
            if not isinstance(items, list):
                raise SpecError(f"{path}: expected a list of backends or {{backends: [...]}}")
            specs = [validate(BackendSpec, it, f"{path}: backends[{i}]", strict=True) for i, it in enumerate(items)]
            dup = duplicate_names(specs)
            if dup:
                raise SpecError(f"{path}: duplicate backend name(s) {', '.join(dup)}; give each a distinct `name`")
        except (SpecError, OSError) as err:
            log.error("backends file not applied, keeping the previous fleet: %s", err)
            return
        names = {s.key for s in specs}
        for s in specs:
            self.add_backend(s)
        for gone in self._file_backends - names:
            self.remove_backend(gone)
        self._file_backends = names

    async def _watch(self) -> None:
        try:
            mtime = Path(str(self.cfg.backends_file)).stat().st_mtime
        except OSError:
            return
        if mtime != self._file_mtime:
            self.reload_backends_file()

    def fleet(self, now_s: float, exclude: frozenset[str] = frozenset()) -> FleetView:
        """The current view; the workers tuple is reused while nothing it shows changed (the
        policy memoises per tuple), so a burst of requests between scrapes pays for one build."""
        if exclude:
            return self.backends.fleet(now_s, exclude)
        key: list[Any] = [self.backends.version]
        for b in self.backends.live.values():
            if b.spec.metrics_path is None or b.breaker.opened_at_s is not None:
                return self.backends.fleet(now_s)  # time-dependent view: build afresh
            key += (b.scraped_at_s, b.healthy)
        k = tuple(key)
        if k != self._fleet_key or self._fleet_workers is None:
            self._fleet_key, self._fleet_workers = k, self.backends.fleet(now_s)
        return FleetView(now_s=now_s, workers=self._fleet_workers.workers, links=self.backends.links(now_s))
