"""Optional recording of every engine step and KV transfer of a run, for a trace export.

Off by default: the runner routes step outputs through `StepRecorder.on_step` only when
`SimOptions.recorder` is set, so an unrecorded run pays nothing. Steps are kept when they
overlap the window `[start_s, end_s]` (virtual seconds), so a big run records a bounded slice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleetwise.engine.api import StepOutput
from fleetwise.sim.columns import Records
from fleetwise.sim.network import TransferRecord

if TYPE_CHECKING:
    from fleetwise.sim.fleet import Replica


CHECK_EVERY_STEPS = 4096
"""How often (in recorded steps; a power of two) a request-bounded recorder checks whether its
requests have all ended: rarely enough to cost nothing, often enough to stop early."""


def _ended(records: Records, first: int, last: int) -> bool:
    fin, failed = records.finish_s, records.failure
    return all(i in failed or not math.isnan(fin[i]) for i in range(first, min(last, len(fin))))


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step as it ran: replica index, start and end (s), and its batch composition."""

    replica: int
    start_s: float
    end_s: float
    prefill_tokens: int
    decodes: int
    """Sequences decoding in each pass."""
    passes: int
    """Passes actually run (a fused step cut short runs fewer than it planned)."""
    preempted: int
    tokens: int
    """Output tokens produced by the step."""


@dataclass
class StepRecorder:
    """Collects `StepRecord`s inside a time window, and the run's KV transfers at its end."""

    start_s: float = 0.0
    end_s: float = math.inf
    steps: list[StepRecord] = field(default_factory=list)
    transfers: list[TransferRecord] = field(default_factory=list)
    """Every transfer of the run (ports are numbered like replicas; tag = request index * 4 + attempt)."""
    requests: tuple[int, int] | None = None
    """Positions [first, last) in arrival order: once all of them have ended, recording stops
    (a request window bounds memory as well as the file)."""
    _passes_seen: dict[int, int] = field(default_factory=dict)
    _calls: int = 0

    def on_step(self, rep: Replica, start_s: float, end_s: float, out: StepOutput, records: Records) -> None:
        """Record the step `rep` just completed (called before the runner handles its output)."""
        total = rep.engine.stats.passes
        passes = total - self._passes_seen.get(rep.idx, 0)
        self._passes_seen[rep.idx] = total
        if end_s < self.start_s or start_s > self.end_s:
            return
        self._calls += 1
        if self.requests is not None and not self._calls & CHECK_EVERY_STEPS - 1 and _ended(records, *self.requests):
            self.end_s = end_s
        st = rep.step
        prefill = st.prefill_tokens if st is not None else 0
        decodes = st.decode_tokens // max(st.num_passes, 1) if st is not None else 0
        self.steps.append(StepRecord(rep.idx, start_s, end_s, prefill, decodes, passes, len(out.preempted),
                                     out.tokens_generated))
