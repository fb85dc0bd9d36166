"""`start_now(coro)`: run a coroutine at once, inside the caller, up to its first real suspension.

asyncio (before Python 3.12's eager tasks) starts a task's coroutine on a later turn of the
loop. A replica's step end wants some work done inside the step end itself, before the driver
schedules the next step: a prefill answer written to its socket. `start_now` steps the coroutine
right away; if it completes without waiting on anything (an ASGI `send` to a socket that takes
the bytes), it is done then; if it waits on a future, a task takes over from that future and
the rest runs as `asyncio.ensure_future(coro)` would have run it (the reference). Either way
the returned future holds its result or exception.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["start_now"]

T = TypeVar("T")


@types.coroutine
def _resume(coro: Coroutine[Any, Any, T], pending: Any) -> Generator[Any, Any, T]:
    """Continue `coro`, which has just yielded `pending` (the future it waits on), as a task would."""
    try:
        yield pending  # the task waits on the same future `coro` waits on
    except BaseException as err:  # noqa: BLE001 - a cancellation reaches `coro` like any throw
        return (yield from _throw(coro, err))
    return (yield from coro)


@types.coroutine
def _throw(coro: Coroutine[Any, Any, T], err: BaseException) -> Generator[Any, Any, T]:
    try:
        pending = coro.throw(err)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    return (yield from _resume(coro, pending))


async def _continue(coro: Coroutine[Any, Any, T], pending: Any) -> T:
    return await _resume(coro, pending)


def start_now(coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """Run `coro` now up to its first suspension (inside a running loop); the rest in a task.
    Returns a future of its result, done already when `coro` never waited."""
    loop = asyncio.get_running_loop()
    try:
        pending = coro.send(None)
    except StopIteration as stop:
        done: asyncio.Future[T] = loop.create_future()
        done.set_result(stop.value)
        return done
    except Exception as err:  # the future carries it, as a task's would
        failed: asyncio.Future[T] = loop.create_future()
        failed.set_exception(err)
        return failed
    return asyncio.ensure_future(_continue(coro, pending))
