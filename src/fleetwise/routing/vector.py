"""The shape scorers read (`Columns`: the candidates' signals, one list per signal) and the scores table.

Every scorer plugin (`fleetwise.routing.plugins`) maps `Columns` to the scores of the workers a
decision kept, all of them in one call, whichever path asks (a colocated pick, a P/D side, a
picker's totals).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fleetwise.core.views import WorkerView

__all__ = ["SCORE_DIGITS", "VIEW_ONLY_SCORERS", "Columns", "ScoreTable"]

SCORE_DIGITS = 6
"""Decimal places of a decision's scores (`round(v, 6)`)."""


@dataclass(slots=True)
class Columns:
    """The candidates' signals (`plugins.Candidate` fields), one element per worker of the view,
    and which of them a decision kept."""

    load: list[float]
    own: list[float]
    slowness: list[float]
    requests: list[int]
    prefix: list[int] | None
    """Leading blocks cached (None: none anywhere)."""
    kv_usage: list[float]
    n_hashes: int
    """Blocks in the request's prompt (`len(req.block_hashes)`)."""
    kept: list[int]
    """Ascending positions of the workers the load bound kept (the ones scored)."""
    views: list[WorkerView]
    """Each worker's view (what it reports: queues, KV, role, region...), for a scorer that reads
    a field no other column carries."""
    weight: list[float] | None = None
    """Each worker's relative capacity (None: every weight is 1)."""
    kv_room: list[float] | None = None
    """KV fraction left after admitting the request (decode candidates of a P/D fleet; None: 0 everywhere)."""


VIEW_ONLY_SCORERS = frozenset({"kv"})
"""Scorers that read only what the view reports (`Columns.kv_usage`), worker by worker, and not
the request: computed once per view over every worker, then picked out for the workers each
decision keeps."""


class ScoreTable(Mapping[str, float]):
    """A scored pick's decision scores (`RoutingDecision.scores`) kept as the lists they were
    computed from, rounded to `SCORE_DIGITS` places when read: `<worker>` -> its weighted
    total, then `<worker>.<scorer>` for each scorer, over the workers the load bound kept.

    The same mapping, key for key, value for value and in the same order, as a dict of the
    rounded totals followed by each scorer's rounded scores: reading one entry rounds that one,
    iterating or comparing builds the whole dict once. A driver that reads only the chosen
    worker's entries (`routing.base.winning_scores`) never pays for the rest.
    """

    __slots__ = ("_names", "_scorers", "_keys", "_where", "_kept", "_columns", "_dict")

    def __init__(self, names: list[str], scorers: Mapping[str, int], keys: list[list[str]],
                 where: Mapping[str, tuple[int, int]], kept: list[int] | None, columns: list[list[float]]) -> None:
        self._names = names
        """Every worker's name (the view's order)."""
        self._scorers = scorers
        """Scorer name -> its column."""
        self._keys = keys
        """Per scorer (in column order), every worker's `<worker>.<scorer>` key."""
        self._where = where
        """Key -> (column, worker index): column 0 the totals, k the k-th scorer's."""
        self._kept = kept
        """Ascending indices of the workers the columns hold (None: every worker)."""
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
        kept = self._kept
        if kept is not None:
            j = bisect.bisect_left(kept, i)
            if j == len(kept) or kept[j] != i:
                return default
            i = j
        return round(self._columns[col][i], SCORE_DIGITS)

    def row(self, worker: str, scorers: tuple[str, ...]) -> dict[str, float] | None:
        """`routing.base.winning_scores` of `worker`: `total` and each of `scorers` the table
        has an entry for (`<worker>` and `<worker>.<scorer>`), read as `get` reads them; None
        when `worker` has no total here (the caller reads the mapping itself)."""
        at = self._where.get(worker)
        j = -1
        if self._dict is None and at is not None and at[0] == 0:  # the worker's own entry: its position
            i = at[1]
            kept = self._kept
            j = i if kept is None else bisect.bisect_left(kept, i)
            if kept is not None and (j == len(kept) or kept[j] != i):
                j = -1
        if j < 0:
            return None
        cols, where, i = self._columns, self._where, at[1]  # type: ignore[index]
        out = {"total": round(cols[0][j], SCORE_DIGITS)}
        for s in scorers:
            col = self._scorers.get(s)
            if col is not None and where.get(self._keys[col - 1][i]) == (col, i):
                out[s] = round(cols[col][j], SCORE_DIGITS)  # key = f"{worker}.{s}", built once per view
            else:
                v = self.get(f"{worker}.{s}")
                if v is not None:
                    out[s] = v
        return out

    def as_dict(self) -> dict[str, float]:
        """The whole table as a dict (built once)."""
        if self._dict is None:
            kept = self._kept
            d: dict[str, float] = {}
            for keys, col in zip([self._names, *self._keys], self._columns, strict=True):
                ks = keys if kept is None else [keys[i] for i in kept]
                d.update(zip(ks, [round(v, SCORE_DIGITS) for v in col], strict=True))
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
