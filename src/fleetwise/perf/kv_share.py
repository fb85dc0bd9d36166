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

Compiled with mypyc (setup.py `COMPILED`): a transfer's classes define their own `__init__`
(a compiled dataclass's generated one runs interpreted), and `next_end_s`, which the simulator
asks before every decode step, is kept between changes instead of rescanning the transfers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fleetwise.perf.kv import bytes_left, shared_rate

__all__ = ["LANDED", "Port", "SharedPorts", "Transfer"]

LANDED = -1
"""Version of the wake-up that delivers a transfer `latency_s + extra_s` after its last byte."""


@dataclass(slots=True, init=False)
class Port:
    """One KV port: its bandwidth (one GPU's NIC times the replica's KV shards), fault factor and transfers."""

    name: str
    bandwidth_bytes_per_s: float
    factor: float
    active: set[int]
    changes: int
    """Times `active` or `factor` changed: a reader that saw the same count saw the same port."""

    def __init__(self, name: str, bandwidth_bytes_per_s: float, factor: float = 1.0) -> None:
        self.name = name
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.factor = factor
        self.active = set()
        self.changes = 0

    @property
    def effective_bw(self) -> float:
        """Bandwidth now (times the fault factor)."""
        return self.bandwidth_bytes_per_s * self.factor


@dataclass(slots=True, init=False)
class Transfer:
    """One transfer: `tag` is the driver's (opaque here); bytes and rate as of `last_s`."""

    tid: int
    tag: int
    src: int
    dst: int
    bytes_total: float
    start_s: float
    remaining: float
    rate: float
    last_s: float
    version: int
    extra_s: float
    """Seconds after its last byte lands before the KV is usable (staging copy, conversion)."""
    end_s: float
    """When its last byte leaves at the current rate (`last_s + remaining / rate`; inf before a rate)."""

    def __init__(self, tid: int, tag: int, src: int, dst: int, bytes_total: float, start_s: float,
                 remaining: float, rate: float = 0.0, last_s: float = 0.0, version: int = 0,
                 extra_s: float = 0.0) -> None:
        self.tid, self.tag, self.src, self.dst = tid, tag, src, dst
        self.bytes_total, self.start_s, self.remaining = bytes_total, start_s, remaining
        self.rate, self.last_s, self.version, self.extra_s = rate, last_s, version, extra_s
        self.end_s = math.inf


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
        self._next_end = math.inf
        self._next_end_stale = False
        """Whether a transfer started, ended, landed or changed rate since `_next_end` was made."""

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
        ps.changes += 1
        pd.changes += 1
        self._reschedule(now_s, ps.active | pd.active)
        return tid

    def _reschedule(self, now_s: float, tids: set[int]) -> None:
        """Bring `remaining` up to `now_s` at the old rate, then set the new rate and end time."""
        ports, transfers = self.ports, self.transfers
        self._next_end_stale = True
        for tid in sorted(tids):
            tr = transfers[tid]
            tr.remaining = bytes_left(tr.remaining, tr.rate, now_s - tr.last_s)
            tr.last_s = now_s
            ps, pd = ports[tr.src], ports[tr.dst]
            tr.rate = shared_rate(ps.effective_bw, len(ps.active), pd.effective_bw, len(pd.active))
            tr.version += 1
            tr.end_s = now_s + tr.remaining / tr.rate
            self._wake(tr.end_s, tid, tr.version)

    def _detach(self, tr: Transfer) -> set[int]:
        ps, pd = self.ports[tr.src], self.ports[tr.dst]
        ps.active.discard(tr.tid)
        pd.active.discard(tr.tid)
        ps.changes += 1
        pd.changes += 1
        del self.transfers[tr.tid]
        self._next_end_stale = True
        return ps.active | pd.active

    def on_wake(self, now_s: float, tid: int, version: int) -> None:
        """A wake-up asked for by `wake`: a transfer's last byte left (it lands later), or it landed."""
        if version == LANDED:
            landed = self._landing.pop(tid, None)
            if landed is not None:  # else cancelled while its last byte was on the wire
                del self._landing_s[tid]
                self._next_end_stale = True
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
        """Earliest time any transfer in flight could land (a safe bound: rates only rise after an
        end); kept until a transfer starts, ends, lands or changes rate."""
        if self._next_end_stale:
            self._next_end_stale = False
            t = math.inf
            for tr in self.transfers.values():
                t = min(t, tr.end_s)
            if self._landing or t < math.inf:
                t += self.latency_s
            for land_s in self._landing_s.values():
                t = min(t, land_s)
            self._next_end = t
        return self._next_end

    def cancel(self, now_s: float, tid: int) -> None:
        """Stop transfer `tid` without a completion (its sender gave up); the others speed up."""
        if tid in self._landing:
            del self._landing[tid]
            del self._landing_s[tid]
            self._next_end_stale = True
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
            self.ports[p].changes += 1
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
        """The replica behind `port` crashed: its transfers fail, those whose last byte has left
        but that have not landed too (the sender's or the receiver's copy is gone with it), and
        the others speed up."""
        for tid in sorted(self.ports[port].active):
            tr = self.transfers[tid]
            others = self._detach(tr)
            self._done(now_s, tr, False)
            self._reschedule(now_s, others & set(self.transfers))
        for tid in sorted(t for t, tr in self._landing.items() if port in (tr.src, tr.dst)):
            tr = self._landing.pop(tid)
            del self._landing_s[tid]
            self._next_end_stale = True
            self._done(now_s, tr, False)
