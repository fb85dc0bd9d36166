"""KV-cache transfer between prefill and decode replicas as a queueing resource.

Owns the simulator's side of the KV network: a port per replica on the event loop, the record of
each transfer and the router's view of each path. Does not know about engines or requests (a
transfer carries an opaque integer `tag` the fleet gives it back on completion).

The bandwidth model is `perf.kv_share.SharedPorts` (processor sharing per port, the one the
emulator's replicas drive too): every prefill replica has one egress port and every decode
replica one ingress port, each with `bandwidth_bytes_per_s` (times a fault factor) and a one-way
`latency_s`; a transfer moves at `min(bw_s / n_s, bw_d / n_d)`, recomputed whenever a transfer on
either port starts or ends, so one prefill node sending to many decode nodes slows them all; it
completes `latency_s` after its last byte leaves, plus its own `extra_s` when the pair is not
direct. `queue_s` of a transfer = its duration minus what it would take alone on idle ports.
A port with factor 0 is down: its transfers fail at once and new ones fail on start.

Compiled with mypyc (setup.py `COMPILED`): a wake-up is a `call_at` on the loop (a transfer's id
and version as its argument: the same order as the per-transfer wake-up event it replaced, of the
same priority, with no event object), and a record defines its own `__init__`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from fleetwise.core.views import KvLinkView
from fleetwise.perf.kv_share import Port, SharedPorts, Transfer
from fleetwise.sim.events import EventLoop, Priority

TRANSFER_END: Final = int(Priority.TRANSFER_END)
"""The loop order of a transfer's wake-ups (`Priority.TRANSFER_END`)."""


@dataclass(slots=True, init=False)
class TransferRecord:
    tag: int
    src: int
    dst: int
    start_s: float
    end_s: float
    bytes: float
    queue_s: float
    ok: bool

    def __init__(self, tag: int, src: int, dst: int, start_s: float, end_s: float, bytes: float,
                 queue_s: float, ok: bool) -> None:
        self.tag, self.src, self.dst = tag, src, dst
        self.start_s, self.end_s, self.bytes, self.queue_s, self.ok = start_s, end_s, bytes, queue_s, ok


DoneCallback = Callable[[float, int, TransferRecord], None]


class KvNetwork(SharedPorts):
    """Ports with processor-shared bandwidth on the event loop; completions come back through
    `on_done(now, tag, record)`."""

    def __init__(self, loop: EventLoop, latency_s: float, on_done: DoneCallback) -> None:
        super().__init__(latency_s, self._push, self._finish)
        self.loop = loop
        self.on_done = on_done
        self.records: list[TransferRecord] = []
        self._views: _LinkViews | None = None

    def _push(self, t_s: float, tid: int, version: int) -> None:
        self.loop.call_at(t_s, TRANSFER_END, self._on_end, (tid, version))

    def _on_end(self, now_s: float, arg: tuple[int, int]) -> None:
        self.on_wake(now_s, arg[0], arg[1])

    def _finish(self, end_s: float, tr: Transfer, ok: bool) -> None:
        alone = self.alone_s(tr.src, tr.dst, tr.bytes_total) + tr.extra_s
        rec = TransferRecord(tr.tag, tr.src, tr.dst, tr.start_s, end_s, tr.bytes_total, max(0.0, end_s - tr.start_s - alone), ok)
        self.records.append(rec)
        self.on_done(end_s, tr.tag, rec)

    def link_views(self, pairs: list[tuple[str, int, str, int, float]]) -> tuple[KvLinkView, ...]:
        """The router's view of each (src name, src port, dst name, dst port, extra seconds per
        byte) path now: the bandwidth a transfer started on it alone would get (`min` of the two
        ports' effective bandwidths, slowed by the pair's per-byte staging and conversion when it
        is not direct), the transfers it would share a port with, and whether both ports are up.
        Kept between calls with the same `pairs` (`_LinkViews`): the same tuple while no port
        changed, and a path's same `KvLinkView` while neither of its ports did."""
        lv = self._views
        if lv is None or lv.pairs is not pairs:
            lv = self._views = _LinkViews(pairs, len(self.ports))
        return lv.now(self.ports, self.latency_s)


class _LinkViews:
    """`KvNetwork.link_views` of one list of paths, recomputed only for the paths through a port
    whose effective bandwidth or change count (`Port.changes`) moved since the last call: O(ports)
    comparisons of numbers."""

    __slots__ = ("pairs", "through", "seen_bw", "seen_changes", "views", "out", "lat")

    def __init__(self, pairs: list[tuple[str, int, str, int, float]], n_ports: int) -> None:
        self.pairs = pairs
        self.through: list[list[int]] = [[] for _ in range(n_ports)]
        """Per port, the positions of the paths through it."""
        for k, (_, sp, _, dp, _) in enumerate(pairs):
            self.through[sp].append(k)
            if dp != sp:
                self.through[dp].append(k)
        self.seen_bw: list[float] = [-1.0] * n_ports
        self.seen_changes: list[int] = [-1] * n_ports
        self.views: list[KvLinkView | None] = [None] * len(pairs)
        self.out: tuple[KvLinkView, ...] = ()
        self.lat = -1.0
        """The one-way latency the views carry (all are read again if it changes)."""

    def now(self, ports: list[Port], lat: float) -> tuple[KvLinkView, ...]:
        todo: set[int] = set() if lat == self.lat else set(range(len(self.pairs)))
        self.lat = lat
        seen_bw, seen_changes = self.seen_bw, self.seen_changes
        for x, paths in enumerate(self.through):
            if paths:
                port = ports[x]
                bw = port.effective_bw
                if bw != seen_bw[x] or port.changes != seen_changes[x]:
                    seen_bw[x], seen_changes[x] = bw, port.changes
                    todo.update(paths)
        if not todo:
            return self.out
        views, changed = self.views, False
        for k in todo:
            sn, sp, dn, dp, extra = self.pairs[k]
            ps, pd = ports[sp], ports[dp]
            bw = min(ps.effective_bw, pd.effective_bw)
            if extra > 0 and bw > 0:
                bw = 1.0 / (1.0 / bw + extra)
            active = len(ps.active) + len(pd.active) - _shared(ps.active, pd.active)
            old = views[k]
            if (old is None or old.bandwidth_bytes_per_s != bw or old.active_transfers != active
                    or old.latency_s != lat):  # else the view it would make equals the old one
                views[k] = KvLinkView(sn, dn, bw, lat, active, bw > 0)
                changed = True
        if changed:
            self.out = tuple([v for v in views if v is not None])  # every position is set by the first call
        return self.out


def _shared(a: set[int], b: set[int]) -> int:
    """How many transfers two ports share (those between them), without building the intersection."""
    if len(b) < len(a):
        a, b = b, a
    n = 0
    for tid in a:
        if tid in b:
            n += 1
    return n
