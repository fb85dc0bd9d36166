"""Feedback events the driver (simulator or gateway) reports to a routing policy's `observe()`.

One tagged union, plain data: the same sequence of events drives a policy identically whichever
driver produced it.

Route, then confirm: `route()` reserves the request's work on the chosen worker(s) in the
policy's in-flight ledger. The driver then reports `Dispatched` (the request was sent: the
reservation is confirmed) or `Cancelled` (it never was: the reservation is released), and later
`Completed` or `Failed`. Every reservation ends in one of `Completed`, `Failed`, `Cancelled`.

The per-request events (`Dispatched`, `FirstToken`, `Completed`, `Failed`, `Cancelled`) have
their own `__init__` so that the compiled build constructs them natively (core/views.py says why).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, init=False)
class Dispatched:
    """The driver sent a routed request (confirms the policy's reservation), or placed one itself; seconds."""

    now_s: float
    request_id: str
    worker: str
    prompt_tokens: int
    block_hashes: tuple[int, ...]
    prefill_worker: str | None

    def __init__(self, now_s: float, request_id: str, worker: str, prompt_tokens: int,
                 block_hashes: tuple[int, ...] = (), prefill_worker: str | None = None) -> None:
        object.__setattr__(self, "now_s", now_s)
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "worker", worker)
        object.__setattr__(self, "prompt_tokens", prompt_tokens)
        object.__setattr__(self, "block_hashes", block_hashes)
        object.__setattr__(self, "prefill_worker", prefill_worker)


@dataclass(frozen=True, slots=True, init=False)
class FirstToken:
    """A request's first token left `worker`, `ttft_s` seconds after its arrival."""

    now_s: float
    request_id: str
    worker: str
    ttft_s: float

    def __init__(self, now_s: float, request_id: str, worker: str, ttft_s: float) -> None:
        object.__setattr__(self, "now_s", now_s)
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "worker", worker)
        object.__setattr__(self, "ttft_s", ttft_s)


@dataclass(frozen=True, slots=True, init=False)
class Completed:
    """A request finished on `worker`: its output tokens, mean seconds per output token and end-to-end seconds."""

    now_s: float
    request_id: str
    worker: str
    output_tokens: int
    tpot_s: float
    e2e_s: float

    def __init__(self, now_s: float, request_id: str, worker: str, output_tokens: int, tpot_s: float,
                 e2e_s: float) -> None:
        object.__setattr__(self, "now_s", now_s)
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "worker", worker)
        object.__setattr__(self, "output_tokens", output_tokens)
        object.__setattr__(self, "tpot_s", tpot_s)
        object.__setattr__(self, "e2e_s", e2e_s)


@dataclass(frozen=True, slots=True, init=False)
class Failed:
    """A request failed on `worker` (a crash, a lost hand-off, an engine error); `reason` says which."""

    now_s: float
    request_id: str
    worker: str
    reason: str

    def __init__(self, now_s: float, request_id: str, worker: str, reason: str) -> None:
        object.__setattr__(self, "now_s", now_s)
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "worker", worker)
        object.__setattr__(self, "reason", reason)


@dataclass(frozen=True, slots=True, init=False)
class Cancelled:
    """A routed request was never dispatched (client gone, connect error, unknown worker): the
    policy releases what `route()` reserved for it. Says nothing about the worker's speed."""

    now_s: float
    request_id: str
    worker: str
    reason: str

    def __init__(self, now_s: float, request_id: str, worker: str, reason: str) -> None:
        object.__setattr__(self, "now_s", now_s)
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "worker", worker)
        object.__setattr__(self, "reason", reason)


@dataclass(frozen=True, slots=True)
class WorkerUp:
    """`worker` (re)joined the fleet at `now_s`, serving `model_version`, with an empty cache."""

    now_s: float
    worker: str
    model_version: str = "v1"


@dataclass(frozen=True, slots=True)
class WorkerDown:
    """`worker` left the fleet at `now_s` (crash, drain); its cached blocks are gone."""

    now_s: float
    worker: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class KvStored:
    """`worker`'s engine cached these chained block hashes (an engine's `BlockStored` KV event)."""

    now_s: float
    worker: str
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KvEvicted:
    """`worker`'s engine evicted these block hashes (an engine's `BlockRemoved` KV event)."""

    now_s: float
    worker: str
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KvCleared:
    """The worker's cache contents are unknown from here on (an engine's `AllBlocksCleared`, or a
    KV-event subscription that starts over): forget every block recorded for it."""

    now_s: float
    worker: str


@dataclass(frozen=True, slots=True)
class Tick:
    now_s: float


Feedback = Dispatched | FirstToken | Completed | Failed | Cancelled | WorkerUp | WorkerDown | KvStored | KvEvicted | KvCleared | Tick
