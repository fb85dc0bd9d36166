"""Cost of k fused decode passes (`Step.num_passes` > 1).

Owns one question: given the first pass of a decode-only batch (n sequences, kv0 KV positions
read) and a cap on passes, how many passes fit in a time horizon, and how long do they take?
Pass i reads kv0 + n*i positions (each sequence's context grows by one per pass), so its shape
is `BatchShape(n, n, kv0 + n*i, kv0 + n*i, 0, 1)`.

When step time is affine in the KV read (as roofline decode costs are), the total is exact in
closed form: T(k) = k*d0 + s*k*(k-1)/2 with s the per-pass slope, checked on the last pass and a
middle one (for a convex cost, agreement at an interior point implies affinity on the segment).
Otherwise the passes are summed one by one.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetwise.perf.types import BatchShape

AFFINE_RTOL = 1e-12


def decode_shape(n: int, kv: int) -> BatchShape:
    return BatchShape(n, n, kv, float(kv), 0, 1)


def fuse(step_time: Callable[[BatchShape], float], n: int, kv0: int, d0: float, cap: int,
         horizon_s: float) -> tuple[int, float]:
    """(passes, total seconds): the most passes <= cap whose total stays within `horizon_s`
    (at least one), given `d0` = step_time of the first pass."""
    if cap <= 1:
        return 1, d0
    last = cap - 1
    dl = step_time(decode_shape(n, kv0 + n * last))
    affine = True
    if cap > 2:
        i = last // 2
        dm = step_time(decode_shape(n, kv0 + n * i))
        affine = abs(dm - (d0 + (dl - d0) * i / last)) <= AFFINE_RTOL * max(abs(d0), abs(dl))
    if not affine:
        return _summed(step_time, n, kv0, d0, cap, horizon_s)
    slope = (dl - d0) / last
    if cap * (d0 + dl) / 2 <= horizon_s:
        return cap, cap * (d0 + dl) / 2
    lo, hi = 1, cap  # total(lo) fits or lo == 1; total(hi) does not fit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mid * d0 + slope * mid * (mid - 1) / 2 <= horizon_s:
            lo = mid
        else:
            hi = mid
    return lo, lo * d0 + slope * lo * (lo - 1) / 2


def _summed(step_time: Callable[[BatchShape], float], n: int, kv0: int, d0: float, cap: int,
            horizon_s: float) -> tuple[int, float]:
    total = d0
    for i in range(1, cap):
        d = step_time(decode_shape(n, kv0 + n * i))
        if total + d > horizon_s:
            return i, total
        total += d
    return cap, total
