"""`AsyncioClock`: the engine driver's clock in wall time, on the running asyncio loop.

Keeps its own heap of `(time_s, order, seq, fn, arg)`, like the simulator's event loop, and one
wake-up armed for the earliest deadline. When it fires, every callback due by the wall clock
runs in heap order, including callbacks those add that are already due: a late wake-up changes
when callbacks run, never their order or the times they are given (each gets its scheduled
time). So a driver on this clock takes the same steps as on the simulator's loop.

Clock seconds are wall seconds since the clock was created, divided by `time_scale` (1.0 =
real time; 0.01 runs a hundred times faster, for tests), read from `time.monotonic()` (ns
resolution; uvloop's `loop.time()` counts whole milliseconds).

Wake-ups: an asyncio timer (`loop.call_at`) fires up to a whole millisecond late, because the
loop's poller (epoll, or libuv under uvloop) takes its timeout in whole milliseconds, rounded
up; at a time scale of 5 that is up to 5 modelled ms on every step. So on Linux the clock arms
a `timerfd` (`PreciseTimer`) at the deadline's absolute monotonic nanosecond and the loop
watches it like a socket: the kernel wakes the poller when it expires, with no rounding, no
busy wait and no thread. Where the platform has no timerfd (not Linux), or after `close()`,
it falls back to `loop.call_at`, which runs the same callbacks in the same order with the same
times, later (tested).

Early wake and spin: a kernel wake-up is late by the time the machine takes to put a sleeping
core back to work, and on a virtual machine that time grows with how long the process slept
(here: 0.06 ms p50 / 0.2 ms p90 after 4.5 ms, 0.4 / 0.76 ms after 50 ms; `tests/live`
measures it), which the time scale multiplies into modelled time. With `spin=True` (the
default) the timerfd is armed early by the recent 90th percentile of that lateness, learned
per sleep length (`WakeMargin`), and the clock spins the rest of the way to the deadline.
The margin never exceeds `SPIN_SHARE` of the sleep nor `SPIN_MAX_S`, which bounds the CPU
spent spinning; on a quiet bare-metal host it learns margins of tens of microseconds.

`hold()` / `release()`: while any hold is in place no callback runs (the clock's time stays
where it is; deadlines that pass meanwhile run, in order, at release). A replica holds its
clock while it waits on a message that decides what happens at the current time (a KV pull's
answer) so the model never moves past a moment it has not heard about yet.
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from fleetwise.engine.clock import Callback

__all__ = ["AsyncioClock", "PreciseTimer"]

CLOCK_MONOTONIC = 1
"""Linux clockid of CLOCK_MONOTONIC (<linux/time.h>), the clock of `time.monotonic()`."""
TFD_NONBLOCK, TFD_CLOEXEC, TFD_TIMER_ABSTIME = 0o4000, 0o2000000, 1
"""timerfd_create(2) / timerfd_settime(2) flags (<sys/timerfd.h> on Linux)."""
NS = 1_000_000_000
SPIN_SHARE = 0.05
"""At most this share of a sleep is spent spinning before its deadline (bounds the CPU cost)."""
SPIN_MAX_S = 0.002
"""Longest spin before one deadline, wall seconds (twice the worst p90 lateness measured above)."""
MARGIN_QUANTILE = 0.9
"""The wake-up lateness quantile each margin tracks."""
MARGIN_STEP_S = 25e-6
"""Step of the quantile tracker, wall seconds: a margin moves at most this much per wake-up."""
MARGIN_BUCKETS = 12
"""Sleep lengths are bucketed by powers of two from `MARGIN_BUCKET0_S` (the last bucket takes the rest)."""
MARGIN_BUCKET0_S = 0.0005


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                         ctypes.POINTER(_Itimerspec)]
        libc.timerfd_gettime.argtypes = [ctypes.c_int, ctypes.POINTER(_Itimerspec)]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


class PreciseTimer:
    """A one-shot Linux timerfd on CLOCK_MONOTONIC, watched by the running loop: `arm(t)` calls
    `fn()` once `time.monotonic()` reaches `t` (seconds), to the kernel's precision."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
        """A disarmed timer on `loop` (OSError/NotImplementedError where timerfd is missing)."""
        if _LIBC is None:
            raise NotImplementedError("timerfd needs Linux")
        fd = _LIBC.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.fd, self._loop, self._fn = fd, loop, fn
        self._spec = _Itimerspec()
        try:
            loop.add_reader(fd, self._fire)
        except BaseException:
            os.close(fd)
            raise

    def arm(self, monotonic_s: float) -> None:
        """Fire at `monotonic_s` (at once if it has passed); replaces any earlier arming."""
        ns = max(int(monotonic_s * NS), 1)  # 0 would disarm
        v = self._spec.it_value
        v.tv_sec, v.tv_nsec = divmod(ns, NS)
        if _LIBC.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def remaining_s(self) -> float:
        """Seconds until the armed expiry (0.0 when disarmed), as the kernel holds it."""
        cur = _Itimerspec()
        _LIBC.timerfd_gettime(self.fd, ctypes.byref(cur))
        return cur.it_value.tv_sec + cur.it_value.tv_nsec / NS

    def _fire(self) -> None:
        try:
            os.read(self.fd, 8)  # the expiry count; reading it clears the readiness
        except BlockingIOError:
            return  # re-armed after it expired: nothing due
        self._fn()

    def close(self) -> None:
        """Stop watching and free the descriptor."""
        if self.fd >= 0:
            if not self._loop.is_closed():
                self._loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1


