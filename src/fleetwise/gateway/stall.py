"""Stall detection: how long a request may wait on one backend for its first token and for each
next one, from that backend's own recent latency, and the active one-token probe.

A hung replica (it accepts connections and answers /health, but never produces a token) is found
two ways. Per request: no first token within `first_token_bound_s` fails the request over to
another backend while nothing has reached the client; no next chunk within `next_token_bound_s`
breaks the stream, which then migrates (the failure-domain path). Both count as a `timeout`
fault on the backend's breaker. Actively: every `stall.probe_interval_s` each mixed backend gets a
one-token completion bounded by its first-token bound; a probe that fails counts as a failed
health check, so a hung replica leaves the fleet even when no request is on it. (Prefill-role
backends are not probed: a probe would hold KV for a hand-off that never comes; decode-role
backends need a hand-off to generate.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from fleetwise.gateway.backends import Backend
from fleetwise.gateway.config import StallSpec, TimeoutSpec

__all__ = ["PROBE_PROMPT", "first_token_bound_s", "fleet_ttft_s", "next_token_bound_s", "probe_body"]

PROBE_PROMPT = "ping"
"""The prompt of an active probe (one token is generated)."""


def fleet_ttft_s(backends: Iterable[Backend]) -> float | None:
    """The median recent TTFT over backends that have one (None when none has): the expectation
    for a backend without history of its own."""
    seen = sorted(b.ttft_ewma_s for b in backends if b.ttft_ewma_s is not None)
    return seen[len(seen) // 2] if seen else None


def first_token_bound_s(b: Backend, fleet_ttft: float | None, stall: StallSpec, timeouts: TimeoutSpec) -> float:
    """Seconds a request sent to `b` now may wait for its first token: `factor` x its recent TTFT
    scaled by the queue ahead (waiting / running), within [min_first_token_s, first_byte_s]."""
    base = b.ttft_ewma_s if b.ttft_ewma_s is not None else fleet_ttft
    if not stall.enabled or base is None:
        return timeouts.first_byte_s
    if b.scraped_at_s is not None:
        waiting, running = b.load.waiting, b.load.running
    else:
        waiting, running = max(0, b.in_flight - 1), b.in_flight
    expected = base * (1.0 + waiting / max(1, running))
    return min(timeouts.first_byte_s, max(stall.min_first_token_s, stall.factor * expected))


def next_token_bound_s(b: Backend, stall: StallSpec, timeouts: TimeoutSpec) -> float:
    """Seconds a stream from `b` may go without a chunk: `factor` x its recent TPOT, within
    [min_next_token_s, idle_s]."""
    if not stall.enabled or b.tpot_ewma_s is None:
        return timeouts.idle_s
    return min(timeouts.idle_s, max(stall.min_next_token_s, stall.factor * b.tpot_ewma_s))


def probe_body(model: str) -> bytes:
    """A one-token, non-streamed completion for `model`."""
    return json.dumps({"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "stream": False}).encode()
