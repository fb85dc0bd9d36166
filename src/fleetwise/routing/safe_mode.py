"""Safe-mode state machine: enter when the fleet view is too old, leave when it is fresh again.

A worker's state is stale when `now_s - reported_at_s > stale_after_s`; safe mode starts when at
least `stale_fraction` of the eligible workers are stale. This module only tracks the state and
the time spent in it; what a policy does while in safe mode (`round_robin`, `last_known`,
`reject`) is the policy's business. With safe mode off, a policy routes on a stale view as if it
were fresh (`as_fresh`): it trusts the view's loads and health as of now, without the in-flight
estimates `last_known` adds since the view was taken, so comparing the two shows what safe mode buys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fleetwise.core.views import FleetView, WorkerView
from fleetwise.spec.routing import SafeModeSpec

__all__ = ["SafeModeTracker", "as_fresh"]


def as_fresh(fleet: FleetView) -> FleetView:
    """The view with every worker's state dated `fleet.now_s`: what a router unaware of staleness sees."""
    now = fleet.now_s
    return FleetView(now, tuple(replace(w, reported_at_s=now) for w in fleet.workers), fleet.links)

MAX_PERIODS = 1_000
"""Safe-mode periods kept for the report (the first ones; `entries` still counts them all), so a
view that flaps for hours keeps a bounded list."""


class SafeModeTracker:
    """Tracks whether the policy is in safe mode and for how long (virtual seconds)."""

    def __init__(self, spec: SafeModeSpec) -> None:
        self.spec = spec
        self.enabled: bool = spec.enabled
        """The spec's fields read per decision, kept as native fields (in compiled code a spec's
        field is a generic attribute lookup on a pydantic model each time)."""
        self.action: str = spec.action
        self.stale_after_s: float = spec.stale_after_s
        self.stale_fraction: float = spec.stale_fraction
        self.active = False
        self.entered_at_s = 0.0
        self.total_s = 0.0
        self.entries = 0
        self.last_now_s = 0.0
        self.last_age_s = 0.0
        self.periods: list[tuple[float, float]] = []
        """Closed safe-mode periods (enter, leave) in the driver's seconds, the first MAX_PERIODS."""

    def update(self, now_s: float, workers: Sequence[WorkerView]) -> bool:
        """Re-evaluate from the eligible workers' ages; return whether safe mode is on."""
        self.tick(now_s)
        if not self.enabled or not workers:
            return self._set(False, now_s)
        ages = [now_s - w.reported_at_s for w in workers]
        stale = sum(a > self.stale_after_s for a in ages)
        self.last_age_s = max(ages)
        return self._set(stale >= self.stale_fraction * len(workers), now_s)

    def update_sorted(self, now_s: float, reported_at: Sequence[float]) -> bool:
        """`update` given the eligible workers' `reported_at_s`, ascending (same result: ages
        fall as report times rise, so the stale ones are a prefix and the oldest comes first)."""
        self.tick(now_s)
        if not self.enabled or not reported_at:
            return self._set(False, now_s)
        self.last_age_s = now_s - reported_at[0]
        return self._set(self.stale(now_s, reported_at), now_s)

    def stale(self, now_s: float, reported_at: Sequence[float]) -> bool:
        """Whether the view is stale by the spec's rule (enabled or not), given the eligible
        workers' `reported_at_s` ascending."""
        n = len(reported_at)
        limit = self.stale_after_s
        lo, hi = 0, n  # ages[:lo] are stale, ages[hi:] are not
        while lo < hi:
            mid = (lo + hi) // 2
            if now_s - reported_at[mid] > limit:
                lo = mid + 1
            else:
                hi = mid
        return n > 0 and lo >= self.stale_fraction * n

    def tick(self, now_s: float) -> None:
        """Advance the clock (from a route call or any feedback event)."""
        self.last_now_s = max(self.last_now_s, now_s)

    def _set(self, on: bool, now_s: float) -> bool:
        if on and not self.active:
            self.active, self.entered_at_s, self.entries = True, now_s, self.entries + 1
        elif not on and self.active:
            self.active = False
            self.total_s += max(0.0, now_s - self.entered_at_s)
            if len(self.periods) < MAX_PERIODS:
                self.periods.append((self.entered_at_s, now_s))
        return self.active

    def time_in_safe_mode_s(self) -> float:
        """Closed periods plus the open one up to the latest time seen."""
        open_s = max(0.0, self.last_now_s - self.entered_at_s) if self.active else 0.0
        return self.total_s + open_s

    def describe(self) -> str:
        """The reason fragment for decisions made in safe mode."""
        return f"view age {self.last_age_s:.1f}s > stale_after {self.spec.stale_after_s:g}s"

    def report(self) -> dict[str, Any]:
        return {
            "enabled": self.spec.enabled,
            "action": self.spec.action,
            "stale_after_s": self.spec.stale_after_s,
            "active": self.active,
            "entries": self.entries,
            "time_s": self.time_in_safe_mode_s(),
            "periods": self.period_list(),
        }

    def period_list(self) -> list[list[float]]:
        """[enter, leave] of each period kept; an open one ends at the latest time seen."""
        out = [[a, b] for a, b in self.periods]
        if self.active and len(out) < MAX_PERIODS:
            out.append([self.entered_at_s, max(self.entered_at_s, self.last_now_s)])
        return out
