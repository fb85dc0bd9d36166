"""The gateway's own Prometheus metrics (one registry per gateway, so tests can run several).

Counters and histograms are updated on the request path; per-backend gauges (up, breaker,
in-flight, scrape age) and the policy's safe-mode time are read from live state at scrape time
by a collector, so the hot path pays nothing for them. Names are prefixed `fleetwise_gateway_`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from fleetwise.gateway.backends import Backends
from fleetwise.ledger.writer import LedgerWriter

__all__ = ["Telemetry"]

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                     120.0)
"""Histogram buckets for end-to-end and first-byte latency (1 ms .. 2 min)."""


class _StateCollector(Collector):
    def __init__(self, backends: Backends, now: Callable[[], float], policy_report: Callable[[], dict[str, Any]]):
        self.backends, self.now, self.policy_report = backends, now, policy_report
        self.ledger: LedgerWriter | None = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = self.now()
        up = GaugeMetricFamily("fleetwise_gateway_backend_up", "1 if healthy, breaker closed or half-open, and in the fleet",
                               labels=["backend"])
        brk = GaugeMetricFamily("fleetwise_gateway_backend_breaker_open", "1 while the circuit breaker is open",
                                labels=["backend"])
        inf = GaugeMetricFamily("fleetwise_gateway_backend_in_flight", "Requests the gateway has on the backend",
                                labels=["backend"])
        age = GaugeMetricFamily("fleetwise_gateway_backend_scrape_age_seconds",
                                "Seconds since the backend's /metrics was last read successfully", labels=["backend"])
        for b in (*self.backends.live.values(), *self.backends.draining.values()):
            up.add_metric([b.name], float(b.available(now)))
            brk.add_metric([b.name], float(b.breaker.state(now) == "open"))
            inf.add_metric([b.name], float(b.in_flight))
            if b.scraped_at_s is not None:
                age.add_metric([b.name], now - b.scraped_at_s)
        yield from (up, brk, inf, age)
        safe = self.policy_report().get("safe_mode", {})
        yield GaugeMetricFamily("fleetwise_gateway_safe_mode", "1 while the policy is in safe mode",
                                value=float(bool(safe.get("active"))))
        yield GaugeMetricFamily("fleetwise_gateway_safe_mode_seconds", "Seconds spent in safe mode since start",
                                value=float(safe.get("time_s", 0.0)))
        if self.ledger is not None:
            yield from _ledger_metrics(self.ledger.state())


def _ledger_metrics(st: dict[str, Any]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The ledger writer's state as metrics (`fleetwise_gateway_ledger_*`)."""
    yield GaugeMetricFamily("fleetwise_gateway_ledger_degraded",
                            "1 while usage records go to the local spool (the ledger is unreachable)",
                            value=float(st["degraded"]))
    yield GaugeMetricFamily("fleetwise_gateway_ledger_spool_records", "Usage records waiting in the spool",
                            value=float(st["spool_records"]))
    for name, key, text in (("written", "written", "Usage records committed to the ledger directly"),
                            ("spooled", "spooled", "Usage records appended to the spool"),
                            ("replayed", "replayed", "Spooled usage records committed to the ledger later"),
                            ("write_errors", "write_errors", "Ledger transactions that failed"),
                            ("lost_records", "lost", "Usage records neither committed nor spooled")):
        yield CounterMetricFamily(f"fleetwise_gateway_ledger_{name}", text, value=float(st[key]))


class Telemetry:
    """Every gateway metric."""

    def __init__(self, backends: Backends, now: Callable[[], float], policy_report: Callable[[], dict[str, Any]]):
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("fleetwise_gateway_requests", "Requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("fleetwise_gateway_request_seconds", "Arrival to last byte sent",
                                 ["endpoint"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.ttfb = Histogram("fleetwise_gateway_first_byte_seconds", "Arrival to first body byte relayed",
                              ["endpoint"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.decisions = Counter("fleetwise_gateway_decisions", "Routing decisions by kind", ["kind"], registry=r)
        self.retries = Counter("fleetwise_gateway_retries", "Retries before the first byte, by cause", ["cause"],
                               registry=r)
        self.retries_refused = Counter("fleetwise_gateway_retries_refused",
                                       "Retries not made: the retry budget was spent (retries.budget_percent)",
                                       registry=r)
        self.upstream_errors = Counter("fleetwise_gateway_upstream_errors",
                                       "Backend faults (connect, timeout, 5xx, mid-stream drop)", ["backend", "kind"],
                                       registry=r)
        self.stream_errors = Counter("fleetwise_gateway_stream_errors",
                                     "Streams ended by an error event after bytes reached the client", registry=r)
        self.migrations = Counter("fleetwise_gateway_migrations",
                                  "Continuations sent for streams broken mid-way (decode migration)", registry=r)
        self.scrapes = Counter("fleetwise_gateway_scrapes", "Backend /metrics scrapes by outcome", ["outcome"],
                               registry=r)
        self.pd_handoffs = Counter("fleetwise_gateway_pd_handoffs", "Prefill legs completed and handed to decode",
                                   registry=r)
        self.kv_released = Counter("fleetwise_gateway_kv_released",
                                   "Explicit releases of a prefill's KV after a refused or failed hand-off", registry=r)
        self.state = _StateCollector(backends, now, policy_report)
        r.register(self.state)
        self._status_children: dict[tuple[str, int], Any] = {}
        self._kind_children: dict[str, Any] = {}
        self._ttfb_children: dict[str, Any] = {}
        self._latency_children: dict[str, Any] = {}

    def watch_ledger(self, writer: LedgerWriter | None) -> None:
        """Report `writer`'s state (degraded, spooled, replayed, lost) at each scrape."""
        self.state.ledger = writer

    def first_byte(self, endpoint: str, seconds: float) -> None:
        """Observe one request's arrival-to-first-byte time (labelled child cached)."""
        c = self._ttfb_children.get(endpoint)
        if c is None:
            c = self._ttfb_children[endpoint] = self.ttfb.labels(endpoint)
        c.observe(seconds)

    def request_done(self, endpoint: str, seconds: float) -> None:
        """Observe one request's arrival-to-last-byte time (labelled child cached)."""
        c = self._latency_children.get(endpoint)
        if c is None:
            c = self._latency_children[endpoint] = self.latency.labels(endpoint)
        c.observe(seconds)

    def decided(self, kind: str) -> None:
        """Count one routing decision of `kind`."""
        c = self._kind_children.get(kind)
        if c is None:
            c = self._kind_children[kind] = self.decisions.labels(kind)
        c.inc()

    def answered(self, endpoint: str, status: int) -> None:
        """Count one answered request (children cached: the label lookup is the costly part)."""
        key = (endpoint, status)
        c = self._status_children.get(key)
        if c is None:
            c = self._status_children[key] = self.requests.labels(endpoint, str(status))
        c.inc()

    def render(self) -> bytes:
        """The Prometheus text page."""
        return generate_latest(self.registry)
