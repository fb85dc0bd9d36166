"""The shape scorers read (`Columns`: the candidates' signals, one list per signal) and the scores table.

Every scorer plugin (`fleetwise.routing.plugins`) maps `Columns` to the scores of the workers a
decision kept, all of them in one call, whichever path asks (a colocated pick, a P/D side, a
picker's totals).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fleetwise.core.views import WorkerView
from fleetwise.routing.score_rows import SCORE_DIGITS, ScoreRows

__all__ = ["SCORE_DIGITS", "VIEW_ONLY_SCORERS", "Columns", "ScoreTable"]

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
    computed from (`score_rows.ScoreRows`), rounded to `SCORE_DIGITS` places when read:
    `<worker>` -> its weighted total, then `<worker>.<scorer>` for each scorer, over the workers
    the load bound kept.

    The same mapping, key for key, value for value and in the same order, as a dict of the
    rounded totals followed by each scorer's rounded scores: reading one entry rounds that one,
    iterating or comparing builds the whole dict once. A driver that reads only the chosen
    worker's entries (`routing.base.winning_scores`) never pays for the rest.
    """

    __slots__ = ("rows", "_dict")

    def __init__(self, names: list[str], scorers: Mapping[str, int], keys: list[list[str]],
                 where: Mapping[str, tuple[int, int]], kept: list[int] | None, columns: list[list[float]]) -> None:
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
