"""A scored pick's decision scores as the lists they were computed from (`ScoreRows`), and
`winning_scores`: what a driver records of a decision, the chosen worker's entries.

`vector.ScoreTable` is the `Mapping` a decision carries (`RoutingDecision.scores`); it keeps its
entries here. This module is compiled (setup.py `COMPILED`, which a `Mapping` subclass cannot be),
so the simulator's per-decision read of the winning entries runs natively.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from typing import Any, Final

from fleetwise.core.views import RoutingDecision

__all__ = ["SCORE_DIGITS", "ScoreRows", "rounded", "winning_scores"]

SCORE_DIGITS: Final = 6
"""Decimal places of a decision's scores (`round(v, 6)`)."""
SCALE: Final = 10.0 ** SCORE_DIGITS
"""`10 ** SCORE_DIGITS`, an exact double."""
SCALED_LIMIT: Final = 2.0 ** 30
"""Largest scaled magnitude `clear_nearest` rounds itself: below it the scaling's rounding error
(half an ulp, at most 2 ** -23) stays under `TIE_MARGIN`."""
TIE_MARGIN: Final = 1e-6
"""How near a half (in units of the last kept digit) the builtin `round` or formatting decides instead."""


def clear_nearest(y: float) -> float:
    """The nearest integer to a scaled `y` (as a float: exact below `SCALED_LIMIT`), or NaN where
    `y` is within `TIE_MARGIN` of a half or out of range: there the caller's builtin decides.
    Away from a tie it is the correctly rounded decimal `round` and `.Nf` formatting give."""
    if -SCALED_LIMIT < y < SCALED_LIMIT:
        n = math.floor(y)
        frac = y - n
        if abs(frac - 0.5) > TIE_MARGIN:
            return float(n + 1) if frac > 0.5 else float(n)
    return math.nan


def rounded(x: float) -> float:
    """`round(x, SCORE_DIGITS)`, the same double, without the builtin's decimal conversion where
    `x * SCALE` is clearly not a tie (`clear_nearest`): `n / SCALE` (both exact doubles, one
    correctly rounded division) is then the double nearest `n * 10 ** -SCORE_DIGITS`, what `round`
    returns. Ties, NaN, infinities and huge values take the builtin; a zero keeps `x`'s sign, as
    `round` does."""
    n = clear_nearest(x * SCALE)
    if n == n:  # not NaN
        return n / SCALE if n != 0 else math.copysign(0.0, x)
    return round(x, SCORE_DIGITS)


class ScoreRows:
    """`<worker>` -> its weighted total, then `<worker>.<scorer>` for each scorer, over the
    workers the load bound kept, kept as lists and rounded to `SCORE_DIGITS` places when read
    (`rounded`)."""

    __slots__ = ("names", "scorers", "keys", "where", "kept", "columns")

    def __init__(self, names: list[str], scorers: dict[str, int], keys: list[list[str]],
                 where: dict[str, tuple[int, int]], kept: list[int] | None, columns: list[list[float]]) -> None:
        self.names = names
        """Every worker's name (the view's order)."""
        self.scorers = scorers
        """Scorer name -> its column."""
        self.keys = keys
        """Per scorer (in column order), every worker's `<worker>.<scorer>` key."""
        self.where = where
        """Key -> (column, worker index): column 0 the totals, k the k-th scorer's."""
        self.kept = kept
        """Ascending indices of the workers the columns hold (None: every worker)."""
        self.columns = columns
        """The totals, then each scorer's scores: one element per kept worker."""

    def get(self, key: str, default: Any = None) -> Any:
        """`key`'s score (rounded), or `default` without the key."""
        at = self.where.get(key)
        if at is None:
            return default
        col, i = at
        j = self._at(i)
        return default if j < 0 else rounded(self.columns[col][j])

    def _at(self, i: int) -> int:
        """Worker index `i`'s position in the columns (-1: not kept)."""
        kept = self.kept
        if kept is None:
            return i
        j = bisect.bisect_left(kept, i)
        return j if j < len(kept) and kept[j] == i else -1

    def row(self, worker: str, scorers: tuple[str, ...]) -> dict[str, float] | None:
        """`winning_scores` of `worker`: `total` and each of `scorers` with an entry
        (`<worker>` and `<worker>.<scorer>`), read as `get` reads them; None when `worker` has
        no total here (the caller reads the mapping itself)."""
        at = self.where.get(worker)
        if at is None or at[0] != 0:
            return None
        i = at[1]
        j = self._at(i)
        if j < 0:
            return None
        cols, where = self.columns, self.where
        out = {"total": rounded(cols[0][j])}
        for s in scorers:
            col = self.scorers.get(s)
            if col is not None and where.get(self.keys[col - 1][i]) == (col, i):
                out[s] = rounded(cols[col][j])  # key = f"{worker}.{s}", built once per view
            else:
                v = self.get(f"{worker}.{s}")
                if v is not None:
                    out[s] = v
        return out

    def as_dict(self) -> dict[str, float]:
        """Every entry, totals first, then each scorer's, as a dict."""
        kept = self.kept
        d: dict[str, float] = {}
        for keys, col in zip([self.names, *self.keys], self.columns, strict=True):
            ks = keys if kept is None else [keys[i] for i in kept]
            d.update(zip(ks, [rounded(v) for v in col], strict=True))
        return d


def winning_scores(d: RoutingDecision, scorers: tuple[str, ...]) -> dict[str, float]:
    """The chosen worker's scores in `d.scores`: `total` (the worker's, or the
    `prefill->decode` pair's), then each of `scorers` with a `<worker>.<scorer>` entry."""
    if d.worker is None:
        return {}
    sc = d.scores
    if isinstance(sc, dict):  # a plain dict (round-robin's totals): read natively, no attribute lookup that fails
        return _entries(sc, d.worker, d.prefill_worker, scorers)
    rows = getattr(sc, "rows", None)  # a `vector.ScoreTable`'s entries
    if isinstance(rows, ScoreRows):
        if d.prefill_worker is None:
            row = rows.row(d.worker, scorers)
            if row is not None:
                return row
        return _entries(rows, d.worker, d.prefill_worker, scorers)  # the table's entries, read natively
    return _entries(sc, d.worker, d.prefill_worker, scorers)


def _entries(src: ScoreRows | dict[str, Any] | Mapping[str, Any], worker: str, prefill: str | None,
             scorers: tuple[str, ...]) -> dict[str, float]:
    """`winning_scores` read entry by entry (`_get`: a P/D pair decision reads seven entries)."""
    key = worker if prefill is None else f"{prefill}->{worker}"
    out: dict[str, float] = {}
    total = _get(src, key)
    if total is not None:
        out["total"] = total
    for s in scorers:
        v = _get(src, f"{worker}.{s}")
        if v is not None:
            out[s] = v
    return out


def _get(src: ScoreRows | dict[str, Any] | Mapping[str, Any], key: str) -> Any:
    """`src.get(key)`: a dict's and a `ScoreRows`' as native calls, not calls of a bound method
    (another `Mapping`'s through its method)."""
    if isinstance(src, dict):
        return src.get(key)
    return src.get(key)
