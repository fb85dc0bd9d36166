"""KV ports shared by processor sharing: the one KV-link bandwidth model of the simulator and the emulator.

Owns ports, the transfers on them and when each one's last byte leaves and lands. Clockless: it
asks its driver to wake it at a time (`wake(t_s, tid, version)`, answered by `on_wake`) and
reports each transfer that ends (`done(now_s, transfer, ok)`). The simulator's network
(`sim.network.KvNetwork`: a port per replica, every transfer of the fleet) and an emulated
replica's KV port (`emulator.kv_link.KvPort`: its own port and one per peer it moves KV with)
drive the same object, so both move bytes by the same arithmetic.

Model:
- a port has `bandwidth_bytes_per_s` times a fault `factor` (1 healthy, 0 down);
- a transfer from port s to port d moves at `shared_rate` = `min(bw_s / n_s, bw_d / n_d)`, `n_x`
  the transfers active on port x; whenever one starts or ends, the transfers sharing a port with
  it are brought up to date (`bytes_left`) and get their new rate and end, in transfer order;
- it lands `latency_s` after its last byte leaves, plus its own `extra_s` (a staging copy or a
  format conversion when the pair is not direct);
- a port with factor 0 is down: its transfers fail at once and new ones fail on start.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetwise.perf.kv import bytes_left, shared_rate

__all__ = ["LANDED", "Port", "SharedPorts", "Transfer"]

LANDED = -1
"""Version of the wake-up that delivers a transfer `latency_s + extra_s` after its last byte."""


@dataclass(slots=True)
class Port:
    """One KV port: its bandwidth (one GPU's NIC times the replica's KV shards), fault factor and transfers."""

    name: str
    bandwidth_bytes_per_s: float
    factor: float = 1.0
    active: set[int] = field(default_factory=set)

    @property
    def effective_bw(self) -> float:
        """Bandwidth now (times the fault factor)."""
        return self.bandwidth_bytes_per_s * self.factor


@dataclass(slots=True)
class Transfer:
    """One transfer: `tag` is the driver's (opaque here); bytes and rate as of `last_s`."""

    tid: int
    tag: int
    src: int
    dst: int
    bytes_total: float
    start_s: float
    remaining: float
    rate: float = 0.0
    last_s: float = 0.0
    version: int = 0
    extra_s: float = 0.0
    """Seconds after its last byte lands before the KV is usable (staging copy, conversion)."""


WakeFn = Callable[[float, int, int], None]
"""`wake(t_s, tid, version)`: call `on_wake(t_s, tid, version)` at `t_s` on the driver's clock."""
DoneFn = Callable[[float, Transfer, bool], None]
"""`done(now_s, transfer, ok)`: the transfer landed (ok) or failed at `now_s`."""


