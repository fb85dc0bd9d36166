"""The simulator's event loop: a heap of events keyed `(time_s, priority, seq)`.

Owns ordering and dispatch only. Events are plain data (`@dataclass(slots=True)`); the
components that react to them (fleet, network, faults, arrivals) register handlers with
`EventLoop.on(kind, handler)`. The loop never reads the wall clock.

Tie-break at equal times is explicit (`Priority`): faults take effect first, then work that
frees resources (step ends, transfer ends), then view refreshes and routing, then arrivals, and
last the "kick" that lets an idle engine schedule, so that every request added at one instant
joins the same step. Within one priority, the insertion order (`seq`) decides: FIFO.

The queue is `engine.heap`'s binary heap of `_Entry` records keyed by the time, tied by
`priority << SEQ_BITS | seq`: the same events in the same order as `heapq` over `(time_s,
priority, seq, ...)` tuples, without comparing tuples item by item (docs/simulator.md, "Long
outputs: per-event cost"). In front of the heap sits one slot, `_first`, holding an entry that
pops before every entry of the heap: an event scheduled to come next (a replica's next step
ending before anything else happens, a kick due now) waits there and is taken without a sift
through the heap; one scheduled earlier still moves it into the heap. The pops are the same, in
the same order: every key is unique, so the order is the one total order of `(key, tie)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final, cast

from mypy_extensions import mypyc_attr

from fleetwise.engine.clock import ORDER_ARRIVAL, ORDER_KICK, ORDER_STEP_END
from fleetwise.engine.heap import Keyed, before, pop, push


class Priority(IntEnum):
    """Order of events that fall at the same virtual time (lower runs first)."""

    FAULT = 0
    """Fault starts and ends: a crash at t removes the replica before anything else at t."""
    STEP_END = ORDER_STEP_END
    """An engine step completes: tokens, finishes, hand-offs."""
    TRANSFER_END = 2
    """A KV transfer finishes (or a transfer's rate changes)."""
    REFRESH = 3
    """The router's delayed fleet view is refreshed (snapshots taken after completions)."""
    ROUTE = 4
    """A batch of arrivals is routed (delayed-feedback mode)."""
    ARRIVAL = ORDER_ARRIVAL
    """A request reaches the router or its engine."""
    KICK = ORDER_KICK
    """An idle engine with new work schedules its next step."""
    SAMPLE = 7
    """Periodic metric sampling (queue lengths over time)."""


@mypyc_attr(allow_interpreted_subclasses=True)  # components outside this module define their own
@dataclass(slots=True)
class Event:
    """Base of all events: plain data, no behaviour."""


@dataclass(slots=True, init=False)
class Arrival(Event):
    """A request reaching the router (one per request: its own `__init__`, as a compiled
    dataclass's generated one runs interpreted; core/views.py)."""

    index: int
    """Position in the request list."""

    def __init__(self, index: int) -> None:
        self.index = index


class RoutedArrival(Event):
    """A request already routed (delayed-feedback mode) reaching its engine (one per request: a
    plain class with its own `__init__`, as compiled a dataclass's runs interpreted)."""

    __slots__ = ("index", "engine", "prefill_engine")

    def __init__(self, index: int, engine: int, prefill_engine: int) -> None:
        self.index = index
        self.engine = engine
        self.prefill_engine = prefill_engine


@dataclass(slots=True)
class RouteTick(Event):
    """Refresh the view and route all arrivals up to the next tick."""


@dataclass(slots=True)
class FaultEvent(Event):
    fault: int
    """Index into the fault scenario."""
    phase: str
    """What happens now: `start`, `end`, `restart`, `upgrade_next`, ..."""
    target: int = -1


@dataclass(slots=True)
class Sample(Event):
    pass


Handler = Callable[[float, Any], None]

SEQ_BITS: Final = 48
"""Low bits of an entry's tie holding its insertion number (2^48 events: never reached)."""


class _Entry(Keyed):
    """One scheduled callback: `fn(key, ev)` at time `key`; `tie` = priority << SEQ_BITS | seq."""

    __slots__ = ("fn", "ev")

    def __init__(self, t: float, tie: int, fn: Handler, ev: Any) -> None:
        self.key = t
        self.tie = tie
        self.fn = fn
        self.ev = ev


class EventLoop:
    """A min-heap of `(time_s, priority, seq)`-keyed callbacks; `run()` pops and calls each handler.

    Also the simulator's `Clock` (`fleetwise.engine.clock`): `call_at` schedules a callback
    directly, with the engine's tie orders (`ORDER_STEP_END`, `ORDER_KICK`) as priorities.
    """

    __slots__ = ("time_s", "_heap", "_first", "_seq", "_handlers", "processed")

    def __init__(self) -> None:
        self.time_s = 0.0
        """Virtual time of the event being (or last) processed."""
        self._heap: list[Keyed] = []
        self._first: _Entry | None = None
        """An entry that pops before every entry of `_heap` (None: the heap's top is next)."""
        self._seq = 0
        self._handlers: dict[type, Handler] = {}
        self.processed = 0

    def now_s(self) -> float:
        """Current virtual time in seconds (the `Clock` protocol)."""
        return self.time_s

    def on(self, kind: type[Event], handler: Handler) -> None:
        """Register the one handler of an event type (a second registration is a bug); register
        before pushing events of that type."""
        if kind in self._handlers:
            raise ValueError(f"handler for {kind.__name__} already registered")
        self._handlers[kind] = handler

    def push(self, time_s: float, priority: Priority, event: Event) -> None:
        """Schedule `event` at `time_s` for its type's handler; never in the past."""
        if time_s < self.time_s:
            time_s = self.time_s
        self._seq += 1
        self._add(_Entry(time_s, int(priority) << SEQ_BITS | self._seq, self._handlers[type(event)], event))

    def call_at(self, time_s: float, order: int, fn: Handler, arg: Any = None) -> None:
        """Run `fn(time_s, arg)` at `time_s` (never in the past), ordered like an event of priority `order`."""
        if time_s < self.time_s:
            time_s = self.time_s
        self._seq += 1
        self._add(_Entry(time_s, order << SEQ_BITS | self._seq, fn, arg))

    def _add(self, e: _Entry) -> None:
        """Queue `e`: in the `_first` slot when it pops before everything queued, else in the heap."""
        first, heap = self._first, self._heap
        if first is None:
            if heap and not before(e, heap[0]):
                push(heap, e)
            else:
                self._first = e
        elif before(e, first):
            push(heap, first)
            self._first = e
        else:
            push(heap, e)

    def _take(self) -> _Entry:
        """Remove and return the next entry (the queue is not empty)."""
        e = self._first
        if e is not None:
            self._first = None
            return e
        return cast(_Entry, pop(self._heap))

    def __len__(self) -> int:
        return len(self._heap) + (self._first is not None)

    def peek_time(self) -> float:
        if self._first is not None:
            return self._first.key
        return self._heap[0].key if self._heap else float("inf")

    def run(self, until_s: float = float("inf"), on_progress: Callable[[float], None] | None = None) -> None:
        """Process events in key order until the heap is empty or the next event is after `until_s`."""
        heap = self._heap
        n = 0
        if on_progress is None and until_s == float("inf"):  # the common case: nothing to check
            while self._first is not None or heap:
                e = self._take()
                t = e.key
                self.time_s = t
                e.fn(t, e.ev)
                n += 1
            self.processed += n
            return
        while self._first is not None or heap:
            if self.peek_time() > until_s:
                break
            e = self._take()
            t = e.key
            self.time_s = t
            e.fn(t, e.ev)
            n += 1
            if on_progress is not None and not n & 0xFFFF:
                on_progress(t)
        self.processed += n
