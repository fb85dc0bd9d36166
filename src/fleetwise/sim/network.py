"""KV-cache transfer between prefill and decode replicas as a queueing resource.

Owns the ports and the transfers in flight; does not know about engines or requests (a
transfer carries an opaque integer `tag` the fleet gives it back on completion).

Model (processor sharing per port):
- every prefill replica has one egress port and every decode replica one ingress port, each
  with `bandwidth_bytes_per_s` (times a fault factor) and a one-way `latency_s`;
- a transfer of `bytes` from port s to port d moves data at
  `rate = min(bw_s / n_s, bw_d / n_d)` where `n_x` counts active transfers on port x; rates are
  recomputed for the transfers that share a port whenever a transfer starts or ends, so one
  prefill node sending to many decode nodes slows them all;
- a transfer completes `latency_s` after its last byte leaves, plus its own `extra_s` when the
  pair is not direct (a staging copy between vendors, a format conversion on the receiver);
- `queue_s` of a transfer = its duration minus what it would take alone on idle ports.
A port with factor 0 is down: its transfers fail at once and new ones fail on start.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetwise.core.views import KvLinkView
from fleetwise.perf.kv import bytes_left, shared_rate
from fleetwise.sim.events import EventLoop, Priority, TransferEnd


@dataclass(slots=True)
class Port:
    name: str
    bandwidth_bytes_per_s: float
    factor: float = 1.0
    active: set[int] = field(default_factory=set)

    @property
    def effective_bw(self) -> float:
        return self.bandwidth_bytes_per_s * self.factor


@dataclass(slots=True)
class Transfer:
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


@dataclass(slots=True)
class TransferRecord:
    tag: int
    src: int
    dst: int
    start_s: float
    end_s: float
    bytes: float
    queue_s: float
    ok: bool


_LANDED = -1
"""Version marker of the event that delivers a transfer `latency_s` after its last byte."""

DoneCallback = Callable[[float, int, TransferRecord], None]


class KvNetwork:
    """Ports with processor-shared bandwidth; completions come back through `on_done(now, tag, record)`."""

    def __init__(self, loop: EventLoop, latency_s: float, on_done: DoneCallback) -> None:
        self.loop = loop
        self.latency_s = latency_s
        self.on_done = on_done
        self.ports: list[Port] = []
        self.transfers: dict[int, Transfer] = {}
        self.records: list[TransferRecord] = []
        self._landing: dict[int, Transfer] = {}
        self._landing_s: dict[int, float] = {}
        self._next = 0
        loop.on(TransferEnd, self._on_end)

    def add_port(self, name: str, bandwidth_bytes_per_s: float) -> int:
        self.ports.append(Port(name, bandwidth_bytes_per_s))
        return len(self.ports) - 1

    def active_on(self, port: int) -> int:
        return len(self.ports[port].active)

    def link_views(self, pairs: list[tuple[str, int, str, int, float]]) -> tuple[KvLinkView, ...]:
        """The router's view of each (src name, src port, dst name, dst port, extra seconds per
        byte) path now: the bandwidth a transfer started on it alone would get (`min` of the two
        ports' effective bandwidths, slowed by the pair's per-byte staging and conversion when it
        is not direct), the transfers it would share a port with, and whether both ports are up."""
        ports, lat = self.ports, self.latency_s
        out = []
        for sn, sp, dn, dp, extra in pairs:
            ps, pd = ports[sp], ports[dp]
            bw = min(ps.effective_bw, pd.effective_bw)
            if extra > 0 and bw > 0:
                bw = 1.0 / (1.0 / bw + extra)
            active = len(ps.active) + len(pd.active) - len(ps.active & pd.active)
            out.append(KvLinkView(sn, dn, bw, lat, active, bw > 0))
        return tuple(out)

    # ---- transfers -------------------------------------------------------------------------
    def start(self, now_s: float, tag: int, src: int, dst: int, nbytes: float, extra_s: float = 0.0) -> int:
        """Start moving `nbytes` from port `src` to port `dst`, usable `extra_s` after it lands
        (`perf.kv.handoff_extra_s`); returns the transfer id."""
        self._next += 1
        tid = self._next
        ps, pd = self.ports[src], self.ports[dst]
        if ps.factor <= 0 or pd.factor <= 0:
            self._finish(now_s, Transfer(tid, tag, src, dst, nbytes, now_s, nbytes, extra_s=extra_s), ok=False)
            return tid
        tr = Transfer(tid, tag, src, dst, nbytes, now_s, nbytes, last_s=now_s, extra_s=extra_s)
        self.transfers[tid] = tr
        ps.active.add(tid)
        pd.active.add(tid)
        self._reschedule(now_s, ps.active | pd.active)
        return tid

    def _rate(self, tr: Transfer) -> float:
        ps, pd = self.ports[tr.src], self.ports[tr.dst]
        return shared_rate(ps.effective_bw, len(ps.active), pd.effective_bw, len(pd.active))

    def _reschedule(self, now_s: float, tids: set[int]) -> None:
        """Bring `remaining` up to `now_s` at the old rate, then set the new rate and end time."""
        for tid in sorted(tids):
            tr = self.transfers[tid]
            tr.remaining = bytes_left(tr.remaining, tr.rate, now_s - tr.last_s)
            tr.last_s = now_s
            tr.rate = self._rate(tr)
            tr.version += 1
            end = now_s + tr.remaining / tr.rate
            self.loop.push(end, Priority.TRANSFER_END, TransferEnd(tid, tr.version))

    def _detach(self, tr: Transfer) -> set[int]:
        ps, pd = self.ports[tr.src], self.ports[tr.dst]
        ps.active.discard(tr.tid)
        pd.active.discard(tr.tid)
        del self.transfers[tr.tid]
        return ps.active | pd.active

    def _on_end(self, now_s: float, ev: TransferEnd) -> None:
        if ev.version == _LANDED:
            landed = self._landing.pop(ev.transfer, None)
            if landed is not None:  # else cancelled while its last byte was on the wire
                del self._landing_s[ev.transfer]
                self._finish(now_s, landed, ok=True)
            return
        tr = self.transfers.get(ev.transfer)
        if tr is None or tr.version != ev.version:
            return
        self._reschedule(now_s, self._detach(tr))
        # The last byte left at now_s; it lands latency_s later (and is usable extra_s after that).
        self._landing[tr.tid] = tr
        self._landing_s[tr.tid] = now_s + self.latency_s + tr.extra_s
        self.loop.push(now_s + self.latency_s + tr.extra_s, Priority.TRANSFER_END, TransferEnd(tr.tid, _LANDED))

    def _finish(self, end_s: float, tr: Transfer, ok: bool) -> None:
        alone = self.alone_s(tr.src, tr.dst, tr.bytes_total) + tr.extra_s
        rec = TransferRecord(tr.tag, tr.src, tr.dst, tr.start_s, end_s, tr.bytes_total, max(0.0, end_s - tr.start_s - alone), ok)
        self.records.append(rec)
        self.on_done(end_s, tr.tag, rec)

    def alone_s(self, src: int, dst: int, nbytes: float) -> float:
        """Seconds a transfer takes on idle, healthy ports."""
        bw = min(self.ports[src].bandwidth_bytes_per_s, self.ports[dst].bandwidth_bytes_per_s)
        return nbytes / bw + self.latency_s

    def next_end_s(self) -> float:
        """Earliest time any transfer in flight could land (a safe bound: rates only rise after an end)."""
        t = math.inf
        for tr in self.transfers.values():
            t = min(t, tr.last_s + tr.remaining / tr.rate)
        if self._landing or t < math.inf:
            t += self.latency_s
        return min([t, *self._landing_s.values()])

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
                self._finish(now_s, tr, ok=False)
            return
        self._reschedule(now_s, touched)

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

    def fail_port(self, now_s: float, port: int) -> None:
        """A replica behind `port` crashed: its transfers fail, the others speed up."""
        for tid in sorted(self.ports[port].active):
            tr = self.transfers[tid]
            others = self._detach(tr)
            self._finish(now_s, tr, ok=False)
            self._reschedule(now_s, others & set(self.transfers))
