"""KV block pool: fixed-size blocks, hash-chained prefix cache, reference counts, LRU eviction.

Owns block accounting only; which request holds what is the scheduler's business.

To stay cheap on the simulator's hot path the pool does not keep one object per block. Blocks
are either
- *free*: hold nothing (`num_free_uncached`),
- *private*: held by one request, content not cached (a count, `num_private`),
- *cached*: grouped into `CacheEntry` spans. A span is the run of consecutive full blocks that
  one workload hash id determines (hash-chained: a span's key names its whole prefix, so equal
  prefixes share spans). An entry has a ref count (requests using it); at ref 0 it stays
  cached but is evictable, in LRU order. Eviction trims an entry from its tail, block by block,
  as vLLM evicts the tail blocks of a freed chain first.

KV events (as vLLM's `BlockStored`/`BlockRemoved`): when `events` is a list (off, None, by
default), the pool appends `(True, hash_id)` when a span is first cached and `(False, hash_id)`
when eviction removes its last block; the engine hands them out with each `StepOutput`. A
`reset` (crash) drops pending events: a driver reports the worker down, which forgets it all.

Invariant (`check`): free + private + sum(entry blocks) == capacity, and
in use (private + blocks of referenced entries) + `num_free` == capacity.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

SpanKey = tuple[int, int]
"""(workload hash id, span index): the chained key of one cached span."""


@dataclass(slots=True, eq=False, init=False)
class CacheEntry:
    """A cached span of `num_blocks` full blocks under `key`, used by `ref_count` requests (its own
    `__init__`: made per cached span, and a compiled dataclass's generated one runs interpreted)."""

    key: SpanKey
    num_blocks: int
    ref_count: int

    def __init__(self, key: SpanKey, num_blocks: int, ref_count: int = 0) -> None:
        self.key = key
        self.num_blocks = num_blocks
        self.ref_count = ref_count


class BlockPool:
    """`capacity` KV blocks; see the module docstring for the accounting."""

    __slots__ = ("capacity", "num_free_uncached", "num_private", "version", "events", "_cached", "_lru",
                 "_evictable_blocks", "_referenced_blocks")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"KV block pool needs at least one block, got {capacity}")
        self.capacity = capacity
        self.num_free_uncached = capacity
        self.num_private = 0
        self.version = 0
        """Bumped whenever cached contents change (lets callers memoise lookups)."""
        self.events: list[tuple[bool, int]] | None = None
        """KV events since the last drain: (stored, hash id); None = not recorded (the default)."""
        self._cached: dict[SpanKey, CacheEntry] = {}
        self._lru: OrderedDict[SpanKey, CacheEntry] = OrderedDict()
        self._evictable_blocks = 0
        self._referenced_blocks = 0

    # -- read-only views ---------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks a request could get now: free ones plus evictable cached ones."""
        return self.num_free_uncached + self._evictable_blocks

    @property
    def num_used(self) -> int:
        """Blocks held by requests (private, or in a referenced cached span)."""
        return self.num_private + self._referenced_blocks

    @property
    def num_cached(self) -> int:
        return self._evictable_blocks + self._referenced_blocks

    @property
    def usage(self) -> float:
        return self.num_used / self.capacity

    def get(self, key: SpanKey) -> CacheEntry | None:
        return self._cached.get(key)

    def lru_keys(self) -> list[SpanKey]:
        """Evictable spans, next to be evicted first."""
        return list(self._lru)

    # -- private blocks ----------------------------------------------------------------------
    def allocate(self, n: int) -> bool:
        """Give `n` private blocks, evicting LRU cached spans as needed; False (and no change)
        when fewer than `n` blocks are free or evictable."""
        if n <= 0:
            return True
        if n > self.num_free_uncached + self._evictable_blocks:
            return False
        if n > self.num_free_uncached:
            self._evict(n - self.num_free_uncached)
        self.num_free_uncached -= n
        self.num_private += n
        return True

    def free(self, n: int) -> None:
        """Return `n` private blocks."""
        assert 0 <= n <= self.num_private, (n, self.num_private)
        self.num_private -= n
        self.num_free_uncached += n

    def _evict(self, n: int) -> None:
        self.version += 1
        lru = self._lru
        while n > 0:
            key, entry = next(iter(lru.items()))
            take = min(n, entry.num_blocks)
            entry.num_blocks -= take
            self._evictable_blocks -= take
            self.num_free_uncached += take
            n -= take
            if entry.num_blocks == 0:
                del lru[key]
                del self._cached[key]
                if self.events is not None:
                    self.events.append((False, key[0]))

    # -- cached spans --------------------------------------------------------------------------
    def acquire(self, entry: CacheEntry) -> None:
        """One more request uses `entry` (a hit); it leaves the LRU if it was evictable."""
        if entry.ref_count == 0:
            del self._lru[entry.key]
            self._evictable_blocks -= entry.num_blocks
            self._referenced_blocks += entry.num_blocks
        entry.ref_count += 1

    def release(self, entry: CacheEntry) -> None:
        """One request stops using `entry`; at ref 0 it becomes the most recently used evictable."""
        assert entry.ref_count > 0, entry
        entry.ref_count -= 1
        if entry.ref_count == 0:
            self._lru[entry.key] = entry
            self._referenced_blocks -= entry.num_blocks
            self._evictable_blocks += entry.num_blocks

    def promote(self, key: SpanKey, n: int) -> CacheEntry | None:
        """Turn `n` of a request's private blocks into a new cached span (ref 1, held by that
        request). None, and no change, when `key` is already cached: the request keeps its
        blocks private, as vLLM keeps a duplicate block uncached. A span of 0 blocks is cached
        too (a windowed chain past the window whose windowed-only layers add none)."""
        if key in self._cached or n < 0:
            return None
        assert n <= self.num_private
        self.version += 1
        entry = CacheEntry(key, n, 1)
        self._cached[key] = entry
        if self.events is not None:
            self.events.append((True, key[0]))
        self.num_private -= n
        self._referenced_blocks += n
        return entry

    def grow(self, entry: CacheEntry, n: int) -> None:
        """Move `n` private blocks into a referenced span (a request completed its tail)."""
        assert entry.ref_count > 0 and 0 <= n <= self.num_private
        self.version += 1
        entry.num_blocks += n
        self.num_private -= n
        self._referenced_blocks += n

    def reset(self) -> None:
        """Drop every block and cached span (a crash)."""
        self.num_free_uncached = self.capacity
        self.num_private = 0
        self.version += 1
        self._cached.clear()
        self._lru.clear()
        self._evictable_blocks = self._referenced_blocks = 0
        if self.events is not None:
            self.events.clear()

    def check(self) -> None:
        """Assert the accounting invariants (tests call this after every step)."""
        total = sum(e.num_blocks for e in self._cached.values())
        assert self.num_free_uncached >= 0 and self.num_private >= 0
        assert self.num_free_uncached + self.num_private + total == self.capacity
        assert self.num_used + self.num_free == self.capacity
        assert all(e.ref_count >= 0 and e.num_blocks >= 0 for e in self._cached.values())
        assert all(self._cached[k] is e for k, e in self._cached.items() if e.key == k)
        evictable = [e for e in self._cached.values() if e.ref_count == 0]
        assert {e.key for e in evictable} == set(self._lru)
        assert sum(e.num_blocks for e in evictable) == self._evictable_blocks
