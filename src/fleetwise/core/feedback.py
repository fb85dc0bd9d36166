"""Feedback events the driver (simulator or gateway) reports to a routing policy's `observe()`.

One tagged union, plain data: the same sequence of events drives a policy identically whichever
driver produced it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Dispatched:
    now_s: float
    request_id: str
    worker: str
    prompt_tokens: int
    block_hashes: tuple[int, ...] = ()
    prefill_worker: str | None = None


@dataclass(frozen=True, slots=True)
class FirstToken:
    now_s: float
    request_id: str
    worker: str
    ttft_s: float


@dataclass(frozen=True, slots=True)
class Completed:
    now_s: float
    request_id: str
    worker: str
    output_tokens: int
    tpot_s: float
    e2e_s: float


@dataclass(frozen=True, slots=True)
class Failed:
    now_s: float
    request_id: str
    worker: str
    reason: str


@dataclass(frozen=True, slots=True)
class WorkerUp:
    now_s: float
    worker: str
    model_version: str = "v1"


@dataclass(frozen=True, slots=True)
class WorkerDown:
    now_s: float
    worker: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class KvStored:
    now_s: float
    worker: str
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KvEvicted:
    now_s: float
    worker: str
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Tick:
    now_s: float


Feedback = Dispatched | FirstToken | Completed | Failed | WorkerUp | WorkerDown | KvStored | KvEvicted | Tick
