"""What `fleetwise.engine.scheduler.Engine` keeps between its calls: the step it scheduled and
has not completed yet (`ScheduledStep`), and its running counts (`EngineCounters`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetwise.engine.bundle import Fused
from fleetwise.engine.sequence import SeqState

__all__ = ["EngineCounters", "ScheduledStep"]


@dataclass(slots=True)
class ScheduledStep:
    """The scheduled step awaiting `complete()`."""

    passes: int
    duration_s: float
    num_decoders: int
    chunks: list[tuple[SeqState, int]]
    new_decoders: list[SeqState]
    preempted: list[str]
    prefix_hit_tokens: int
    scheduled: list[tuple[str, float]] = field(default_factory=list)
    """Requests whose prompt was first scheduled in this step (offset 0.0: the step's start)."""
    fused: Fused | None = None
    """Pass times of a fused decode step (None for a single pass)."""
    deferred_blocks: int = 0
    """Blocks of passes 2..k, taken from the pool at `complete()`."""


@dataclass(slots=True)
class EngineCounters:
    """What an engine has done so far (`Engine.stats`)."""

    prompt_tokens_admitted: int = 0
    prefix_hit_tokens: int = 0
    preemptions: int = 0
    steps: int = 0
    passes: int = 0
    carried_preempted: list[str] = field(default_factory=list)