class WakeMargin:
    """How early to arm a wake-up: a running `MARGIN_QUANTILE` estimate of the kernel's
    lateness, per sleep length bucket (stochastic quantile tracking with step `MARGIN_STEP_S`)."""

    def __init__(self) -> None:
        """No lateness seen: every margin starts at 0."""
        self.est = [0.0] * MARGIN_BUCKETS

    @staticmethod
    def bucket(sleep_s: float) -> int:
        """The bucket of a sleep of `sleep_s` wall seconds."""
        b, edge = 0, MARGIN_BUCKET0_S
        while sleep_s > edge and b < MARGIN_BUCKETS - 1:
            b += 1
            edge *= 2.0
        return b

    def margin(self, sleep_s: float) -> float:
        """Wall seconds to wake ahead of a deadline `sleep_s` away."""
        m = self.est[self.bucket(sleep_s)]
        cap = SPIN_SHARE * sleep_s
        if cap > SPIN_MAX_S:
            cap = SPIN_MAX_S
        return m if m < cap else cap

    def observe(self, sleep_s: float, late_s: float) -> None:
        """A wake-up armed `sleep_s` ahead came `late_s` wall seconds after its armed time."""
        b = self.bucket(sleep_s)
        if late_s > self.est[b]:
            self.est[b] += MARGIN_STEP_S * MARGIN_QUANTILE
        else:
            e = self.est[b] - MARGIN_STEP_S * (1.0 - MARGIN_QUANTILE)
            self.est[b] = e if e > 0.0 else 0.0


