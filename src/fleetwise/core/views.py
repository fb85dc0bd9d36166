"""What a router may see of the fleet, and what it returns.

`WorkerView` is a read-only projection of one engine (`Engine.snapshot()` in the simulator, a
scraped metrics endpoint in the gateway). `reported_at_s` makes staleness visible: a policy
compares it with `FleetView.now_s`.

The types made per request or per view refresh (`WorkerView`, `FleetView`, `RouteRequest`,
`RoutingDecision`, and the per-request feedback events of `core/feedback.py`) are frozen
dataclasses with their own `__init__` (defaults live there, in its signature): the dataclasses
module writes a generated `__init__` as interpreted Python even for a compiled class, while an
explicit one of `object.__setattr__(self, "<field>", value)` calls (the frozen dataclass idiom)
compiles to plain stores (mypyc, docs/simulator.md "Compiled modules": about 2 us -> 0.06 us a
`RouteRequest`). Fields, equality, hashing, `repr`, `dataclasses.replace` and the frozen
`FrozenInstanceError` on assignment are the dataclass's, unchanged; tests/sim/test_core_types.py
keeps each `__init__` in step with its fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fleetwise.spec.kv_format import KvFormat
from fleetwise.spec.roles import Role

__all__ = ["FleetView", "KvLinkView", "Role", "RouteRequest", "RoutingDecision", "WorkerView", "kv_format_of"]


@dataclass(frozen=True, slots=True, init=False)
class WorkerView:
    """One replica as the router sees it."""

    name: str
    role: Role
    pool: str
    accelerator: str
    model_version: str
    region: str
    healthy: bool
    queued_requests: int
    running_requests: int
    queued_prefill_tokens: int | None
    """Prompt tokens admitted or waiting but not yet prefilled; None when the source cannot tell
    (a real vLLM `/metrics`): scorers then use the policy's own in-flight ledger instead."""
    running_decode_tokens: int | None
    """Expected decode tokens still to generate for running requests; None when the source cannot
    tell (vLLM does not know output lengths): scorers then use the policy's in-flight ledger."""
    kv_usage: float
    """Fraction of KV blocks in use (0..1)."""
    kv_capacity_tokens: int
    block_size: int
    reported_at_s: float
    """When this view was taken (virtual or wall seconds, same clock as FleetView.now_s)."""
    weight: float
    """Relative capacity (1 = nominal): round-robin and random picks are proportional to it, and
    scored picks divide the worker's predicted cost and outstanding requests by it."""
    kv_format: KvFormat | None
    """The KV format the replica declares (dtype encoding, block size, TP, vendor); None: only its
    `model_version` is known. The last field, so views built positionally stay valid."""

    def __init__(self, name: str, role: Role = "mixed", pool: str = "default", accelerator: str = "",
                 model_version: str = "v1", region: str = "default", healthy: bool = True,
                 queued_requests: int = 0, running_requests: int = 0, queued_prefill_tokens: int | None = 0,
                 running_decode_tokens: int | None = 0, kv_usage: float = 0.0, kv_capacity_tokens: int = 0,
                 block_size: int = 16, reported_at_s: float = 0.0, weight: float = 1.0,
                 kv_format: KvFormat | None = None) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "role", role)
        object.__setattr__(self, "pool", pool)
        object.__setattr__(self, "accelerator", accelerator)
        object.__setattr__(self, "model_version", model_version)
        object.__setattr__(self, "region", region)
        object.__setattr__(self, "healthy", healthy)
        object.__setattr__(self, "queued_requests", queued_requests)
        object.__setattr__(self, "running_requests", running_requests)
        object.__setattr__(self, "queued_prefill_tokens", queued_prefill_tokens)
        object.__setattr__(self, "running_decode_tokens", running_decode_tokens)
        object.__setattr__(self, "kv_usage", kv_usage)
        object.__setattr__(self, "kv_capacity_tokens", kv_capacity_tokens)
        object.__setattr__(self, "block_size", block_size)
        object.__setattr__(self, "reported_at_s", reported_at_s)
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "kv_format", kv_format)


def kv_format_of(w: WorkerView) -> KvFormat:
    """The replica's KV format with its current `model_version` (a rolling upgrade changes it)."""
    f = w.kv_format
    return KvFormat(w.model_version) if f is None else f.at_version(w.model_version)


