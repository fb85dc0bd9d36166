"""Output-length prediction: the decode work a router expects of a request it cannot see finish.

A router knows a request's tenant, its prompt length and the client's `max_tokens` cap (often
absent or generous), never its true output length. `OutputPredictor` turns what it knows into
an expected output in tokens and learns from `Completed` feedback, which carries the output
length once the request is done. The simulator's policies and the live gateway run this same
code; the parameters are `fleetwise.spec.routing.OutputPredictorParams`.

Estimate (all means in tokens): three levels, each a decayed mean shrunk towards the level
above by `prior_weight` pseudo-observations,

    fleet      = (S_f + k * prior_tokens) / (N_f + k)
    tenant     = (S_t + k * fleet)        / (N_t + k)
    tenant/bin = (S_b + k * tenant)       / (N_b + k)

where S and N are the decayed sums of observed outputs and counts at that level (each
observation multiplies its key's sums by `0.5 ** (1 / half_life_requests)` first) and the bin is
the geometric prompt-length bucket `floor(log(prompt) / log(bucket_ratio))`. A level with few
observations therefore says little and the prediction falls back smoothly to its parent. The
prediction is capped by the request's `max_tokens` when given.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from fleetwise.spec.routing import OutputPredictorParams

__all__ = ["OutputPredictor"]

MAX_OPEN = 1 << 17
"""Requests awaiting their completion kept at most (the oldest are forgotten: a driver that
never reports back must not grow the map without bound)."""


@dataclass(slots=True)
class _Sums:
    """Decayed sum of observed outputs and decayed count of one key."""

    total: float = 0.0
    count: float = 0.0

    def add(self, x: float, keep: float) -> None:
        self.total = self.total * keep + x
        self.count = self.count * keep + 1.0

    def shrunk(self, parent: float, k: float) -> float:
        """This key's mean pulled towards `parent` by `k` pseudo-observations."""
        return (self.total + k * parent) / (self.count + k)


_EMPTY = _Sums()
"""Sums of a key never observed (read only)."""


class OutputPredictor:
    """Expected output tokens per request, by tenant and prompt-length bucket; learns online.

    `expect(request_id, ...)` predicts and remembers which keys the request belongs to;
    `completed(request_id, output_tokens)` learns from it; `forget(request_id)` drops a request
    that failed (its output length says nothing about the workload).
    """

    def __init__(self, params: OutputPredictorParams | None = None) -> None:
        self.p = params or OutputPredictorParams()
        self._keep = 0.5 ** (1.0 / self.p.half_life_requests)
        self._log_ratio = math.log(self.p.bucket_ratio)
        self._prior_weight: float = self.p.prior_weight
        """`prior_weight` and `prior_tokens` as native fields (read per prediction; a pydantic field
        is a generic attribute lookup in compiled code)."""
        self._prior_tokens: float = self.p.prior_tokens
        self._fleet = _Sums()
        self._tenant: dict[str, _Sums] = {}
        self._bucket: dict[tuple[str, int], _Sums] = {}
        self._open: OrderedDict[str, tuple[str, int]] = OrderedDict()
        """Requests awaiting completion, oldest first (an `OrderedDict`: `MAX_OPEN` evicts the oldest
        in O(1), where a plain dict would scan past the slots of earlier deletions each time)."""
        self.observed = 0
        """Completions learned from."""

    def bucket(self, prompt_tokens: int) -> int:
        """Geometric prompt-length bucket: `floor(log(prompt) / log(bucket_ratio))` (0 for <= 1 token)."""
        return int(math.log(float(prompt_tokens)) / self._log_ratio) if prompt_tokens > 1 else 0  # float: native log

    def predict(self, tenant: str, prompt_tokens: int, max_tokens: int | None = None) -> float:
        """Expected output tokens of a request (no bookkeeping), capped by `max_tokens` if given."""
        k = self._prior_weight
        fleet = self._fleet.shrunk(self._prior_tokens, k)
        ten = self._tenant.get(tenant, _EMPTY).shrunk(fleet, k)
        est = self._bucket.get((tenant, self.bucket(prompt_tokens)), _EMPTY).shrunk(ten, k)
        return min(est, float(max_tokens)) if max_tokens is not None and max_tokens > 0 else est

    def expect(self, request_id: str, tenant: str, prompt_tokens: int, max_tokens: int | None = None) -> int:
        """`predict` rounded to whole tokens (at least 1); remembers the request until it completes."""
        self._open[request_id] = (tenant, self.bucket(prompt_tokens))
        self._open.move_to_end(request_id)
        while len(self._open) > MAX_OPEN:
            self._open.popitem(last=False)
        return max(1, round(self.predict(tenant, prompt_tokens, max_tokens)))

    def completed(self, request_id: str, output_tokens: int) -> None:
        """Learn the output length of a request `expect` saw (others are ignored)."""
        key = self._open.pop(request_id, None)
        if key is None:
            return
        self.learn(key[0], key[1], output_tokens)

    def learn(self, tenant: str, bucket: int, output_tokens: int) -> None:
        """Add one observed output length to the fleet, tenant and (tenant, bucket) sums."""
        x, keep = float(output_tokens), self._keep
        self._fleet.add(x, keep)
        t = self._tenant.get(tenant)
        if t is None:
            t = self._tenant[tenant] = _Sums()
        t.add(x, keep)
        b = self._bucket.get((tenant, bucket))
        if b is None:
            b = self._bucket[(tenant, bucket)] = _Sums()
        b.add(x, keep)
        self.observed += 1

    def forget(self, request_id: str) -> None:
        """Drop a request that will not complete (failed, never dispatched)."""
        self._open.pop(request_id, None)

    def report(self) -> dict[str, float | int]:
        """For results files: completions learned from, tenants and buckets known, fleet mean."""
        return {"observed": self.observed, "tenants": len(self._tenant), "buckets": len(self._bucket),
                "fleet_mean_tokens": round(self._fleet.shrunk(self.p.prior_tokens, self.p.prior_weight), 3)}
