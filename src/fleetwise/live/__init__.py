"""L4 (beside `sim`): what live drivers share — the wall-clock side of the engine driver.

Owns `AsyncioClock`, the `fleetwise.engine.clock.Clock` that sleeps to absolute deadlines on
the running asyncio loop (woken by a Linux timerfd to the nanosecond, `PreciseTimer`, where
the loop's own timers round to whole milliseconds, and woken early by the learned wake-up
lateness, `WakeMargin`, to spin the rest of the way), so the emulator and the gateway drive the
same `EngineDriver` and the same policies as the simulator; and serving an ASGI app over HTTP
(`http`: uvicorn with the connection limits and timeouts both servers need); and a server
process that stops when the supervisor that started it dies (`process`). Never imports `sim`.
"""

from fleetwise.live.clock import AsyncioClock

__all__ = ["AsyncioClock"]
