"""Uncertainty of a predicted step time: a band from the calibration's held-out residuals.

Owns the residual record a calibration keeps (`Residual`: the shape of a measured step and the
model's error on it when the fit had not seen that shape), the nearness of step shapes, and the
band a prediction carries (`Band`): the spread of the held-out errors of the `NEIGHBOURS` measured
shapes nearest to the one asked. Does not fit (see `calibrate`, which fills `Profile.residuals`)
or price steps (see `roofline`).

Nearness is measured on what sets a step's cost: log2 of its new tokens (GEMM rows), log2 of the
mean KV positions a sequence reads, and the share of prompt-chunk tokens, weighted so that a
prefill is never the nearest neighbour of a decode (`PREFILL_SHARE_WEIGHT`). A shape far beyond
every measured one borrows the band of the measured extremes: the band says how well the model did
on the nearest shapes it was checked on, not a bound on extrapolation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetwise.perf.types import BatchShape

NEIGHBOURS = 5
"""Measured shapes whose held-out errors make a band: about one shape-fold's share of a kind on the
shipped grid (44 shapes, 5 folds), enough for a spread, few enough to stay local."""
PREFILL_SHARE_WEIGHT = 8.0
"""Distance of a full prompt-chunk share, in log2 units: larger than the token span of the shipped
grid (1 to 32,768 tokens, 15 log2 units) divided by two, so kinds of step stay apart."""


@dataclass(frozen=True, slots=True)
class Residual:
    """One measured step's shape features and the model's held-out error on it (predicted/measured - 1)."""

    log_tokens: float
    log_context: float
    prefill_share: float
    error: float

    def as_list(self) -> list[float]:
        """`[log_tokens, log_context, prefill_share, error]`, as a profile stores it."""
        return [round(self.log_tokens, 4), round(self.log_context, 4), round(self.prefill_share, 4),
                round(self.error, 5)]


def features(shape: BatchShape) -> tuple[float, float, float]:
    """(log2 new tokens, log2 mean KV positions read per sequence, prompt-chunk share of the tokens)."""
    tokens = max(1, shape.new_tokens)
    seqs = max(1, shape.num_seqs)
    return (math.log2(tokens), math.log2(max(1.0, shape.kv_read_tokens / seqs)), shape.prefill_tokens / tokens)


def residual(shape: BatchShape, predicted_s: float, measured_s: float) -> Residual:
    """The record of one held-out prediction."""
    lt, lc, share = features(shape)
    return Residual(lt, lc, share, predicted_s / measured_s - 1.0)


@dataclass(frozen=True, slots=True)
class Band:
    """A predicted step time and the range the nearest measured shapes' held-out errors give it (seconds).

    `points` is how many residuals it rests on (0: the profile has none, so the band is the point)."""

    low_s: float
    mid_s: float
    high_s: float
    points: int

    def contains(self, seconds: float) -> bool:
        """Whether `seconds` lies inside the band (a decision at that threshold could flip)."""
        return self.low_s <= seconds <= self.high_s


def band(predicted_s: float, shape: BatchShape, residuals: list[Residual], k: int = NEIGHBOURS) -> Band:
    """`predicted_s` with the band of the `k` residuals nearest to `shape`: if the model ran e too slow on
    a neighbour (error e > 0) the truth may be predicted/(1+e), so the band spans those quotients."""
    if not residuals or predicted_s <= 0:
        return Band(predicted_s, predicted_s, predicted_s, 0)
    lt, lc, share = features(shape)

    def dist(r: Residual) -> float:
        return math.hypot(r.log_tokens - lt, r.log_context - lc, PREFILL_SHARE_WEIGHT * (r.prefill_share - share))

    near = sorted(residuals, key=dist)[:k]
    lows = [predicted_s / (1.0 + r.error) for r in near]
    return Band(min(min(lows), predicted_s), predicted_s, max(max(lows), predicted_s), len(near))


def residuals_of(stored: list[list[float]]) -> list[Residual]:
    """The residuals a profile stores (`Residual.as_list` rows)."""
    return [Residual(*row) for row in stored]


def threshold_note(what: str, b: Band, threshold_s: float, target: str) -> str:
    """One clause saying where `threshold_s` falls against band `b` of `what`: inside it, the decision
    that compares them could flip within the model's held-out error."""
    span = f"{what} {b.low_s * 1e3:.1f}-{b.high_s * 1e3:.1f} ms"
    if b.contains(threshold_s):
        return f"{span} straddles the {target} ({threshold_s * 1e3:.0f} ms): this decision could flip"
    side = "under" if b.high_s < threshold_s else "over"
    return f"{span}, all {side} the {target} ({threshold_s * 1e3:.0f} ms)"
