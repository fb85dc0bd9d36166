"""Cost of k fused decode passes (`Step.num_passes` > 1).

Owns one question: given the first pass of a decode-only batch (n sequences, kv0 KV positions
read) and a cap on passes, how many passes fit in a time horizon, and how long do they take?
Pass i reads kv0 + n*i positions (each sequence's context grows by one per pass), so its shape
is `BatchShape(n, n, kv0 + n*i, kv0 + n*i, 0, 1)`.

When step time is affine in the KV read (as roofline decode costs are), the total is exact in
closed form: T(k) = k*d0 + s*k*(k-1)/2 with s the per-pass slope, checked on the last pass and a
middle one (for a convex cost, agreement at an interior point implies affinity on the segment).
Otherwise the passes are summed one by one.

Two horizons bound the passes (both relative to the step's start):
- `horizon_s` (hard): the passes must end by then (at least one pass runs). The simulator uses
  it for boundaries no pass may straddle (a slowdown starting).
- `soft_s`: new work arrives then. Between single passes it would join at the end of the pass
  that is running when it arrives, so the fused step may include that pass and stops there: the
  smallest k with T(k) > soft_s. This matches unfused timing and saves a step per arrival.

`Fused` keeps the per-pass times so a driver can ask how many passes had ended at a given
time into the step (`passes_by`) and the engine can shorten the step when work arrives that was
not known when it was formed (`Engine.cut`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fleetwise.perf.types import BatchShape

AFFINE_RTOL = 1e-12

DecodeTimeFn = Callable[[int, int, int], float]
"""Seconds of a decode-only pass: (rows n, KV read kv, longest row's KV read or 0) ->
`step_time(decode_shape(n, kv, longest))` (a perf model may answer it without the shape)."""


BatchTimeFn = Callable[[int, int, int, float, int, int, int], float]
"""Seconds of any pass from its `BatchShape` fields, in order (n, new, kv, pairs, pre, mx,
longest) -> `step_time(BatchShape(...))` (a perf model may answer it without the shape)."""


def batch_time_of(step_time: Callable[[BatchShape], float]) -> BatchTimeFn:
    """A `BatchTimeFn` from a step-time function (through `BatchShape`)."""

    def batch_time(n: int, new: int, kv: int, pairs: float, pre: int, mx: int, longest: int) -> float:
        return step_time(BatchShape(n, new, kv, pairs, pre, mx, longest))

    return batch_time


def decode_shape(n: int, kv: int, longest: int = 0) -> BatchShape:
    return BatchShape(n, n, kv, float(kv), 0, 1, longest)


def decode_time_of(step_time: Callable[[BatchShape], float]) -> DecodeTimeFn:
    """A `DecodeTimeFn` from a step-time function (through `decode_shape`)."""

    def decode_time(n: int, kv: int, longest: int) -> float:
        return step_time(decode_shape(n, kv, longest))

    return decode_time


class Fused:
    """The pass times of one fused decode step: cumulative T(k) for k = 0..cap.

    Affine costs keep (d0, slope, dl) and evaluate T(k) in closed form; others keep the
    cumulative sums computed so far in `cum` (cum[k] = T(k)).
    """

    __slots__ = ("cap", "d0", "dl", "slope", "cum", "passes", "duration_s")

    def __init__(self, cap: int, d0: float, dl: float, slope: float | None, cum: list[float] | None) -> None:
        self.cap, self.d0, self.dl, self.slope, self.cum = cap, d0, dl, slope, cum
        self.passes = 1
        self.duration_s = d0

    def total(self, k: int) -> float:
        """Seconds of the first k passes (k <= the passes computed)."""
        if self.cum is not None:
            return self.cum[k]
        if k == self.cap:
            return k * (self.d0 + self.dl) / 2
        assert self.slope is not None
        return k * self.d0 + self.slope * k * (k - 1) / 2

    def count_le(self, x: float, upto: int) -> int:
        """Largest k in [0, upto] with T(k) <= x (T is increasing)."""
        d0 = self.d0
        if x < d0:
            return 0
        if self.total(upto) <= x:
            return upto
        lo, hi = 1, upto  # T(lo) <= x < T(hi)
        slope, cum = self.slope, self.cum
        if cum is None and slope is not None and slope >= 0.0 and hi - lo > 2:
            return _affine_count_le(d0, slope, x, upto)
        while hi - lo > 1:
            mid = (lo + hi) // 2  # < cap: the closed form below is `total(mid)`
            t = cum[mid] if cum is not None else mid * d0 + slope * mid * (mid - 1) / 2  # type: ignore[operator]
            if t <= x:
                lo = mid
            else:
                hi = mid
        return lo

    def passes_by(self, elapsed_s: float) -> int:
        """Passes of this step that have ended `elapsed_s` after its start."""
        return self.count_le(elapsed_s, self.passes)

    def set_passes(self, k: int) -> None:
        self.passes = k
        self.duration_s = self.total(k)


def _affine_count_le(d0: float, slope: float, x: float, upto: int) -> int:
    """`Fused.count_le` of an affine step between its bounds (T(1) = d0 <= x < T(upto)): the
    largest k < upto with k*d0 + slope*k*(k-1)/2 <= x, found from the real root of the quadratic
    and then checked with the very expression the bisection evaluates. That expression does not
    decrease with k (d0, slope >= 0; rounding keeps order), so the answer is the bisection's."""
    if slope > 0.0:
        b = d0 - slope / 2
        guess = (math.sqrt(b * b + 2.0 * slope * x) - b) / slope
    else:
        guess = x / d0
    k = int(guess) if 1.0 <= guess < upto else (1 if not guess >= 1.0 else upto - 1)
    while k + 1 < upto and (k + 1) * d0 + slope * (k + 1) * k / 2 <= x:
        k += 1
    while k > 1 and k * d0 + slope * k * (k - 1) / 2 > x:
        k -= 1
    return k


def plan_fused(decode_time: DecodeTimeFn, n: int, kv0: int, d0: float, cap: int,
               horizon_s: float, soft_s: float = math.inf, longest0: int = 0) -> Fused:
    """The fused step: the most passes <= cap ending by `horizon_s` (at least one) and not past
    the pass that straddles `soft_s`; `d0` = decode_time of the first pass; `longest0` = the
    longest decode row's KV read in the first pass (0: unknown), growing by one per pass."""
    grow = 1 if longest0 > 0 else 0
    if cap <= 1:
        f = Fused(1, d0, d0, 0.0, None)
        return f
    last = cap - 1
    dl = decode_time(n, kv0 + n * last, longest0 + grow * last)
    affine = True
    if cap > 2:
        i = last // 2
        dm = decode_time(n, kv0 + n * i, longest0 + grow * i)
        affine = abs(dm - (d0 + (dl - d0) * i / last)) <= AFFINE_RTOL * max(abs(d0), abs(dl))
    if not affine:
        return _summed(decode_time, n, kv0, d0, cap, horizon_s, soft_s, longest0)
    f = Fused(cap, d0, dl, (dl - d0) / last, None)
    k = cap
    if soft_s < math.inf:
        k = min(k, f.count_le(soft_s, cap) + 1)
    if horizon_s < math.inf:
        k = min(k, max(1, f.count_le(horizon_s, k)))
    f.set_passes(k)
    return f


def fuse(step_time: Callable[[BatchShape], float], n: int, kv0: int, d0: float, cap: int,
         horizon_s: float, soft_s: float = math.inf, longest0: int = 0) -> tuple[int, float]:
    """(passes, total seconds) of `plan_fused`, for a step-time function."""
    f = plan_fused(decode_time_of(step_time), n, kv0, d0, cap, horizon_s, soft_s, longest0)
    return f.passes, f.duration_s


def _summed(decode_time: DecodeTimeFn, n: int, kv0: int, d0: float, cap: int,
            horizon_s: float, soft_s: float, longest0: int = 0) -> Fused:
    grow = 1 if longest0 > 0 else 0
    cum = [0.0, d0]
    total = d0
    k = cap
    for i in range(1, cap):
        if total > soft_s:
            k = i
            break
        d = decode_time(n, kv0 + n * i, longest0 + grow * i)
        if total + d > horizon_s:
            k = i
            break
        total += d
        cum.append(total)
    f = Fused(len(cum) - 1, d0, d0, None, cum)
    f.set_passes(k)
    return f
