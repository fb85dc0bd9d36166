"""`EngineDriver`: runs one `Engine` on a `Clock` (virtual time in the simulator, wall time live).

Owns the step loop every driver shares: `kick` (an idle engine schedules after everything due
now), `schedule` -> wait `Step.duration_s` -> `complete` -> report the `StepOutput` ->
schedule again, `cut` (work reached the engine in the middle of a fused step: the step now ends
with the pass running), `stop` (a crash: the step in flight is discarded), slowdowns (a factor
on every step time), horizons and the router's view of the engine (`view`). It does not own
request lifecycles, routing or faults: the simulator and the live servers do, through the
`on_output(driver, now_s, step_start_s, output)` callback and the methods below.

Step time = the bound perf model's `step_time_s(shape)` times `slowdown` (1.0, or a fault's
factor; setting it rebinds the engine's step-time functions, so an unslowed engine calls the
perf model directly). A crash or a `cut` bumps `epoch`, so the step end scheduled for the old
step is ignored.

Horizons (`HorizonFn` -> `(hard_s, soft_s)`, seconds from now): a fused step never crosses the
hard one and may run the pass that straddles the soft one (see `Engine.schedule`). A view of an
engine in a fused step shows the state single passes would have then (`Engine.snapshot(now,
elapsed)`), cached until the next pass boundary, as between single passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from fleetwise.core.views import Role, WorkerView
from fleetwise.engine.bundle import BatchTimeFn, DecodeTimeFn
from fleetwise.engine.clock import ORDER_KICK, ORDER_STEP_END, Clock
from fleetwise.engine.records import Step, StepOutput
from fleetwise.engine.scheduler import Engine
from fleetwise.perf.roofline import BoundPerf
from fleetwise.perf.types import BatchShape
from fleetwise.spec.kv_format import KvFormat

__all__ = ["DOWN", "DRAINING", "UP", "EngineDriver", "HorizonFn", "OutputFn", "no_horizon", "step_time_fns"]

UP: Final = 0
"""Serving state of a driven engine: takes new work."""
DRAINING: Final = 1
"""Finishes what it holds, takes nothing new."""
DOWN: Final = 2
"""Stopped."""

OutputFn = Callable[["EngineDriver", float, float, StepOutput], None]
"""`on_output(driver, now_s, step_start_s, output)`: a step completed at `now_s`."""
HorizonFn = Callable[["EngineDriver", float], tuple[float, float]]
"""`horizon(driver, now_s) -> (hard_s, soft_s)`: how long (seconds from now) a fused step may run."""


def no_horizon(driver: EngineDriver, now_s: float) -> tuple[float, float]:
    """No known future work: fused steps are bounded only by the engine's own caps."""
    return math.inf, math.inf


