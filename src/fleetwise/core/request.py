"""`Request`: one request of a workload, as generated or loaded from a trace (immutable input).

The simulator keeps each request's runtime progress in its own records; this type is only what
the client sent and when.

Compiled with the simulator's modules (setup.py `COMPILED`): the engine, the runner and the
policies read a request's fields on every step and decision, natively when it is compiled. Like
the types of `core/views.py` it is a frozen dataclass with its own `__init__` (the generated
one runs interpreted even for a compiled class). Its `__reduce__` rebuilds it from its fields,
so it pickles and copies (the planner's worker processes receive requests) whether compiled or
not. Compiled, the fields hold their annotated types: `int` fields take Python ints, not numpy
integers (`int(x)` or `.tolist()` first, as the workload loaders do), `str` fields strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, init=False)
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
    block_hashes: tuple[int, ...]
    hash_block_tokens: int
    tenant: str
    session_id: int | None
    model_version: str | None
    region: str | None
    max_tokens: int | None
    """The client's cap on output tokens (`max_tokens`), None when it sent none. A router sees
    this, never `output_tokens` (which is what the engine will actually generate, <= the cap)."""

    def __init__(self, request_id: str, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 block_hashes: tuple[int, ...] = (), hash_block_tokens: int = 512, tenant: str = "default",
                 session_id: int | None = None, model_version: str | None = None, region: str | None = None,
                 max_tokens: int | None = None) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "arrival_s", arrival_s)
        object.__setattr__(self, "prompt_tokens", prompt_tokens)
        object.__setattr__(self, "output_tokens", output_tokens)
        object.__setattr__(self, "block_hashes", block_hashes)
        object.__setattr__(self, "hash_block_tokens", hash_block_tokens)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "session_id", session_id)
        object.__setattr__(self, "model_version", model_version)
        object.__setattr__(self, "region", region)
        object.__setattr__(self, "max_tokens", max_tokens)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle and copy by the constructor and the fields (a compiled class has no other way)."""
        return (Request, (self.request_id, self.arrival_s, self.prompt_tokens, self.output_tokens,
                          self.block_hashes, self.hash_block_tokens, self.tenant, self.session_id,
                          self.model_version, self.region, self.max_tokens))
