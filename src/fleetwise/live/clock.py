"""`AsyncioClock`: the engine driver's clock in wall time, on the running asyncio loop.

Keeps its own heap of `(time_s, order, seq, fn, arg)`, like the simulator's event loop, and one
asyncio timer armed for the earliest deadline. When it fires, every callback due by the wall
clock runs in heap order, including callbacks those add that are already due: a late wake-up
changes when callbacks run, never their order or the times they are given (each gets its
scheduled time). So a driver on this clock takes the same steps as on the simulator's loop.

Clock seconds are wall seconds since the clock was created, divided by `time_scale` (1.0 =
real time; 0.01 runs a hundred times faster, for tests).
"""

from __future__ import annotations

import asyncio
import heapq
from typing import Any

from fleetwise.engine.clock import Callback

__all__ = ["AsyncioClock"]


class AsyncioClock:
    """A `Clock` on the running asyncio loop; see the module docstring."""

    def __init__(self, time_scale: float = 1.0) -> None:
        """Start at 0 s now, on the running loop; `time_scale` wall seconds per clock second."""
        if not time_scale > 0:
            raise ValueError(f"time_scale={time_scale} must be > 0")
        self.time_scale = time_scale
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._heap: list[tuple[float, int, int, Callback, Any]] = []
        self._seq = 0
        self._time_s = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._armed_s = float("inf")
        self._idle: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self.processed = 0
        """Callbacks run so far."""

    def now_s(self) -> float:
        """Seconds since the clock started (wall time divided by `time_scale`)."""
        return (self._loop.time() - self._t0) / self.time_scale

    def call_at(self, time_s: float, order: int, fn: Callback, arg: Any = None) -> None:
        """Run `fn(time_s, arg)` at absolute `time_s` (never before the last callback's time);
        ties by `order`, then FIFO."""
        if time_s < self._time_s:
            time_s = self._time_s
        self._seq += 1
        heapq.heappush(self._heap, (time_s, order, self._seq, fn, arg))
        if time_s < self._armed_s:
            self._arm(time_s)

    def __len__(self) -> int:
        return len(self._heap)

    def _arm(self, time_s: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_s = time_s
        self._timer = self._loop.call_at(self._t0 + time_s * self.time_scale, self._wake)

    def _wake(self) -> None:
        self._timer, self._armed_s = None, float("inf")
        heap = self._heap
        try:
            while heap and heap[0][0] <= self.now_s():
                t, _, _, fn, arg = heapq.heappop(heap)
                self._time_s = t
                fn(t, arg)
                self.processed += 1
        except BaseException as err:  # a driver bug: stop, and report it to whoever waits
            self._error = err
            heap.clear()
        if heap:
            self._arm(heap[0][0])
        elif self._idle is not None and not self._idle.done():
            if self._error is not None:
                self._idle.set_exception(self._error)
            else:
                self._idle.set_result(None)

    async def run_until_idle(self, timeout_s: float | None = None) -> None:
        """Wait (at most `timeout_s` wall seconds) until no callback is pending; re-raises a
        callback's exception."""
        if self._error is not None:
            raise self._error
        if not self._heap:
            return
        self._idle = self._loop.create_future()
        await asyncio.wait_for(self._idle, timeout_s)
