"""Per-worker index of cached prefix blocks, keyed by chained block hashes, LRU-bounded.

Chained hashes mean an equal hash at position i implies an equal prompt up to block i, so a
worker can reuse the leading run of blocks it still holds. The index is fed from dispatch
decisions (optimistic: the worker will have computed the prompt) and from the engine's
`KvStored`/`KvEvicted` events when a driver reports them. It owns no timing and no load.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

__all__ = ["PrefixIndex"]


class PrefixIndex:
    """`match(worker, hashes)` = number of leading blocks of `hashes` the worker holds."""

    def __init__(self, max_blocks_per_worker: int = 65536) -> None:
        if max_blocks_per_worker <= 0:
            raise ValueError("max_blocks_per_worker must be positive")
        self.max_blocks = max_blocks_per_worker
        self._blocks: dict[str, OrderedDict[int, None]] = {}

    def insert(self, worker: str, hashes: Iterable[int]) -> None:
        """Record blocks as cached on `worker` (most recently used); evict the LRU past the cap."""
        lru = self._blocks.setdefault(worker, OrderedDict())
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > self.max_blocks:
            lru.popitem(last=False)

    def evict(self, worker: str, hashes: Iterable[int]) -> None:
        """Forget blocks the worker reports evicted."""
        lru = self._blocks.get(worker)
        if lru is not None:
            for h in hashes:
                lru.pop(h, None)

    def drop_worker(self, worker: str) -> None:
        """Forget everything about a worker (it went down or restarted with an empty cache)."""
        self._blocks.pop(worker, None)

    def match(self, worker: str, hashes: Sequence[int]) -> int:
        """Length of the leading run of `hashes` cached on `worker` (does not touch LRU order)."""
        lru = self._blocks.get(worker)
        if not lru:
            return 0
        n = 0
        for h in hashes:
            if h not in lru:
                break
            n += 1
        return n

    def blocks(self, worker: str) -> frozenset[int]:
        """The block hashes remembered for `worker` (for reports and comparing two routers' views)."""
        return frozenset(self._blocks.get(worker, ()))

    def size(self, worker: str) -> int:
        """Blocks currently remembered for `worker`."""
        return len(self._blocks.get(worker, ()))

    def workers(self) -> list[str]:
        """Workers with an entry, sorted by name."""
        return sorted(self._blocks)
