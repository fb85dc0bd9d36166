"""Array twins of the built-in scorers and of the decision scores' rounding: the policy's fast path.

Each function here computes, for many workers at once, exactly the floats its reference
computes one worker at a time: the references are the scorers of `fleetwise.routing.plugins`
and `round(v, SCORE_DIGITS)`. Only IEEE-754 operations that round once (+, -, *, /, min, max,
comparisons) are used on float64 arrays, so each element is the same double the scalar Python
expression gives; sums over workers stay Python `sum()` of lists (the references' order).
`tests/routing/test_vector.py` checks each twin against its reference.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SCORE_DIGITS", "VECTOR_SCORERS", "VIEW_ONLY_SCORERS", "Columns", "ScoreTable", "clamp01", "round_scores"]

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
    own: np.ndarray | float
    """One float when it is the same for every worker (no worker holds a cached prefix)."""
    slowness: np.ndarray
    requests: np.ndarray
    """int64"""
    prefix: np.ndarray | None
    """int64: leading blocks cached (None: none anywhere)"""
    kv_usage: np.ndarray
    n_hashes: int
    """Blocks in the request's prompt (`len(req.block_hashes)`)."""


def _load(c: Columns) -> np.ndarray:
    costs = (c.load + c.own) * c.slowness
    best = costs[costs.argmin()]  # = costs.min(): argmin finds the first NaN too
    if best > 0:  # every cost positive: `best / k` for each
        return clamp01(best / costs)
    positive = costs > 0
    q = np.divide(best, costs, out=np.ones(len(costs)), where=positive)  # no 0/0 computed
    return np.where(positive, clamp01(q), 1.0)


def _requests(c: Columns) -> np.ndarray:
    best = c.requests.min()
    return clamp01((best + 1) / (c.requests + 1))


def _prefix(c: Columns) -> np.ndarray:
    if not c.n_hashes or c.prefix is None:
        return np.zeros(len(c.load))
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

VIEW_ONLY_SCORERS = frozenset({"kv"})
"""Twins that read only what the view reports (`Columns.kv_usage`), element by element: computed
once per view over every worker, then indexed by the workers each decision keeps."""


class ScoreTable(Mapping[str, float]):
    """A scored pick's decision scores (`RoutingDecision.scores`) kept as the arrays they were
    computed from and rounded to `SCORE_DIGITS` places when read: `<worker>` -> its weighted
    total, then `<worker>.<scorer>` for each scorer, over the workers the load bound kept.

    The same mapping, key for key, value for value and in the same order, as the dict the
    reference builds (`ComposedPolicy._rounded_scores`): reading one entry rounds that one
    (`round(v, SCORE_DIGITS)` itself), iterating or comparing builds the whole dict once (by
    `round_scores`). A driver that reads only the chosen worker's entries
    (`routing.base.winning_scores`) never pays for the rest.
    """

    __slots__ = ("_names", "_keys", "_where", "_kept", "_kept_list", "_columns", "_dict")

    def __init__(self, names: list[str], keys: list[list[str]], where: Mapping[str, tuple[int, int]],
                 kept: np.ndarray | None, columns: list[np.ndarray]) -> None:
        self._names = names
        """Every worker's name (the view's order)."""
        self._keys = keys
        """Per scorer (in column order), every worker's `<worker>.<scorer>` key."""
        self._where = where
        """Key -> (column, worker index): column 0 the totals, k the k-th scorer's."""
        self._kept = kept
        """Ascending indices of the workers the columns hold (None: every worker)."""
        self._kept_list: list[int] | None = None
        self._columns = columns
        """The totals, then each scorer's scores: one element per kept worker."""
        self._dict: dict[str, float] | None = None

    def __getitem__(self, key: str) -> float:
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v

    def get(self, key: str, default: Any = None) -> Any:
        """`key`'s score (rounded), or `default` without the key."""
        if self._dict is not None:
            return self._dict.get(key, default)
        at = self._where.get(key)
        if at is None:
            return default
        col, i = at
        if self._kept is not None:
            kl = self._kept_list
            if kl is None:
                kl = self._kept_list = self._kept.tolist()
            j = bisect.bisect_left(kl, i)
            if j == len(kl) or kl[j] != i:
                return default
            i = j
        return round(float(self._columns[col][i]), SCORE_DIGITS)

    def as_dict(self) -> dict[str, float]:
        """The whole table as a dict (built once)."""
        if self._dict is None:
            kept = None if self._kept is None else self._kept.tolist()
            m = len(self._columns[0])
            rounded = round_scores(np.concatenate(self._columns))
            names = self._names if kept is None else [self._names[i] for i in kept]
            d = dict(zip(names, rounded[:m], strict=True))
            for k, keys in enumerate(self._keys, start=1):
                d.update(zip(keys if kept is None else [keys[i] for i in kept], rounded[k * m:(k + 1) * m],
                             strict=True))
            self._dict = d
        return self._dict

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ScoreTable):
            return self.as_dict() == other.as_dict()
        if isinstance(other, Mapping):
            return self.as_dict() == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.as_dict())

    def __reduce__(self) -> tuple[Any, ...]:
        return dict, (self.as_dict(),)
