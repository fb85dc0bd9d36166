"""`AsyncioClock`: absolute deadlines, the simulator's tie order, scheduled times handed to
callbacks even when they run late, and errors surfaced to whoever waits."""

from __future__ import annotations

import asyncio
import time

import pytest

from fleetwise.live import AsyncioClock

WALL_TIMEOUT_S = 10.0


def test_callbacks_run_in_time_then_order_then_fifo_with_their_scheduled_times():
    seen: list[tuple[float, str]] = []

    async def main() -> None:
        clock = AsyncioClock(time_scale=0.01)
        note = lambda t, tag: seen.append((t, tag))  # noqa: E731
        clock.call_at(0.5, 6, note, "kick")
        clock.call_at(0.5, 5, note, "arrival-a")
        clock.call_at(0.5, 1, note, "step")
        clock.call_at(0.5, 5, note, "arrival-b")
        clock.call_at(0.2, 7, note, "earlier")
        # a callback that schedules another one already due: it runs before later deadlines
        clock.call_at(0.3, 5, lambda t, _: (seen.append((t, "chain")), clock.call_at(t, 6, note, "chained")), None)
        await clock.run_until_idle(WALL_TIMEOUT_S)

    asyncio.run(main())
    assert seen == [(0.2, "earlier"), (0.3, "chain"), (0.3, "chained"), (0.5, "step"), (0.5, "arrival-a"),
                    (0.5, "arrival-b"), (0.5, "kick")]


def test_a_late_wake_keeps_order_and_scheduled_times_and_deadlines_are_absolute():
    seen: list[float] = []

    async def main() -> None:
        clock = AsyncioClock(time_scale=1.0)
        for k in range(5):
            clock.call_at(0.01 * k, 0, lambda t, _: seen.append(t))
        time.sleep(0.06)  # block the loop: every deadline is already past when it wakes
        start = clock.now_s()
        await clock.run_until_idle(WALL_TIMEOUT_S)
        assert start >= 0.06
        clock.call_at(clock.now_s() + 0.05, 0, lambda t, _: seen.append(t))
        before = clock.now_s()
        await clock.run_until_idle(WALL_TIMEOUT_S)
        assert clock.now_s() - before >= 0.045

    asyncio.run(main())
    assert seen[:5] == [0.0, 0.01, 0.02, 0.03, 0.04] and len(seen) == 6


def test_a_failing_callback_stops_the_clock_and_is_raised_to_the_waiter():
    async def main() -> None:
        clock = AsyncioClock(time_scale=0.01)

        def boom(t: float, _: object) -> None:
            raise RuntimeError("driver bug")

        clock.call_at(0.1, 0, boom)
        clock.call_at(0.2, 0, lambda t, _: None)
        with pytest.raises(RuntimeError, match="driver bug"):
            await clock.run_until_idle(WALL_TIMEOUT_S)
        assert len(clock) == 0

    asyncio.run(main())


def test_time_scale_must_be_positive():
    async def main() -> None:
        with pytest.raises(ValueError, match="time_scale=0"):
            AsyncioClock(time_scale=0)

    asyncio.run(main())