class SharedPorts:
    """Ports with processor-shared bandwidth; see the module docstring."""

    def __init__(self, latency_s: float, wake: WakeFn, done: DoneFn) -> None:
        self.latency_s = latency_s
        self._wake, self._done = wake, done
        self.ports: list[Port] = []
        self.transfers: dict[int, Transfer] = {}
        self._landing: dict[int, Transfer] = {}
        self._landing_s: dict[int, float] = {}
        self._next = 0

    def add_port(self, name: str, bandwidth_bytes_per_s: float) -> int:
        """A new port; returns its index."""
        self.ports.append(Port(name, bandwidth_bytes_per_s))
        return len(self.ports) - 1

    def active_on(self, port: int) -> int:
        """Transfers moving bytes on `port` now."""
        return len(self.ports[port].active)

    def start(self, now_s: float, tag: int, src: int, dst: int, nbytes: float, extra_s: float = 0.0) -> int:
        """Start moving `nbytes` from port `src` to port `dst` at `now_s`, usable `extra_s` after it
        lands (`perf.kv.handoff_extra_s`); returns the transfer id (failed at once on a down port)."""
        self._next += 1
        tid = self._next
        ps, pd = self.ports[src], self.ports[dst]
        if ps.factor <= 0 or pd.factor <= 0:
            self._done(now_s, Transfer(tid, tag, src, dst, nbytes, now_s, nbytes, extra_s=extra_s), False)
            return tid
        tr = Transfer(tid, tag, src, dst, nbytes, now_s, nbytes, last_s=now_s, extra_s=extra_s)
        self.transfers[tid] = tr
        ps.active.add(tid)
        pd.active.add(tid)
        self._reschedule(now_s, ps.active | pd.active)
        return tid

    def _reschedule(self, now_s: float, tids: set[int]) -> None:
        """Bring `remaining` up to `now_s` at the old rate, then set the new rate and end time."""
        ports = self.ports
        for tid in sorted(tids):
            tr = self.transfers[tid]
            tr.remaining = bytes_left(tr.remaining, tr.rate, now_s - tr.last_s)
            tr.last_s = now_s
            ps, pd = ports[tr.src], ports[tr.dst]
            tr.rate = shared_rate(ps.effective_bw, len(ps.active), pd.effective_bw, len(pd.active))
            tr.version += 1
            self._wake(now_s + tr.remaining / tr.rate, tid, tr.version)

    def _detach(self, tr: Transfer) -> set[int]:
        ps, pd = self.ports[tr.src], self.ports[tr.dst]
        ps.active.discard(tr.tid)
        pd.active.discard(tr.tid)
        del self.transfers[tr.tid]
        return ps.active | pd.active

    def on_wake(self, now_s: float, tid: int, version: int) -> None:
        """A wake-up asked for by `wake`: a transfer's last byte left (it lands later), or it landed."""
        if version == LANDED:
            landed = self._landing.pop(tid, None)
            if landed is not None:  # else cancelled while its last byte was on the wire
                del self._landing_s[tid]
                self._done(now_s, landed, True)
            return
        tr = self.transfers.get(tid)
        if tr is None or tr.version != version:
            return
        self._reschedule(now_s, self._detach(tr))
        # The last byte left at now_s; it lands latency_s later (and is usable extra_s after that).
        land_s = now_s + self.latency_s + tr.extra_s
        self._landing[tid] = tr
        self._landing_s[tid] = land_s
        self._wake(land_s, tid, LANDED)

    def alone_s(self, src: int, dst: int, nbytes: float) -> float:
        """Seconds a transfer takes on idle, healthy ports."""
        bw = min(self.ports[src].bandwidth_bytes_per_s, self.ports[dst].bandwidth_bytes_per_s)
        return nbytes / bw + self.latency_s

    def next_end_s(self) -> float:
        """Earliest time any transfer in flight could land (a safe bound: rates only rise after an end)."""
        t = math.inf
        for tr in self.transfers.values():  # explicit comparisons: `min`'s first-smallest, no list or boxing
            end = tr.last_s + tr.remaining / tr.rate
            if end < t:
                t = end
        if self._landing or t < math.inf:
            t += self.latency_s
        for land in self._landing_s.values():
            if land < t:
                t = land
        return t

    def cancel(self, now_s: float, tid: int) -> None:
        """Stop transfer `tid` without a completion (its sender gave up); the others speed up."""
        if tid in self._landing:
            del self._landing[tid]
            del self._landing_s[tid]
            return
        tr = self.transfers.get(tid)
        if tr is not None:
            others = self._detach(tr)
            self._reschedule(now_s, others & set(self.transfers))

    # ---- faults ----------------------------------------------------------------------------
    def set_factor(self, now_s: float, ports: list[int], factor: float) -> None:
        """Scale the bandwidth of `ports` (1 = healthy, 0 = down: their transfers fail now)."""
        touched: set[int] = set()
        for p in ports:
            self.ports[p].factor = factor
            touched |= self.ports[p].active
        if factor <= 0:
            # Detach every failing transfer before any completion runs, so no survivor is ever
            # rescheduled on a port that is down.
            failing = [self.transfers[tid] for tid in sorted(touched)]
            others: set[int] = set()
            for tr in failing:
                others |= self._detach(tr)
            self._reschedule(now_s, others & set(self.transfers))
            for tr in failing:
                self._done(now_s, tr, False)
            return
        self._reschedule(now_s, touched)

    def fail_port(self, now_s: float, port: int) -> None:
        """The replica behind `port` crashed: its transfers fail, the others speed up."""
        for tid in sorted(self.ports[port].active):
            tr = self.transfers[tid]
            others = self._detach(tr)
            self._done(now_s, tr, False)
            self._reschedule(now_s, others & set(self.transfers))
