"""`Request`: one request of a workload, as generated or loaded from a trace (immutable input).

The simulator keeps each request's runtime progress in its own records; this type is only what
the client sent and when.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    """A request arriving at `arrival_s` with `prompt_tokens` in and `output_tokens` out.

    `block_hashes`: chained prefix-block ids of the prompt (Mooncake `hash_ids` semantics: equal
    id at position i means the first i+1 blocks are equal). Empty when nothing is shared.
    `hash_block_tokens`: tokens per hashed block (512 in the Mooncake traces).
    `request_id`: a string, as a client or a gateway names it (generators and trace loaders
    number requests "0", "1", ... in arrival order).
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...] = ()
    hash_block_tokens: int = 512
    tenant: str = "default"
    session_id: int | None = None
    model_version: str | None = None
    region: str | None = None
    max_tokens: int | None = None
    """The client's cap on output tokens (`max_tokens`), None when it sent none. A router sees
    this, never `output_tokens` (which is what the engine will actually generate, <= the cap)."""
