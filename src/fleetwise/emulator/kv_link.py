"""`KvPort`: one replica's KV port and the transfers on it, sharing bandwidth as the simulator's links do.

Owns the transfers on one replica's port (a prefill replica's egress, a decode replica's
ingress) and when each lands, in modelled seconds on the replica's clock. The model is the
simulator's own object (`perf.kv_share.SharedPorts`, processor sharing per port): every replica
has one KV port of `link bandwidth x KV shards`; a transfer from port s to port d moves at
`min(bw_s / n_s, bw_d / n_d)`, `n_x` the transfers active on port x, recomputed whenever one
starts or ends; it lands `latency_s` after its last byte. Alone on idle ports that is
`perf.kv.kv_transfer_s`.

A port sees only its own transfers, so each peer it moves KV with is a port of the model that
counts only the transfers it shares with this one. A pull is priced on both ends, the prefill's
egress and the decode's ingress, and lands at the later of the two: exact when each decode
replica pulls from one prefill replica at a time (fan-out: the egress sees everything) or each
prefill replica feeds one decode replica at a time (fan-in: the ingress sees everything). With
many-to-many transfers at once, both ends undercount the far port and the pull lands no later
than the simulator's (a lower bound).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fleetwise.engine.clock import ORDER_ARRIVAL, Clock
from fleetwise.perf.kv_share import SharedPorts, Transfer

LandedFn = Callable[[float, float, bool], None]
"""`on_landed(t, seconds, shared)`: landing time, how long the transfer took, whether a transfer
with another peer was on this port meanwhile."""


class KvPort:
    """One replica's KV port and the transfers sharing it (and the peers' ports they cross)."""

    def __init__(self, clock: Clock, bandwidth_bytes_per_s: float, latency_s: float) -> None:
        """`bandwidth_bytes_per_s`: this replica's port (link bandwidth x its KV shards)."""
        self.clock = clock
        self.ports = SharedPorts(latency_s, self._wake, self._done)
        self.own = self.ports.add_port("self", bandwidth_bytes_per_s)
        self._peer_port: dict[str, int] = {}
        self._landed: dict[int, LandedFn] = {}
        self._shared: set[int] = set()
        """Transfers that had another peer's transfer on this port at some moment."""

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """This replica's port: link bandwidth x its KV shards."""
        return self.ports.ports[self.own].bandwidth_bytes_per_s

    def set_factor(self, now_s: float, factor: float) -> None:
        """This port keeps `factor` of its bandwidth from `now_s` (a `kv_link` fault; 1 = healthy)."""
        self.ports.set_factor(now_s, [self.own], factor)

    @property
    def factor(self) -> float:
        """Fraction of its bandwidth this port has now."""
        return self.ports.ports[self.own].factor

    @property
    def active(self) -> int:
        """Transfers moving bytes now."""
        return self.ports.active_on(self.own)

    def start(self, now_s: float, peer: str, peer_bandwidth_bytes_per_s: float, nbytes: float,
              on_landed: LandedFn) -> int:
        """Start moving `nbytes` between this port and the peer's port `peer` at `now_s`;
        `on_landed(t, seconds, shared)` runs when the last byte has landed."""
        net = self.ports
        p = self._peer_port.get(peer)
        if p is None:
            p = self._peer_port[peer] = net.add_port(peer, peer_bandwidth_bytes_per_s)
        net.ports[p].bandwidth_bytes_per_s = peer_bandwidth_bytes_per_s
        tid = net.start(now_s, 0, p, self.own, nbytes)
        self._landed[tid] = on_landed
        # Sharing only grows when a transfer starts: each later end leaves a subset of these peers.
        if sum(1 for q in self._peer_port.values() if net.ports[q].active) > 1:
            self._shared.update(net.ports[self.own].active)
        return tid

    def cancel(self, now_s: float, tid: int) -> None:
        """Stop transfer `tid` (its request was aborted): it never lands; the others speed up."""
        self.ports.cancel(now_s, tid)
        self._landed.pop(tid, None)
        self._shared.discard(tid)

    def _wake(self, t_s: float, tid: int, version: int) -> None:
        self.clock.call_at(t_s, ORDER_ARRIVAL, self._on_wake, (tid, version))

    def _on_wake(self, now_s: float, arg: Any) -> None:
        self.ports.on_wake(now_s, *arg)

    def _done(self, now_s: float, tr: Transfer, ok: bool) -> None:
        on_landed = self._landed.pop(tr.tid, None)
        shared = tr.tid in self._shared
        self._shared.discard(tr.tid)
        if ok and on_landed is not None:
            on_landed(now_s, now_s - tr.start_s, shared)
