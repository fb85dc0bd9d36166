"""The shape scorers read (`Columns`: the candidates' signals, one list per signal) and the scores table.

Every scorer plugin (`fleetwise.routing.plugins`) maps `Columns` to the scores of the workers a
decision kept, all of them in one call, whichever path asks (a colocated pick, a P/D side, a
picker's totals). `Columns` is defined in `routing/signals.py`, which is compiled (this module
is not: `ScoreTable` is a `Mapping`); it is importable from here, where plugins have always read it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from fleetwise.routing.score_rows import SCORE_DIGITS, ScoreRows
from fleetwise.routing.signals import VIEW_ONLY_SCORERS, Columns

__all__ = ["SCORE_DIGITS", "VIEW_ONLY_SCORERS", "Columns", "ScoreTable"]


class ScoreTable(Mapping[str, float]):
    """A scored pick's decision scores (`RoutingDecision.scores`) kept as the lists they were
    computed from (`score_rows.ScoreRows`), rounded to `SCORE_DIGITS` places when read:
    `<worker>` -> its weighted total, then `<worker>.<scorer>` for each scorer, over the workers
    the load bound kept.

    The same mapping, key for key, value for value and in the same order, as a dict of the
    rounded totals followed by each scorer's rounded scores: reading one entry rounds that one,
    iterating or comparing builds the whole dict once. A driver that reads only the chosen
    worker's entries (`routing.base.winning_scores`) never pays for the rest.
    """

    __slots__ = ("rows", "_dict")

    def __init__(self, names: list[str], scorers: dict[str, int], keys: list[list[str]],
                 where: dict[str, tuple[int, int]], kept: list[int] | None, columns: list[list[float]]) -> None:
        self.rows = ScoreRows(names, scorers, keys, where, kept, columns)
        """The entries (`ScoreRows`: names, scorer columns, keys, kept positions, the lists)."""
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
        return self.rows.get(key, default)

    def row(self, worker: str, scorers: tuple[str, ...]) -> dict[str, float] | None:
        """`routing.base.winning_scores` of `worker` (`ScoreRows.row`)."""
        return self.rows.row(worker, scorers)

    def as_dict(self) -> dict[str, float]:
        """The whole table as a dict (built once)."""
        if self._dict is None:
            self._dict = self.rows.as_dict()
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