class EngineDriver:
    """One engine, its clock and its step loop; see the module docstring."""

    __slots__ = ("name", "role", "engine", "clock", "on_output", "horizon", "perf", "_slowdown", "state",
                 "epoch", "busy", "kick_pending", "step_start_s", "step_dur_s", "step_passes", "step", "busy_s",
                 "view_cache", "view_pass", "pool_name", "accelerator", "model_version", "region",
                 "kv_capacity_tokens", "kv_format", "stalled", "_step_end_fn", "_kick_fn", "view_max_age_s")

    def __init__(self, engine: Engine, clock: Clock, on_output: OutputFn, horizon: HorizonFn = no_horizon,
                 perf: BoundPerf | None = None, *, pool_name: str = "default", accelerator: str = "",
                 model_version: str = "v1", region: str = "default", kv_capacity_tokens: int | None = None,
                 kv_format: KvFormat | None = None) -> None:
        """Drive `engine` on `clock`; `perf`, when given, is what `slowdown` rescales. The keyword
        arguments are the identity the router's `view` shows (capacity in tokens; default: the
        engine's blocks times the block size)."""
        self.name: str = engine.name
        self.role: Role = engine.role
        self.engine, self.clock, self.on_output, self.horizon = engine, clock, on_output, horizon
        self.perf = perf
        self._slowdown = 1.0
        self.state = UP
        self.stalled = False
        """Steps no more (a hang fault) while it still takes work and shows healthy; `kick` after clearing it."""
        self.epoch = 0
        self.busy = False
        self.kick_pending = False
        self.step_start_s = 0.0
        self.step_dur_s = 0.0
        self.step_passes = 1
        """Passes of the step in flight (> 1: fused)."""
        self.step: Step | None = None
        """The step in flight as scheduled (a `cut` shortens it in the engine, not here)."""
        self.busy_s = 0.0
        """Seconds spent running steps (a stopped step counts up to the stop)."""
        self.view_cache: WorkerView | None = None
        self.view_pass = 0
        """Passes of the fused step in flight that had ended when `view_cache` was taken."""
        self.view_max_age_s = math.inf
        """An unchanged cached view older than this (seconds) is re-dated to the time it is asked
        for: the engine was observed then, so a router's safe mode must not read it as stale (the
        simulator sets the policy's `stale_after_s`; an idle replica's view would age forever)."""
        self.pool_name, self.accelerator, self.model_version, self.region = pool_name, accelerator, model_version, region
        self.kv_capacity_tokens = (kv_capacity_tokens if kv_capacity_tokens is not None
                                   else engine.pool.capacity * engine.config.block_size)
        self.kv_format = kv_format
        """The KV format the view declares (its model version follows `model_version`)."""
        self._step_end_fn: Callable[[float, Any], None] = self._on_step_end
        self._kick_fn: Callable[[float, Any], None] = self._on_kick
        """The clock's callbacks, bound once (not a new bound method per step)."""

    # ---- slowdown ------------------------------------------------------------------------------
    @property
    def slowdown(self) -> float:
        """Factor on every step time (1.0, or a fault's); setting it rebinds the engine's step-time
        functions, so an unslowed engine calls the perf model directly."""
        return self._slowdown

    @slowdown.setter
    def slowdown(self, factor: float) -> None:
        self._slowdown = factor
        if self.perf is not None:
            self.engine.step_time, self.engine.decode_time, self.engine.batch_time = step_time_fns(self.perf, factor)

    @property
    def available(self) -> bool:
        """Takes new work now (state UP)."""
        return self.state == UP

    # ---- stepping ------------------------------------------------------------------------------
    def kick(self, now_s: float) -> None:
        """New work or freed resources at `now_s`: an idle engine schedules after everything else due then."""
        self.view_cache = None
        if not self.busy and not self.kick_pending and self.state != DOWN:
            self.kick_pending = True
            self.clock.call_at(now_s, ORDER_KICK, self._kick_fn, None)

    def _on_kick(self, now_s: float, _: Any) -> None:
        self.kick_pending = False
        self._schedule(now_s)

    def _schedule(self, now_s: float) -> None:
        if self.busy or self.state == DOWN or self.stalled or not self.engine.has_work:
            return  # (an engine with no work schedules nothing: no horizon to ask for)
        hard, soft = self.horizon(self, now_s)
        step = self.engine.schedule(hard if hard > 0.0 else 0.0, soft if soft > 0.0 else 0.0)
        if step is None:
            return
        self.busy = True
        self.step = step
        self.step_start_s = now_s
        self.step_dur_s = step.duration_s
        self.step_passes = step.num_passes
        self.clock.call_at(now_s + step.duration_s, ORDER_STEP_END, self._step_end_fn, self.epoch)

    def cut(self, now_s: float) -> None:
        """Work reached the engine at `now_s`: a fused step in flight ends with the pass running now."""
        if not self.busy or self.step_passes <= 1:
            return
        dur = self.engine.cut(now_s - self.step_start_s)
        if dur is None:
            return
        self.epoch += 1
        self.step_dur_s = dur
        self.clock.call_at(self.step_start_s + dur, ORDER_STEP_END, self._step_end_fn, self.epoch)

    def _on_step_end(self, now_s: float, epoch: int) -> None:
        if epoch != self.epoch:
            return
        out = self.engine.complete()
        self.busy = False
        self.view_cache = None
        self.busy_s += self.step_dur_s
        self.on_output(self, now_s, self.step_start_s, out)
        self._schedule(now_s)

    def stop(self, now_s: float) -> None:
        """Discard the step in flight (a crash): its end is ignored; busy time counts up to `now_s`."""
        if self.busy:
            self.busy_s += now_s - self.step_start_s
        self.busy = False
        self.epoch += 1
        self.view_cache = None

    def step_end_s(self) -> float:
        """When the step in flight ends (seconds on the clock); inf when idle."""
        return self.step_start_s + self.step_dur_s if self.busy else math.inf

    # ---- the router's view ---------------------------------------------------------------------
    def view(self, now_s: float) -> WorkerView:
        """The engine as a router sees it at `now_s` (cached until the engine changes)."""
        v = self.view_cache
        elapsed = j = None
        if self.busy and self.step_passes > 1:
            elapsed = now_s - self.step_start_s
            j = self.engine.passes_done(elapsed)
            if v is not None and self.view_pass == j:
                return self._dated(v, now_s)
            self.view_pass = j
            v = None
        elif v is None:
            self.view_pass = 0
        if v is None:
            v = self.view_cache = self.engine.snapshot(
                now_s, elapsed, j, pool=self.pool_name, accelerator=self.accelerator,
                model_version=self.model_version, region=self.region, healthy=self.state == UP,
                kv_capacity_tokens=self.kv_capacity_tokens, kv_format=self.kv_format)
            return v
        return self._dated(v, now_s)

    def _dated(self, v: WorkerView, now_s: float) -> WorkerView:
        """The cached view `v`, re-dated `now_s` (and cached) when older than `view_max_age_s`."""
        if now_s - v.reported_at_s > self.view_max_age_s:
            v = self.view_cache = replace(v, reported_at_s=now_s)
        return v

    def kv_usage_now(self, now_s: float) -> float:
        """KV usage at `now_s` as single passes would show it (a fused step counts passes ended)."""
        e = self.engine
        return e.kv_usage_at(now_s - self.step_start_s) if self.busy else e.kv_usage


def step_time_fns(bound: BoundPerf, factor: float) -> tuple[Callable[[BatchShape], float], DecodeTimeFn,
                                                            BatchTimeFn]:
    """Step time of an engine slowed by `factor`: the perf model's (its own methods at 1.0),
    times `factor`; and the same for decode-only passes (`BoundPerf.decode_time_s`) and for a
    batch given by its fields (`BoundPerf.batch_time_s`)."""
    base, base_decode, base_batch = bound.step_time_s, bound.decode_time_s, bound.batch_time_s
    if factor == 1.0:
        return base, base_decode, base_batch

    def step_time(shape: BatchShape) -> float:
        return base(shape) * factor

    def decode_time(n: int, kv: int, longest: int) -> float:
        return base_decode(n, kv, longest) * factor

    def batch_time(n: int, new: int, kv: int, pairs: float, pre: int, mx: int, longest: int) -> float:
        return base_batch(n, new, kv, pairs, pre, mx, longest) * factor

    return step_time, decode_time, batch_time
