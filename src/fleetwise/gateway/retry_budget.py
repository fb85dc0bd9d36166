"""`RetryBudget`: how many retries may be in flight at once, as a share of the requests in flight.

Envoy's retry budget (`retry_budget`: `budget_percent` of the active requests, at least
`min_retry_concurrency`): when backends fail because the fleet is overloaded (a CPU-starved
replica timing out, a crash taking a share of the capacity), unbounded retries multiply the
offered load by up to `max_retries + 1` and keep it overloaded. With the budget, a failure once
the budget is spent ends that request with its error instead of a further attempt.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RetryBudget:
    """Requests in flight and those on a retry now; `take` admits a retry within the budget."""

    budget_percent: float | None
    """Most retries in flight, as a percent of the requests in flight (Envoy's default: 20); None: no limit."""
    min_retry_concurrency: int
    """Retries always allowed in flight whatever the share (Envoy's default: 3)."""
    active: int = 0
    """Requests being routed or dispatched now (each counts once, whatever its attempt)."""
    retrying: int = 0
    """Of them, those whose current attempt is a retry."""
    refused: int = 0
    """Retries refused since the start because the budget was spent."""

    def limit(self) -> int:
        """Retries that may be in flight now (every request in flight when there is no budget)."""
        if self.budget_percent is None:
            return max(self.min_retry_concurrency, self.active)
        return max(self.min_retry_concurrency, int(self.budget_percent / 100.0 * self.active))

    def take(self) -> bool:
        """Start a retry if the budget allows one (the caller then `give`s it back); else count it refused."""
        if self.retrying < self.limit():
            self.retrying += 1
            return True
        self.refused += 1
        return False

    def give(self) -> None:
        """A retry's attempt ended (answered, failed or handed on)."""
        self.retrying -= 1