@dataclass(frozen=True, slots=True, init=False)
class KvLinkView:
    """A prefill->decode KV path as the router sees it."""

    src: str
    dst: str
    bandwidth_bytes_per_s: float
    latency_s: float
    active_transfers: int = 0
    healthy: bool = True

    def __init__(self, src: str, dst: str, bandwidth_bytes_per_s: float, latency_s: float, active_transfers: int = 0,
                 healthy: bool = True) -> None:
        object.__setattr__(self, "src", src)
        object.__setattr__(self, "dst", dst)
        object.__setattr__(self, "bandwidth_bytes_per_s", bandwidth_bytes_per_s)
        object.__setattr__(self, "latency_s", latency_s)
        object.__setattr__(self, "active_transfers", active_transfers)
        object.__setattr__(self, "healthy", healthy)


@dataclass(frozen=True, slots=True, init=False)
class FleetView:
    """The fleet at `now_s`; each worker's own `reported_at_s` may lag."""

    now_s: float
    workers: tuple[WorkerView, ...]
    links: tuple[KvLinkView, ...]

    def __init__(self, now_s: float, workers: tuple[WorkerView, ...], links: tuple[KvLinkView, ...] = ()) -> None:
        object.__setattr__(self, "now_s", now_s)
        object.__setattr__(self, "workers", workers)
        object.__setattr__(self, "links", links)

    def by_name(self) -> dict[str, WorkerView]:
        """Worker name -> its view."""
        return {w.name: w for w in self.workers}


@dataclass(frozen=True, slots=True, init=False)
class RouteRequest:
    """What the router knows of one request when it arrives."""

    request_id: str
    prompt_tokens: int
    max_output_tokens: int | None
    """The client's `max_tokens` (or a driver's configured default); None when absent. Never the
    true output length: the policy predicts the decode work (`fleetwise.routing.predictor`)."""
    block_hashes: tuple[int, ...]
    """Chained prefix-block hashes of the prompt (equal hash = equal prefix up to that block)."""
    tenant: str
    model_version: str | None
    """Version the request is pinned to; None accepts any."""
    region: str | None
    arrival_s: float
    hash_block_tokens: int
    """Prompt tokens covered by one entry of `block_hashes` (512 in Mooncake traces)."""

    def __init__(self, request_id: str, prompt_tokens: int, max_output_tokens: int | None,
                 block_hashes: tuple[int, ...] = (), tenant: str = "default", model_version: str | None = None,
                 region: str | None = None, arrival_s: float = 0.0, hash_block_tokens: int = 512) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "prompt_tokens", prompt_tokens)
        object.__setattr__(self, "max_output_tokens", max_output_tokens)
        object.__setattr__(self, "block_hashes", block_hashes)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "model_version", model_version)
        object.__setattr__(self, "region", region)
        object.__setattr__(self, "arrival_s", arrival_s)
        object.__setattr__(self, "hash_block_tokens", hash_block_tokens)


@dataclass(frozen=True, slots=True, init=False)
class RoutingDecision:
    """Where to send a request. `worker` is None when the request is rejected (see `reason`).

    `kind` says why, as data (counted by the policy's report; nothing parses `reason`, which is
    for humans): `rejected`, `safe-mode`, a picker's (`round-robin`, `random`, `power-of-two`),
    or the leading signal of a scored pick (`prefix`, `least-outstanding`, `least-cost`, `tie`,
    `pair` for a scored prefill/decode pair).
    """

    worker: str | None
    prefill_worker: str | None
    scores: Mapping[str, float]
    """`<worker>` -> weighted total and `<worker>.<scorer>` -> score, rounded to 6 places (a
    scored pick's fast path hands a read-only table that rounds each entry when read); a new
    empty dict when not given."""
    reason: str
    safe_mode: bool
    kind: str

    def __init__(self, worker: str | None, prefill_worker: str | None = None,
                 scores: Mapping[str, float] | None = None, reason: str = "", safe_mode: bool = False,
                 kind: str = "") -> None:
        object.__setattr__(self, "worker", worker)
        object.__setattr__(self, "prefill_worker", prefill_worker)
        object.__setattr__(self, "scores", {} if scores is None else scores)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "safe_mode", safe_mode)
        object.__setattr__(self, "kind", kind)

    @property
    def rejected(self) -> bool:
        """True when no worker was chosen (the request is refused with `reason`)."""
        return self.worker is None
