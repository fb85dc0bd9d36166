"""Per-worker index of cached prefix blocks, keyed by chained block hashes, LRU-bounded.

Chained hashes mean an equal hash at position i implies an equal prompt up to block i, so a
worker can reuse the leading run of blocks it still holds. The index is fed from dispatch
decisions (optimistic: the worker will have computed the prompt) and from the engine's
`KvStored`/`KvEvicted` events when a driver reports them. It owns no timing and no load.

Besides each worker's LRU of blocks, every block hash maps to the set of workers holding it, as
a bitmask over small worker ids, so `match_all` finds every worker's leading run for a prompt
in O(prompt blocks) mask operations (plus one step per worker that holds a run), whatever the
number of workers: a router asks it once per request instead of once per worker.
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
        self._holders: dict[int, int] = {}
        """Block hash -> bitmask of the ids of the workers holding it (no entry: nobody)."""
        self._ids: dict[str, int] = {}
        """Worker name -> its bit in `_holders` (given on first insert, kept for good)."""
        self._names: list[str] = []
        """Worker id -> name."""

    def _bit(self, worker: str) -> int:
        i = self._ids.get(worker)
        if i is None:
            i = self._ids[worker] = len(self._names)
            self._names.append(worker)
        return 1 << i

    def _release(self, h: int, bit: int) -> None:
        """`h` no longer held by the worker of `bit`."""
        m = self._holders.get(h, 0) & ~bit
        if m:
            self._holders[h] = m
        else:
            self._holders.pop(h, None)

    def insert(self, worker: str, hashes: Iterable[int]) -> None:
        """Record blocks as cached on `worker` (most recently used); evict the LRU past the cap."""
        lru = self._blocks.setdefault(worker, OrderedDict())
        bit = self._bit(worker)
        holders = self._holders
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                holders[h] = holders.get(h, 0) | bit
        while len(lru) > self.max_blocks:
            self._release(lru.popitem(last=False)[0], bit)

    def evict(self, worker: str, hashes: Iterable[int]) -> None:
        """Forget blocks the worker reports evicted."""
        lru = self._blocks.get(worker)
        if lru is not None:
            bit = self._bit(worker)
            for h in hashes:
                if h in lru:
                    del lru[h]
                    self._release(h, bit)

    def drop_worker(self, worker: str) -> None:
        """Forget everything about a worker (it went down or restarted with an empty cache)."""
        lru = self._blocks.pop(worker, None)
        if lru:
            bit = self._bit(worker)
            for h in lru:
                self._release(h, bit)

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

    def match_all(self, hashes: Sequence[int]) -> list[tuple[str, int]]:
        """Every worker holding a nonempty leading run of `hashes`, with its length (`match` of
        each), in no particular order: O(prompt blocks) mask operations, whatever the fleet."""
        n = len(hashes)
        holders = self._holders
        alive = holders.get(hashes[0], 0) if n else 0
        out: list[tuple[str, int]] = []
        i = 1
        while alive and i < n:
            nxt = alive & holders.get(hashes[i], 0)
            if nxt != alive:
                self._emit(alive & ~nxt, i, out)
            alive = nxt
            i += 1
        self._emit(alive, i, out)
        return out

    def _emit(self, mask: int, k: int, out: list[tuple[str, int]]) -> None:
        """Append (worker, k) for every worker id set in `mask`."""
        names = self._names
        while mask:
            low = mask & -mask
            out.append((names[low.bit_length() - 1], k))
            mask ^= low

    def blocks(self, worker: str) -> frozenset[int]:
        """The block hashes remembered for `worker` (for reports and comparing two routers' views)."""
        return frozenset(self._blocks.get(worker, ()))

    def size(self, worker: str) -> int:
        """Blocks currently remembered for `worker`."""
        return len(self._blocks.get(worker, ()))

    def workers(self) -> list[str]:
        """Workers with an entry, sorted by name."""
        return sorted(self._blocks)
