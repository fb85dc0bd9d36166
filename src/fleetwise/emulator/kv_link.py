"""`KvPort`: one replica's KV port and the transfers on it, sharing bandwidth as the simulator's links do.

Owns the transfers on one replica's port (a prefill replica's egress, a decode replica's
ingress) and when each lands, in modelled seconds on the replica's clock. The model is the
simulator's (`fleetwise.sim.network`, processor sharing per port; both move bytes by
`perf.kv.shared_rate` and `perf.kv.bytes_left`): every replica has one KV
port of `link bandwidth x KV shards`; a transfer from port s to port d moves at
`min(bw_s / n_s, bw_d / n_d)`, `n_x` the transfers active on port x, recomputed whenever one
starts or ends; it lands `latency_s` after its last byte. Alone on idle ports that is
`perf.kv.kv_transfer_s`.

A port sees only its own transfers, so it counts on the peer's port (`n_peer`) only the
transfers it shares with that peer. A pull is priced on both ends, the prefill's egress and the
decode's ingress, and lands at the later of the two: exact when each decode replica pulls from
one prefill replica at a time (fan-out: the egress sees everything) or each prefill replica
feeds one decode replica at a time (fan-in: the ingress sees everything). With many-to-many
transfers at once, both ends undercount the far port and the pull lands no later than the
simulator's (a lower bound).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetwise.engine.clock import ORDER_ARRIVAL, Clock
from fleetwise.perf.kv import bytes_left, shared_rate


@dataclass(slots=True)
class _Pull:
    peer: str
    remaining: float
    rate: float = 0.0
    last_s: float = 0.0
    version: int = 0
    start_s: float = 0.0
    on_landed: Callable[[float, float, bool], None] | None = None
    shared: bool = False
    """Another peer's transfer was on this port at some moment of this one's."""


@dataclass
class KvPort:
    """One replica's KV port and the transfers sharing it (and the peers' ports they cross)."""

    clock: Clock
    bandwidth_bytes_per_s: float
    """This replica's port: link bandwidth x its KV shards."""
    latency_s: float
    _pulls: dict[int, _Pull] = field(default_factory=dict)
    _peer_bw: dict[str, float] = field(default_factory=dict)
    _peer_n: dict[str, int] = field(default_factory=dict)
    _landing: dict[int, _Pull] = field(default_factory=dict)
    _next: int = 0

    @property
    def active(self) -> int:
        """Transfers moving bytes now."""
        return len(self._pulls)

    def start(self, now_s: float, peer: str, peer_bandwidth_bytes_per_s: float, nbytes: float,
              on_landed: Callable[[float, float, bool], None]) -> int:
        """Start moving `nbytes` between this port and the peer's port `peer` at `now_s`;
        `on_landed(t, seconds, shared)` runs when the last byte has landed (t = landing time,
        seconds = how long the transfer took, shared = whether a transfer with another peer was
        on this port meanwhile)."""
        self._next += 1
        pid = self._next
        self._peer_bw[peer] = peer_bandwidth_bytes_per_s
        self._peer_n[peer] = self._peer_n.get(peer, 0) + 1
        self._pulls[pid] = _Pull(peer, float(nbytes), last_s=now_s, start_s=now_s, on_landed=on_landed)
        self._reschedule(now_s)
        return pid

    def _reschedule(self, now_s: float) -> None:
        """Bring each transfer's bytes up to `now_s` at its old rate, then set its new rate and end."""
        n_d = len(self._pulls)
        shared = len(self._peer_n) > 1
        for pid, p in self._pulls.items():
            if shared:
                p.shared = True
            p.remaining = bytes_left(p.remaining, p.rate, now_s - p.last_s)
            p.last_s = now_s
            p.rate = shared_rate(self._peer_bw[p.peer], self._peer_n[p.peer], self.bandwidth_bytes_per_s, n_d)
            p.version += 1
            self.clock.call_at(now_s + p.remaining / p.rate, ORDER_ARRIVAL, self._on_end, (pid, p.version))

    def _on_end(self, now_s: float, arg: Any) -> None:
        pid, version = arg
        p = self._pulls.get(pid)
        if p is None or p.version != version:
            return
        self._leave(now_s, pid)
        self._landing[pid] = p
        self.clock.call_at(now_s + self.latency_s, ORDER_ARRIVAL, self._landed, pid)

    def _landed(self, now_s: float, pid: int) -> None:
        p = self._landing.pop(pid, None)
        if p is not None and p.on_landed is not None:
            p.on_landed(now_s, now_s - p.start_s, p.shared)

    def cancel(self, now_s: float, pid: int) -> None:
        """Stop transfer `pid` (its request was aborted): it never lands; the others speed up."""
        if self._landing.pop(pid, None) is not None:
            return
        if pid in self._pulls:
            self._leave(now_s, pid)

    def _leave(self, now_s: float, pid: int) -> None:
        """Transfer `pid` stops moving bytes: the others share the ports without it from now."""
        p = self._pulls.pop(pid)
        self._peer_n[p.peer] -= 1
        if not self._peer_n[p.peer]:
            del self._peer_n[p.peer], self._peer_bw[p.peer]
        self._reschedule(now_s)
