"""`Request`: one request of a workload, as generated or loaded from a trace (immutable input).

The simulator keeps each request's runtime progress in its own records; this type is only what
the client sent and when.

Compiled with the simulator's modules (setup.py `COMPILED`): the engine, the runner and the
policies read a request's fields on every step and decision, natively when it is compiled. Like
the types of `core/views.py` it is a frozen dataclass with its own `__init__` (the generated
one runs interpreted even for a compiled class). Its `__reduce__` rebuilds it from its fields,
so it pickles and copies (the planner's worker processes receive requests) whether compiled or
not. Its counts take any integer (numpy's too: `operator.index`, so a float count is refused,
not truncated) and its arrival any real number, stored as Python `int` and `float` (a compiled
class holds its annotated types); `block_hashes` any iterable of integers, stored as a tuple.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from operator import index
from typing import Any, SupportsFloat, SupportsIndex, cast


def _int(x: SupportsIndex) -> int:
    """A count as a Python int (numpy integers included; floats refused, not truncated)."""
    return x if type(x) is int else index(x)


def _opt_int(x: SupportsIndex | None) -> int | None:
    return None if x is None else _int(x)


def _hashes(xs: Iterable[SupportsIndex]) -> tuple[int, ...]:
    """Block ids as a tuple of Python ints (checked by the first: a trace's ids share one type)."""
    t = xs if type(xs) is tuple else tuple(xs)
    if t and type(t[0]) is not int:
        return tuple(index(h) for h in t)
    return cast("tuple[int, ...]", t)


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

    def __init__(self, request_id: str, arrival_s: SupportsFloat, prompt_tokens: SupportsIndex,
                 output_tokens: SupportsIndex, block_hashes: Iterable[SupportsIndex] = (),
                 hash_block_tokens: SupportsIndex = 512, tenant: str = "default",
                 session_id: SupportsIndex | None = None, model_version: str | None = None,
                 region: str | None = None, max_tokens: SupportsIndex | None = None) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "arrival_s", arrival_s if type(arrival_s) is float else float(arrival_s))
        object.__setattr__(self, "prompt_tokens", _int(prompt_tokens))
        object.__setattr__(self, "output_tokens", _int(output_tokens))
        object.__setattr__(self, "block_hashes", _hashes(block_hashes))
        object.__setattr__(self, "hash_block_tokens", _int(hash_block_tokens))
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "session_id", _opt_int(session_id))
        object.__setattr__(self, "model_version", model_version)
        object.__setattr__(self, "region", region)
        object.__setattr__(self, "max_tokens", _opt_int(max_tokens))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle and copy by the constructor and the fields (a compiled class has no other way)."""
        return (Request, (self.request_id, self.arrival_s, self.prompt_tokens, self.output_tokens,
                          self.block_hashes, self.hash_block_tokens, self.tenant, self.session_id,
                          self.model_version, self.region, self.max_tokens))
