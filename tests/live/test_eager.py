"""`start_now`: the same results, exceptions and cancellations as `asyncio.ensure_future` (the
reference), with the part before the first suspension run inside the caller."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from fleetwise.live.eager import start_now


async def _no_wait(log: list[str]) -> int:
    log.append("ran")
    return 7


async def _waits(log: list[str], gate: asyncio.Future[int]) -> int:
    log.append("before")
    got = await gate
    log.append("after")
    await asyncio.sleep(0)
    return got + 1


async def _fails_then(log: list[str], gate: asyncio.Future[int] | None) -> int:
    log.append("before")
    if gate is not None:
        await gate
    raise ValueError("boom")


async def _catches_cancel(log: list[str], gate: asyncio.Future[int]) -> str:
    try:
        await gate
    except asyncio.CancelledError:
        log.append("cancelled")
        raise
    return "unreachable"


def _both(make: Callable[[list[str]], Coroutine[Any, Any, Any]]) -> None:
    """Run `make(log)` by `start_now` and by `ensure_future`; the same log and outcome."""

    async def run(start: Callable[[Coroutine[Any, Any, Any]], asyncio.Future[Any]]) -> tuple[list[str], Any]:
        log: list[str] = []
        fut = start(make(log))
        log.append("returned")
        try:
            out: Any = await fut
        except (ValueError, asyncio.CancelledError) as err:
            out = type(err).__name__
        return log, out

    now_log, now_out = asyncio.run(run(start_now))
    ref_log, ref_out = asyncio.run(run(asyncio.ensure_future))
    assert now_out == ref_out
    # Identical but for where "returned" falls: after the part before the first suspension
    # with start_now, before any of the coroutine with the reference.
    assert [x for x in now_log if x != "returned"] == [x for x in ref_log if x != "returned"]
    assert ref_log[0] == "returned"


def test_a_coroutine_that_never_waits_is_done_on_return():
    async def main() -> None:
        log: list[str] = []
        fut = start_now(_no_wait(log))
        assert fut.done() and fut.result() == 7 and log == ["ran"]

    asyncio.run(main())
    _both(_no_wait)


def test_a_coroutine_that_waits_runs_its_first_part_now_and_the_rest_in_a_task():
    async def main() -> None:
        log: list[str] = []
        gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        fut = start_now(_waits(log, gate))
        assert log == ["before"] and not fut.done()
        gate.set_result(41)
        assert await fut == 42 and log == ["before", "after"]

    asyncio.run(main())

    def make(log: list[str]) -> Coroutine[Any, Any, int]:
        gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(gate.set_result, 1)
        return _waits(log, gate)

    _both(make)


@pytest.mark.parametrize("wait", [False, True])
def test_exceptions_reach_the_future(wait: bool):
    def make(log: list[str]) -> Coroutine[Any, Any, int]:
        gate: asyncio.Future[int] | None = None
        if wait:
            gate = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(gate.set_result, 1)
        return _fails_then(log, gate)

    _both(make)


def test_a_cancelled_future_cancels_the_rest_of_the_coroutine():
    async def main(start: Callable[[Coroutine[Any, Any, Any]], asyncio.Future[Any]]) -> list[str]:
        log: list[str] = []
        gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        fut = start(_catches_cancel(log, gate))
        await asyncio.sleep(0)
        fut.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fut
        return log

    assert asyncio.run(main(start_now)) == asyncio.run(main(asyncio.ensure_future)) == ["cancelled"]
