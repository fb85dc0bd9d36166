"""`Columns`: a decision's candidates' signals, one list per signal, as every scorer reads them.

A scorer plugin (`fleetwise.routing.plugins`) maps `Columns` to the scores of the workers a
decision kept, all of them in one call. The module is compiled with mypyc (setup.py `COMPILED`):
the policy builds one `Columns` per scored side and the compiled scorers read its fields
natively; an uncompiled plugin builds and reads it as the ordinary dataclass it also is
(`routing.vector` re-exports it, where plugins import it from).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetwise.core.views import WorkerView

__all__ = ["VIEW_ONLY_SCORERS", "Columns"]


@dataclass(slots=True, init=False)
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

    def __init__(self, load: list[float], own: list[float], slowness: list[float], requests: list[int],
                 prefix: list[int] | None, kv_usage: list[float], n_hashes: int, kept: list[int],
                 views: list[WorkerView], weight: list[float] | None = None,
                 kv_room: list[float] | None = None) -> None:
        # Its own `__init__`, compiled to plain stores (the generated one runs interpreted: core/views.py).
        self.load, self.own, self.slowness, self.requests, self.prefix = load, own, slowness, requests, prefix
        self.kv_usage, self.n_hashes, self.kept, self.views = kv_usage, n_hashes, kept, views
        self.weight, self.kv_room = weight, kv_room


VIEW_ONLY_SCORERS = frozenset({"kv"})
"""Scorers that read only what the view reports (`Columns.kv_usage`), worker by worker, and not
the request: computed once per view over every worker, then picked out for the workers each
decision keeps."""
