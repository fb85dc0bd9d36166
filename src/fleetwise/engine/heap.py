"""`Keyed` entries and the binary min-heap over them, ordered by `(key, tie)`.

Owns the heap of the simulator's event queue (`sim/events.py`: key = time, tie = priority and
insertion number). The algorithm is `heapq`'s (a push sifts the entry up; a pop moves the
smaller child up to a leaf, then sifts the last entry up from there), over entries whose two
fields compiled code compares natively, where `heapq` compared `(time, priority, seq, ...)`
tuples item by item through Python's rich comparison. Ties are unique, so the order of pops is
the one total order. The decode set's heaps (`decoders.py`) stay on `heapq` over single ints:
there a native pop costs what `heapq`'s does, and the sources (pure Python) pay about 7% more
CPU for a run (docs/simulator.md, "Long outputs: per-event cost").
"""

from __future__ import annotations


class Keyed:
    """A heap entry: ordered by `key`, then `tie` (users subclass it to carry what they need)."""

    __slots__ = ("key", "tie")

    def __init__(self, key: float, tie: int) -> None:
        self.key = key
        self.tie = tie


def before(a: Keyed, b: Keyed) -> bool:
    """`a` pops before `b`: a smaller key, or the same key and a smaller tie."""
    return a.key < b.key or (a.key == b.key and a.tie < b.tie)


def _sift_up(heap: list[Keyed], pos: int, e: Keyed) -> None:
    """Put `e` at `pos` or above, moving larger parents down (heapq's `_siftdown`)."""
    while pos > 0:
        parent = (pos - 1) >> 1
        p = heap[parent]
        if not before(e, p):
            break
        heap[pos] = p
        pos = parent
    heap[pos] = e


def push(heap: list[Keyed], e: Keyed) -> None:
    """Add `e` to `heap` (heapq's `heappush`)."""
    heap.append(e)
    _sift_up(heap, len(heap) - 1, e)


def pop(heap: list[Keyed]) -> Keyed:
    """Remove and return the first entry of a non-empty heap (heapq's `heappop`)."""
    last = heap.pop()
    n = len(heap)
    if n == 0:
        return last
    top = heap[0]
    pos, child = 0, 1
    while child < n:  # the smaller child moves up, down to a leaf
        right = child + 1
        if right < n and not before(heap[child], heap[right]):
            child = right
        heap[pos] = heap[child]
        pos = child
        child = 2 * pos + 1
    _sift_up(heap, pos, last)
    return top