class AsyncioClock:
    """A `Clock` on the running asyncio loop; see the module docstring."""

    def __init__(self, time_scale: float = 1.0, spin: bool = True) -> None:
        """Start at 0 s now, on the running loop; `time_scale` wall seconds per clock second;
        `spin`: wake early and spin to the deadline (see the module docstring). Wake-ups use a
        timerfd where the platform has one, else `loop.call_at`."""
        if not time_scale > 0:
            raise ValueError(f"time_scale={time_scale} must be > 0")
        self.time_scale = time_scale
        self._loop = asyncio.get_running_loop()
        self._t0 = time.monotonic()
        self._heap: list[tuple[float, int, int, Callback, Any]] = []
        self._seq = 0
        self._time_s = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._precise: PreciseTimer | None = None
        try:
            self._precise = PreciseTimer(self._loop, self._on_timer)
        except (NotImplementedError, OSError):  # no timerfd here: the loop's timers
            self._precise = None
        self._armed_s = float("inf")
        self.margins: WakeMargin | None = WakeMargin() if spin else None
        """Learned wake-up margins (None: no early wake)."""
        self._armed_wall = 0.0
        self._due_wall = 0.0
        self._sleep_s = 0.0
        self.spun_s = 0.0
        """Wall seconds spent spinning to deadlines so far."""
        self._holds = 0
        self._idle: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self.processed = 0
        """Callbacks run so far."""

    @property
    def precise(self) -> bool:
        """Whether deadlines wake on a timerfd (else on the loop's millisecond timers)."""
        return self._precise is not None

    def close(self) -> None:
        """Free the timerfd; the clock goes on with `loop.call_at` wake-ups."""
        if self._precise is not None:
            self._precise.close()
            self._precise = None
            if self._heap and not self._holds:
                self._arm(self._heap[0][0])

    def now_s(self) -> float:
        """Seconds since the clock started (wall time divided by `time_scale`)."""
        return (time.monotonic() - self._t0) / self.time_scale

    def time_of(self, monotonic_s: float) -> float:
        """The clock time of `time.monotonic()` second `monotonic_s` (the inverse of `wall_of`)."""
        return (monotonic_s - self._t0) / self.time_scale

    def wall_of(self, time_s: float) -> float:
        """The `time.monotonic()` second at which clock time `time_s` falls."""
        return self._t0 + time_s * self.time_scale

    def call_at(self, time_s: float, order: int, fn: Callback, arg: Any = None) -> None:
        """Run `fn(time_s, arg)` at absolute `time_s` (never before the last callback's time);
        ties by `order`, then FIFO."""
        if time_s < self._time_s:
            time_s = self._time_s
        self._seq += 1
        heapq.heappush(self._heap, (time_s, order, self._seq, fn, arg))
        if time_s < self._armed_s and not self._holds:
            self._arm(time_s)

    def hold(self) -> None:
        """Run no callback until the matching `release()` (holds nest)."""
        self._holds += 1

    def release(self) -> None:
        """End one `hold()`; with none left, whatever fell due meanwhile runs now, in order."""
        if self._holds <= 0:
            raise RuntimeError("release() without hold()")
        self._holds -= 1
        if not self._holds and self._heap:
            self._arm(self._heap[0][0])

    @property
    def held(self) -> bool:
        """Whether a hold is in place."""
        return self._holds > 0

    def __len__(self) -> int:
        return len(self._heap)

    def _arm(self, time_s: float) -> None:
        self._armed_s = time_s
        if self._precise is not None:
            due = self.wall_of(time_s)
            at = due
            if self.margins is not None:
                sleep = due - time.monotonic()
                if sleep > 0.0:
                    at = due - self.margins.margin(sleep)
                self._sleep_s = sleep
            self._armed_wall, self._due_wall = at, due
            self._precise.arm(at)
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(self._loop.time() + (self.wall_of(time_s) - time.monotonic()), self._wake)

    def _on_timer(self) -> None:
        """The timerfd fired: learn its lateness, spin to the deadline if it woke early, run."""
        margins = self.margins
        if margins is not None:
            now = time.monotonic()
            if self._sleep_s > 0.0:
                margins.observe(self._sleep_s, now - self._armed_wall)
            due = self._due_wall
            if now < due:
                start = now
                while now < due:
                    now = time.monotonic()
                self.spun_s += now - start
        self._wake()

    def _wake(self) -> None:
        self._timer, self._armed_s = None, float("inf")
        if self._holds:
            return  # release() re-arms
        heap = self._heap
        try:
            while heap and not self._holds and heap[0][0] <= self.now_s():
                t, _, _, fn, arg = heapq.heappop(heap)
                self._time_s = t
                fn(t, arg)
                self.processed += 1
        except BaseException as err:  # a driver bug: stop, and report it to whoever waits
            self._error = err
            heap.clear()
        if heap:
            if not self._holds:
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
