"""Value types of the engine's contract: `EngineConfig` (knobs), `Step` (one scheduled forward
pass, or k fused decode passes) and `StepOutput` (what changed when it completed).

Owns only these records; the state machine that produces them is `fleetwise.engine.scheduler`.
Import them from `fleetwise.engine.api`, the public surface of the engine layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from fleetwise.errors import SpecError
from fleetwise.perf.types import BatchShape
from fleetwise.spec import engine_defaults as ed

NO_ENTRIES: Final[list[Any]] = []
"""The one empty list every `StepOutput` field and scheduled step's list that stayed empty
shares (one of each is made per step; fresh empty lists were a per-cent of a busy run): read-only,
never appended to; the engine makes a list of its own before it adds an entry."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Scheduler knobs, named as vLLM names them.

    max_num_batched_tokens: per-step token budget (decodes take 1, prompt chunks take their size).
    max_num_seqs: most sequences running at once (decoding or prefilling).
    block_size: tokens per KV block.
    max_bundle_steps: most decode-only passes `Engine.schedule` may fuse into one `Step`.
    """

    max_num_batched_tokens: int = ed.MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = ed.MAX_NUM_SEQS
    block_size: int = ed.BLOCK_SIZE
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_bundle_steps: int = ed.MAX_BUNDLE_STEPS

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "block_size", "max_bundle_steps"):
            value = getattr(self, name)
            if value < 1:
                raise SpecError(f"engine config: {name}={value} must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise SpecError(
                f"engine config: max_num_batched_tokens={self.max_num_batched_tokens} is below "
                f"max_num_seqs={self.max_num_seqs}; raise it so every running sequence can decode "
                "in each step (vLLM requires the same)"
            )


class Step:
    """One scheduled forward pass, or `num_passes` fused decode passes of identical structure.

    duration_s: total wall time of all passes (seconds).
    shape: batch shape of the first pass (later fused passes differ only in context, +1 per seq).
    num_seqs: sequences in each pass.
    prefill_tokens: prompt tokens computed (only ever in single-pass steps).
    decode_tokens: decode tokens computed over all passes (num_seqs * num_passes when fused).

    A decode-only step is formed from its first pass's KV read and longest row (`kv_read=`,
    `longest=`; its rows are `num_seqs`) and builds its `shape` (`BatchShape(n, n, kv, float(kv),
    0, 1, longest)`) only when asked, and a step with prompt chunks from `sums` (the shape's
    fields, in order): the simulator never asks. Two ints, not a tuple: one is made per step.
    """

    __slots__ = ("duration_s", "num_passes", "num_seqs", "prefill_tokens", "decode_tokens", "_shape", "_kv_read",
                 "_longest", "_sums")

    def __init__(self, duration_s: float, num_passes: int, shape: BatchShape | None, num_seqs: int,
                 prefill_tokens: int, decode_tokens: int, kv_read: int = -1, longest: int = 0,
                 sums: tuple[int, int, int, float, int, int, int] | None = None) -> None:
        if shape is None and kv_read < 0 and sums is None:
            raise ValueError("Step needs a shape, its fields (sums=...), or a decode step's kv_read=")
        self.duration_s, self.num_passes, self.num_seqs = duration_s, num_passes, num_seqs
        self.prefill_tokens, self.decode_tokens = prefill_tokens, decode_tokens
        self._shape, self._kv_read, self._longest, self._sums = shape, kv_read, longest, sums

    @property
    def shape(self) -> BatchShape:
        if self._shape is None:
            if self._sums is not None:
                self._shape = BatchShape(*self._sums)
            else:
                n, kv = self.num_seqs, self._kv_read
                self._shape = BatchShape(n, n, kv, float(kv), 0, 1 if n else 0, self._longest)
        return self._shape

    def __repr__(self) -> str:
        return (f"Step(duration_s={self.duration_s!r}, num_passes={self.num_passes!r}, shape={self.shape!r}, "
                f"num_seqs={self.num_seqs!r}, prefill_tokens={self.prefill_tokens!r}, "
                f"decode_tokens={self.decode_tokens!r})")


class StepOutput:
    """What changed when a `Step` completed.

    first_tokens: (request_id, seconds after step start when its first output token came out).
    finished: requests that produced their last token (blocks freed, or kept as prefix cache).
    handoffs: prefill role: prompt fully computed; its KV stays held until `Engine.release`.
    preempted: requests preempted by recompute while this step was formed (requeued at the front).
    tokens_generated: output tokens produced by all sequences in all passes.
    itl_samples: (inter-token gap seconds, count). A single pass gives each of its decoders one
        gap equal to its duration; a fused step reports its mean pass duration once with count
        num_seqs * num_passes (fused passes differ only by one context token per sequence).
    prefix_hit_tokens: prompt tokens served from the prefix cache at admissions in this step.
    scheduled: (request_id, 0.0) for each request whose prompt was first scheduled in this step
        (admitted from the waiting queue for the first time; the offset is the step's start).
        Re-admissions after a preemption and transferred KV (decode role) are not reported.
    tokens: per request, when the engine reports it (`Engine.per_request_outputs`; None
        otherwise): (request_id, output tokens it produced in this step: one per pass for a
        decoder, one for a prompt that completed on a mixed engine), in engine order.
    kv_events: KV events of this step when the pool records them (`Engine.enable_kv_events`;
        None otherwise): (True, hash id) = span stored, (False, hash id) = span evicted, in order.

    The last two fields are off on the simulator's fast path (None) and filled when asked. One
    is made per step: a plain class with its own `__init__` (see `step_state.ScheduledStep`), whose
    empty lists are the shared `NO_ENTRIES` (read them; never append to them).
    """

    __slots__ = ("first_tokens", "finished", "handoffs", "preempted", "tokens_generated", "itl_samples",
                 "prefix_hit_tokens", "scheduled", "tokens", "kv_events")

    def __init__(self, first_tokens: list[tuple[str, float]] | None = None, finished: list[str] | None = None,
                 handoffs: list[str] | None = None, preempted: list[str] | None = None, tokens_generated: int = 0,
                 itl_samples: list[tuple[float, int]] | None = None, prefix_hit_tokens: int = 0,
                 scheduled: list[tuple[str, float]] | None = None, tokens: list[tuple[str, int]] | None = None,
                 kv_events: list[tuple[bool, int]] | None = None) -> None:
        self.first_tokens: list[tuple[str, float]] = [] if first_tokens is None else first_tokens
        self.finished: list[str] = [] if finished is None else finished
        self.handoffs: list[str] = [] if handoffs is None else handoffs
        self.preempted: list[str] = [] if preempted is None else preempted
        self.tokens_generated = tokens_generated
        self.itl_samples: list[tuple[float, int]] = [] if itl_samples is None else itl_samples
        self.prefix_hit_tokens = prefix_hit_tokens
        self.scheduled: list[tuple[str, float]] = [] if scheduled is None else scheduled
        self.tokens = tokens
        self.kv_events = kv_events

    def __repr__(self) -> str:
        return "StepOutput(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in _STEP_OUTPUT_FIELDS) + ")"


_STEP_OUTPUT_FIELDS = ("first_tokens", "finished", "handoffs", "preempted", "tokens_generated", "itl_samples",
                       "prefix_hit_tokens", "scheduled", "tokens", "kv_events")
