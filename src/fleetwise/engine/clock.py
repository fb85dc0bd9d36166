"""`Clock`: what an `EngineDriver` needs of time, so one driver runs in virtual or wall time.

Two methods: `now_s()` and `call_at(time_s, order, fn, arg)`, which runs `fn(time_s, arg)` once
the clock reaches `time_s` (absolute seconds on the clock's own scale). Callbacks due at equal
times run by `order` (lower first), then in the order they were scheduled; a callback receives
the time it was scheduled for, not the (possibly later) moment it ran, so a late wake-up never
shifts the steps after it. The simulator's `EventLoop` is one clock (virtual time);
`fleetwise.live.AsyncioClock` is the other (sleeps to absolute deadlines of the wall clock).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["ORDER_ARRIVAL", "ORDER_KICK", "ORDER_STEP_END", "Callback", "Clock"]

ORDER_STEP_END = 1
"""Tie order of a step's end: completions free resources before routing and arrivals at the same time."""
ORDER_ARRIVAL = 5
"""Tie order of a request reaching its engine: after the step that ends at the same time, so it
joins the next step, never one that started before it arrived."""
ORDER_KICK = 6
"""Tie order of a kick (an idle engine schedules): after every arrival at the same time, so all join one step."""

Callback = Callable[[float, Any], None]
"""`fn(time_s, arg)`: called at the absolute time it was scheduled for."""


class Clock(Protocol):
    """A source of time and deadlines; see the module docstring."""

    def now_s(self) -> float:
        """Current time in seconds on this clock."""
        ...

    def call_at(self, time_s: float, order: int, fn: Callback, arg: Any = None) -> None:
        """Run `fn(time_s, arg)` at absolute `time_s` (seconds); ties by `order`, then FIFO."""
        ...
