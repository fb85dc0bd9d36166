"""The per-worker loops of a routing decision, over plain lists: the one implementation of each.

For every worker (or every worker in `kept`) at once: the feedback slowness factor
(`LatencyFeedback.factors`), the load bound (`ComposedPolicy._bounded`), the built-in scorers'
loops (the `plugins` scorers call them), the weighted totals, the tie of a `max` pick
(`PickerState.max`). Sums are the builtin `sum` over a list, in worker order, and each result is
the same double a per-candidate reading gives: tests/routing/reference_policy.py and
reference_scorers.py keep those readings, and tests/routing/test_vector.py and test_fast_path.py
check every function and whole runs of decisions against them.

Written as typed Python over lists so that mypyc compiles the module to native loops
(`math.pow`, `math.log` and `math.exp` then call the C library directly, as CPython's do); run
as it is, it is plain Python with the same results.
"""

from __future__ import annotations

import math

__all__ = ["bounded", "clamped", "left_out", "load_scores", "min_ratio_scores", "picked", "prefix_scores",
           "slowness", "tied", "totals"]


def slowness(now_s: float, half_life_s: float, last_obs: list[float], has1: list[bool], ref1: list[float],
             dev1: list[float], has2: list[bool], ref2: list[float], dev2: list[float], failure: list[float],
             lo: float, hi: float, band: float) -> list[float]:
    """`LatencyFeedback.factors`: per worker, each ratio term it has (`has1`, `has2`)
    `(ref + dev * decay) / ref`, decay `0.5 ** (age / half_life_s)`, their geometric mean (a
    ratio of 0 left out; 1 without any) times `failure`, clamped to `[lo, hi]`, exactly 1 within
    `band` of 1."""
    n = len(last_obs)
    out = [1.0] * n  # filled in place: one list, one float per worker
    for i in range(n):
        h1 = has1[i]
        h2 = has2[i]
        f = 1.0
        if h1 or h2:
            age = now_s - last_obs[i]
            decay = math.pow(0.5, (age if age > 0.0 else 0.0) / half_life_s)  # `0.5 ** x`: C pow either way
            m = 0
            acc = 0.0
            if h1:
                ref = ref1[i]
                r = (ref + dev1[i] * decay) / ref
                if r != 0.0:
                    m = 1
                    acc = math.log(r)
            if h2:
                ref = ref2[i]
                r = (ref + dev2[i] * decay) / ref
                if r != 0.0:
                    m += 1
                    acc = acc + math.log(r)
            if m:
                f = math.exp(acc / m)
        f *= failure[i]
        f = lo if lo > f else f  # min(max(f, lo), hi)
        f = hi if hi < f else f
        if not abs(f - 1.0) < band:
            out[i] = f
    return out


def bounded(load: list[float], own: list[float], slow: list[float], c: float, tol: float,
            counts: list[int] | None, k: int) -> tuple[float, list[int]]:
    """The load bound: the token bound `c * mean(load * slow)` and the indices of the
    workers within it (`load * slow <= bound + own * slow + tol`); with `counts` (each worker's
    work, tokens, among the recent picks, which total `k` tokens) only those also within their
    share (`counts <= c * (k + own) * speed / sum(speed)`, speed `1 / slow`) if any is."""
    n = len(load)
    total = 0.0  # `sum` of the products in worker order: the same double, without the list
    speeds = 0.0  # and of the speeds `1 / slow`, for the share check
    share_check = counts is not None
    for i in range(n):
        s = slow[i]
        total += load[i] * s
        if share_check:
            speeds += 1.0 / s
    bound = c * (total / n)
    kept: list[int] = []
    for i in range(n):
        s = slow[i]
        if load[i] * s <= bound + own[i] * s + tol:
            kept.append(i)
    if counts is not None:
        both: list[int] = []
        for i in kept:
            if counts[i] <= c * (k + own[i]) * (1.0 / slow[i]) / speeds:
                both.append(i)
        if both:
            kept = both
    return bound, kept


def clamped(x: float) -> float:
    """`plugins._clamp01`: 0 unless > 0 (NaN counts as 0), at most 1."""
    return 0.0 if not x > 0 else (x if x < 1.0 else 1.0)


def load_scores(load: list[float], own: list[float], slow: list[float], kept: list[int]) -> list[float]:
    """`plugins.score_load`'s loop over the `kept` workers: `min cost / cost`, cost `(load + own) * slow`."""
    costs: list[float] = []
    best = math.inf
    first = True
    for i in kept:
        x = (load[i] + own[i]) * slow[i]
        costs.append(x)
        if first or x < best:  # `min`: the first of equal costs, a NaN only where it comes first
            best = x
            first = False
    out: list[float] = []
    for x in costs:
        out.append(clamped(best / x) if x > 0 else 1.0)
    return out


def min_ratio_scores(xs: list[float], kept: list[int]) -> list[float]:
    """`min x / x` of the `kept` workers, clamped: `plugins.score_requests` (x = (requests + 1) /
    weight) and `plugins.score_feedback` (x = slowness)."""
    sub = [xs[i] for i in kept]
    best = min(sub)
    return [clamped(best / x) for x in sub]


def prefix_scores(prefix: list[int], n_hashes: int, kept: list[int]) -> list[float]:
    """`plugins.score_prefix`'s loop over the `kept` workers: cached fraction of the prompt's blocks."""
    if not n_hashes:
        return [0.0] * len(kept)
    return [clamped(prefix[i] / n_hashes) for i in kept]


def totals(per: list[list[float]], weights: list[float]) -> list[float]:
    """The weighted totals: `0 + w1 * s1 + w2 * s2 ...` per worker, in scorer order."""
    m = len(per)
    c0, w0 = per[0], weights[0]
    c1, w1 = (per[1], weights[1]) if m > 1 else (c0, 0.0)  # the first columns held as locals (unused: m says)
    c2, w2 = (per[2], weights[2]) if m > 2 else (c0, 0.0)
    out: list[float] = []
    for j in range(len(c0)):  # worker by worker: one float per worker, the terms in scorer order
        t = 0.0 + w0 * c0[j]
        if m > 1:
            t = t + w1 * c1[j]
            if m > 2:
                t = t + w2 * c2[j]
                for k in range(3, m):
                    t = t + weights[k] * per[k][j]
        out.append(t)
    return out


def tied(xs: list[float], tol: float) -> list[int]:
    """Positions of the totals within `tol` of the highest (`PickerState.max`'s tie)."""
    best = xs[0]
    for x in xs:  # `max`: the first of equal totals
        if x > best:
            best = x
    floor = best - tol
    out: list[int] = []
    for j in range(len(xs)):
        if xs[j] >= floor:
            out.append(j)
    return out


def picked(xs: list[float], kept: list[int]) -> list[float]:
    """`[xs[i] for i in kept]`."""
    return [xs[i] for i in kept]


def left_out(names: list[str], kept: list[int]) -> list[str]:
    """The names whose positions are not in `kept` (ascending), in order."""
    out: list[str] = []
    j = 0
    m = len(kept)
    for i in range(len(names)):
        if j < m and kept[j] == i:
            j += 1
        else:
            out.append(names[i])
    return out
