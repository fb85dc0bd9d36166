"""How far a search has got, as a fraction, for a progress bar with the time left.

Owns `PhaseMeter`: each phase of `api.plan` has a share of the search's wall time
(`PHASE_SHARES`); inside a phase, each batch of simulation tasks the executor maps advances it by
the tasks done over the tasks in the batch. The caller gets `fraction` (0..1) after every task
and phase, never decreasing. Measures nothing itself and changes no result.
"""

from __future__ import annotations

from collections.abc import Callable

PHASE_SHARES: dict[str, float] = {"latency": 0.01, "goodput": 0.52, "refinement": 0.42, "disaggregation": 0.05}
"""Share of a search's time per phase (fit, sizing and ranking take milliseconds): the mean of
per-phase CPU time, one worker, on the built-in question (goodput 35%, refinement 60%,
disaggregation 5% of 30.5 s) and the small PD plan of tests/report (69%, 25%, 5% of 7.2 s)."""


class PhaseMeter:
    """Turns phase starts and finished tasks into one fraction of the search done."""

    def __init__(self, report: Callable[[float], None]) -> None:
        self.report = report
        self.base = 0.0
        self.share = 0.0
        self.done = 0.0
        """Fraction reported so far (never decreases)."""

    def phase(self, name: str) -> None:
        """Phase `name` starts: the previous one counts as complete."""
        self._emit(self.base + self.share)
        self.base = min(1.0, self.base + self.share)
        self.share = PHASE_SHARES.get(name, 0.0)

    def tasks(self, done: int, total: int) -> None:
        """`done` of `total` tasks of the current batch finished (the executor's hook)."""
        if total > 0:
            self._emit(self.base + self.share * done / total)

    def finish(self) -> None:
        self._emit(1.0)

    def _emit(self, fraction: float) -> None:
        f = min(1.0, max(self.done, fraction))
        if f > self.done or f == 1.0:
            self.done = f
            self.report(f)
