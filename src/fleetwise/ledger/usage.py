"""What one request used and what it is billed: the usage record, the work items, the billing rule.

Pure data and one rule (`billed`); the stores (`fleetwise.ledger.store`) persist it. Tokens are
counts, GPU time is GPU-seconds (replica seconds x GPUs of the replica), times are UNIX seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fleetwise.spec.failure_domains import FailureDomainSpec

Status = Literal["completed", "cancelled", "failed"]
"""How a request ended: `completed` (the stream finished), `cancelled` (the client went away),
`failed` (a server-side error ended it)."""
STATUSES: tuple[Status, ...] = ("completed", "cancelled", "failed")

TOKEN_COUNT_LIMIT = 2**31 - 1
"""Most tokens a live request's record counts (`ledger.meter`): PostgreSQL's INTEGER range. No
model's context comes near it, and the ledger's BIGINT columns still hold sums over 2^32 such
records. (A `Usage` may hold larger sums: the simulator bills whole runs as one.)"""

WorkKind = Literal["prefill", "reprefill", "migration", "decode"]
"""A piece of work done for a request: the first prefill, a re-prefill after a lost prefill /
KV hand-off, a migration's prefill of prompt + generated tokens, and decoding."""
WORK_KINDS: tuple[WorkKind, ...] = ("prefill", "reprefill", "migration", "decode")


@dataclass(frozen=True, slots=True)
class WorkItem:
    """Work one replica did for a request: tokens it computed and the GPU-seconds it took."""

    kind: WorkKind
    reason: str
    """Why it ran: `first` for the first prefill/decode, else the failure that caused it."""
    pool: str
    replica: str
    tokens_computed: int
    gpu_s: float


@dataclass(frozen=True, slots=True)
class Billed:
    """Tokens a usage record bills."""

    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int


@dataclass(frozen=True, slots=True)
class Usage:
    """One request attempt's usage, written once when it ends.

    `idempotency_key` is the client's key (or the generated one); `(tenant, idempotency_key)`
    is billed at most once, whatever the number of attempts. `delivered_tokens` counts generated
    tokens the client received; `cached_tokens` the prompt tokens served from a prefix cache.
    """

    idempotency_key: str
    request_id: str
    tenant: str
    model: str
    prefill_pool: str
    decode_pool: str
    status: Status
    reason: str
    prompt_tokens: int
    cached_tokens: int
    delivered_tokens: int
    started_at: float
    ended_at: float
    work: tuple[WorkItem, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} must be one of {', '.join(STATUSES)}")
        for name in ("prompt_tokens", "cached_tokens", "delivered_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if self.cached_tokens > self.prompt_tokens:
            raise ValueError(f"cached_tokens={self.cached_tokens} exceeds prompt_tokens={self.prompt_tokens}")
        for w in self.work:
            if w.kind not in WORK_KINDS:
                raise ValueError(f"work kind {w.kind!r} must be one of {', '.join(WORK_KINDS)}")

    @property
    def computed_tokens(self) -> int:
        """Tokens computed by every piece of work (prefills, re-prefills, migrations, decode)."""
        return sum(w.tokens_computed for w in self.work)

    @property
    def gpu_s(self) -> float:
        """GPU-seconds of every piece of work."""
        return sum(w.gpu_s for w in self.work)

    @property
    def recovery_gpu_s(self) -> float:
        """GPU-seconds spent on re-prefills and migrations (work a fault-free run would not do)."""
        return sum(w.gpu_s for w in self.work if w.kind in ("reprefill", "migration"))


def billed(usage: Usage, decisions: FailureDomainSpec) -> Billed:
    """What `usage` bills: prompt, cached and delivered tokens, or nothing for a failed request
    when `decisions.bill_failed` is `nothing`. Work done by re-prefills and migrations is never
    billed: only tokens the client received and the prompt it sent."""
    if usage.status == "failed" and decisions.bill_failed == "nothing":
        return Billed(0, 0, 0)
    return Billed(usage.prompt_tokens, usage.cached_tokens, usage.delivered_tokens)


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One usage row as stored (billed counts fixed when it was written)."""

    tenant: str
    idempotency_key: str
    request_id: str
    model: str
    prefill_pool: str
    decode_pool: str
    status: str
    reason: str
    prompt_tokens: int
    cached_tokens: int
    delivered_tokens: int
    billed_prompt_tokens: int
    billed_cached_tokens: int
    billed_generated_tokens: int
    computed_tokens: int
    gpu_s: float
    recovery_gpu_s: float
    attempts: int
    started_at: float
    ended_at: float
