"""`Records`: the per-request columns of a run, filled by the runner as events happen; and
`ReplicaStats`, what the fleet measures per replica.

Owns the columns' layout: `array('d')`/`array('q')` indexed by request position (a million
requests cost tens of megabytes and no per-request objects); times are virtual seconds, NaN =
never happened. What the columns mean and how they are summarised: `sim/results.py`.

Compiled with the simulator's modules (setup.py `COMPILED`): the runner writes several columns
per request event and counts per replica, and compiled classes give it native attribute reads.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

import numpy as np

from fleetwise.core.request import Request

NAN = math.nan
TIME_COLUMNS = (
    "dispatch_s", "prefill_start_s", "prefill_end_s", "kv_start_s", "kv_end_s", "first_token_s", "finish_s",
)
"""The per-request time columns, in the order of the records' CSV."""


class Records:
    """Per-request columns; index `i` is the request's position in the input list."""

    # every time column (TIME_COLUMNS), set in `__init__`
    dispatch_s: array[float]
    prefill_start_s: array[float]
    prefill_end_s: array[float]
    kv_start_s: array[float]
    kv_end_s: array[float]
    first_token_s: array[float]
    finish_s: array[float]

    def __init__(self, requests: list[Request]) -> None:
        n = len(requests)
        self.requests = requests
        for name in TIME_COLUMNS:
            setattr(self, name, array("d", [NAN]) * n)
        self.network_s: array[float] = array("d", [0.0]) * n
        """Round trip between the client's region and the serving replica's (0 within a region)."""
        self.worker: array[int] = array("q", [-1]) * n
        self.prefill_worker: array[int] = array("q", [-1]) * n
        self.tokens: array[int] = array("q", [0]) * n
        self.retries: array[int] = array("q", [0]) * n
        self.failure: dict[int, str] = {}
        self.decision: list[str] = [""] * n
        """Kind of the (last) routing decision: `least-cost`, `prefix`, `round-robin`, `pair`..."""
        self.decision_scores: list[dict[str, float] | None] = [None] * n
        """The chosen worker's scores (`routing.base.winning_scores`): why it won."""

    def column(self, name: str) -> np.ndarray:
        """Column `name` as a numpy array over the same memory (float64 for times, int64 else)."""
        return np.frombuffer(getattr(self, name), dtype=np.float64 if name.endswith("_s") else np.int64)

    def arrival(self) -> np.ndarray:
        """Arrival seconds of every request."""
        return np.fromiter((r.arrival_s for r in self.requests), dtype=np.float64, count=len(self.requests))

    def completed_mask(self) -> np.ndarray:
        """True where the request finished."""
        return ~np.isnan(self.column("finish_s"))


@dataclass(slots=True)
class ReplicaStats:
    """What the fleet measured for one replica over the run."""

    name: str
    pool: str
    role: str
    gpus: int
    price_per_gpu_hour_usd: float
    requests: int = 0
    busy_s: float = 0.0
    prefix_hit_rate: float = 0.0
    preemptions: int = 0
    kv_usage_samples: list[float] = field(default_factory=list)
    queue_series: list[tuple[float, int, int, float]] = field(default_factory=list)
    """Samples (t_s, waiting, running, kv_usage), thinned to at most MAX_SERIES points."""
