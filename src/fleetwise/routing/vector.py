"""Array twins of the built-in scorers and of the decision scores' rounding: the policy's fast path.

Each function here computes, for many workers at once, exactly the floats its reference
computes one worker at a time: the references are the scorers of `fleetwise.routing.plugins`
and `round(v, SCORE_DIGITS)`. Only IEEE-754 operations that round once (+, -, *, /, min, max,
comparisons) are used on float64 arrays, so each element is the same double the scalar Python
expression gives; sums over workers stay Python `sum()` of lists (the references' order).
`tests/routing/test_vector.py` checks each twin against its reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["SCORE_DIGITS", "VECTOR_SCORERS", "Columns", "clamp01", "round_scores"]

SCORE_DIGITS = 6
"""Decimal places of a decision's scores (`round(v, 6)` in the reference)."""
_SCALE = 10.0**SCORE_DIGITS
"""10^6, exact in binary64."""
_EXACT_RINT = 2.0**50
"""Scaled values below this are integers or have a fractional part in binary64 (2^52 is where the
spacing reaches 1); beyond it the scalar rounding takes over."""
_TIE_MARGIN = 2.0**-48
"""Relative distance from a half-integer under which the scaled product (one rounding, relative
error <= 2^-53) could sit on the other side of the tie than the exact value: those elements are
rounded by the scalar reference instead."""


def round_scores(x: np.ndarray) -> list[float]:
    """`[round(float(v), 6) for v in x]`, vectorised.

    `round(v, 6)` is the double nearest to `n / 10^6`, n the exact `v * 10^6` rounded half to
    even. Away from a tie, `rint(fl(v * 1e6))` is that n (the product's one rounding cannot cross
    a half-integer further than its relative error), and `n / 1e6` divides two exact doubles with
    one correct rounding: the double nearest to `n / 10^6`. Elements near a tie, huge or not
    finite are rounded by `round` itself.
    """
    if not (np.abs(x) < _EXACT_RINT / _SCALE).all():  # huge or not finite somewhere: the scalar reference
        return [round(v, SCORE_DIGITS) for v in x.tolist()]
    y = x * _SCALE
    ay = np.abs(y)
    n = np.rint(y)
    risky = np.abs(np.abs(y - n) - 0.5) <= ay * _TIE_MARGIN
    out: list[float] = (n / _SCALE).tolist()
    if risky.any():
        for i in np.flatnonzero(risky).tolist():
            out[i] = round(float(x[i]), SCORE_DIGITS)
    return out


def clamp01(x: np.ndarray) -> np.ndarray:
    """`plugins._clamp01` per element: 0 unless > 0 (NaN counts as 0), at most 1."""
    return np.where(x > 0, np.minimum(x, 1.0), 0.0)


@dataclass(slots=True)
class Columns:
    """The candidates' signals (`plugins.Candidate` fields) as arrays, one element per worker."""

    load: np.ndarray
    own: np.ndarray
    slowness: np.ndarray
    requests: np.ndarray
    """int64"""
    prefix: np.ndarray
    """int64: leading blocks cached"""
    kv_usage: np.ndarray
    n_hashes: int
    """Blocks in the request's prompt (`len(req.block_hashes)`)."""


def _load(c: Columns) -> np.ndarray:
    costs = (c.load + c.own) * c.slowness
    positive = costs > 0
    q = np.divide(costs.min(), costs, out=np.ones(len(costs)), where=positive)  # no 0/0 computed
    return np.where(positive, clamp01(q), 1.0)


def _requests(c: Columns) -> np.ndarray:
    best = c.requests.min()
    return clamp01((best + 1) / (c.requests + 1))


def _prefix(c: Columns) -> np.ndarray:
    if not c.n_hashes:
        return np.zeros(len(c.prefix))
    return clamp01(c.prefix / c.n_hashes)


def _kv(c: Columns) -> np.ndarray:
    return clamp01(1.0 - c.kv_usage)


def _feedback(c: Columns) -> np.ndarray:
    best = c.slowness.min()
    return clamp01(best / c.slowness)


VECTOR_SCORERS: dict[str, Callable[[Columns], np.ndarray]] = {
    "load": _load, "requests": _requests, "prefix": _prefix, "kv": _kv, "feedback": _feedback,
}
"""The array twin of each built-in scorer (a scorer plugin without one is served by the reference)."""
