"""What `fleetwise.engine.scheduler.Engine` keeps between its calls: the step it scheduled and
has not completed yet (`ScheduledStep`), and its running counts (`EngineCounters`).

`ScheduledStep`, made once per step, is a plain class with its own `__init__`, not a dataclass:
compiled by mypyc, a dataclass's generated `__init__` still runs as interpreted Python (the
dataclasses module writes it at import), which was the largest interpreted cost of a step
(docs/simulator.md, "Long outputs: per-event cost")."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetwise.engine.bundle import Fused
from fleetwise.engine.sequence import SeqState

__all__ = ["EngineCounters", "ScheduledStep"]


class ScheduledStep:
    """The scheduled step awaiting `complete()`."""

    __slots__ = ("passes", "duration_s", "num_decoders", "chunks", "new_decoders", "preempted", "prefix_hit_tokens",
                 "scheduled", "fused", "deferred_blocks")

    def __init__(self, passes: int, duration_s: float, num_decoders: int, chunks: list[tuple[SeqState, int]],
                 new_decoders: list[SeqState], preempted: list[str], prefix_hit_tokens: int,
                 scheduled: list[tuple[str, float]], fused: Fused | None = None, deferred_blocks: int = 0) -> None:
        self.passes = passes
        self.duration_s = duration_s
        self.num_decoders = num_decoders
        self.chunks = chunks
        self.new_decoders = new_decoders
        self.preempted = preempted
        self.prefix_hit_tokens = prefix_hit_tokens
        self.scheduled = scheduled
        """Requests whose prompt was first scheduled in this step (offset 0.0: the step's start)."""
        self.fused = fused
        """Pass times of a fused decode step (None for a single pass)."""
        self.deferred_blocks = deferred_blocks
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
