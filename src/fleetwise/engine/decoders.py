"""`DecodeSet`: the running sequences that are decoding, kept as aggregates.

Owns the per-pass arithmetic of decoding so that a pass costs O(1) Python work, not O(seqs):
a global pass counter G advances by one per forward pass; a decoder stores `a` (its context is
`a + G`) and `f` (it produces its last token in the pass that brings G to `f`). The set keeps
sum(a), sum(f), a count of decoders per `a mod block_size` (a decoder needs a new KV block in
the pass where its context is a multiple of the block size), a heap of finish passes and a heap
of the largest `a` (the longest decode row, which bounds attention at small batch), both with
lazy deletion (an entry is stale once its record left decoding).

Heap entries are single ints, `key << SEQ_BITS | seq` (key: the finish pass f, or -a; seq: the
decoder's admission number in its engine, unique per join), so the heap compares ints, not
tuples, in the order the tuples `(key, seq)` have; `_live` maps the seq of each decoder in the
set to its record, and an entry whose seq is not there is stale.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Final

from fleetwise.engine.records import NO_ENTRIES
from fleetwise.engine.sequence import DECODE, LEFT, SeqState
from fleetwise.perf.types import BatchShape

SEQ_BITS: Final = 32
"""Low bits of a heap entry holding the decoder's admission number (`SeqState.seq`)."""
SEQ_MASK: Final = (1 << SEQ_BITS) - 1

class DecodeSet:
    """Aggregates over decoding `SeqState`s; see the module docstring."""

    __slots__ = ("block_size", "n", "sum_a", "sum_f", "res", "_heap", "_amax", "_live", "_top_f", "_top_a")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.reset()

    def reset(self) -> None:
        self.n = 0
        self.sum_a = 0
        self.sum_f = 0
        self.res = [0] * self.block_size
        self._heap: list[int] = []
        """Finish passes: `f << SEQ_BITS | seq`."""
        self._amax: list[int] = []
        """Largest `a` first: `-a << SEQ_BITS | seq`."""
        self._live: dict[int, SeqState] = {}
        """seq -> record of every decoder in the set."""
        self._top_f: int | None = None
        """`next_finish()` while no decoder joined or left (None: look again)."""
        self._top_a: int | None = None
        """The largest live `a` while no decoder joined or left (None: look again)."""

    def join(self, st: SeqState, context: int, remaining: int, g: int) -> None:
        """`st` decodes from pass `g` with `context` tokens cached and `remaining` tokens to go."""
        seq = st.seq
        assert 0 <= seq <= SEQ_MASK, seq
        a = context - g
        f = g + remaining
        st.phase = DECODE
        st.a = a
        st.f = f
        self.n += 1
        self.sum_a += a
        self.sum_f += f
        self.res[a % self.block_size] += 1
        self._live[seq] = st
        heappush(self._heap, f << SEQ_BITS | seq)
        heappush(self._amax, -a << SEQ_BITS | seq)
        self._top_f = self._top_a = None

    def leave(self, st: SeqState) -> None:
        """`st` stops decoding (finished or preempted); its heap entries go stale."""
        self.n -= 1
        self.sum_a -= st.a
        self.sum_f -= st.f
        self.res[st.a % self.block_size] -= 1
        del self._live[st.seq]
        st.phase = LEFT
        self._top_f = self._top_a = None

    def kv_read_tokens(self, g: int) -> int:
        """Sum of (context + 1) over decoders in the pass that starts at counter `g`."""
        return self.sum_a + self.n * (g + 1)

    def max_kv_read(self, g: int) -> int:
        """Longest decode row's (context + 1) in the pass that starts at counter `g`; 0 when none."""
        a = self._top_a
        if a is not None:
            return a + g + 1
        heap, live = self._amax, self._live
        while heap:
            top = heap[0]
            if (top & SEQ_MASK) in live:
                a = -(top >> SEQ_BITS)
                self._top_a = a
                return a + g + 1
            heappop(heap)
        return 0

    def needs_block(self, st: SeqState, g: int) -> int:
        """Blocks `st` takes in the pass that starts at counter `g` (1 when its context fills a block)."""
        return 1 if (st.a + g) % self.block_size == 0 else 0

    def live(self) -> list[SeqState]:
        """The decoders in the set."""
        return list(self._live.values())

    def new_blocks(self, g: int, passes: int) -> int:
        """Blocks the decoders need for `passes` passes starting at counter `g`."""
        bs = self.block_size
        full, part = divmod(passes, bs)
        total = full * self.n
        if part:
            # Pass g + i needs res[(-(g + i)) % bs]: a run of `part` residues counting down from
            # r0 = (-g) % bs, wrapping below 0 (summed in place: no slices).
            res = self.res
            r0 = (-g) % bs
            lo = r0 - part + 1
            if lo < 0:
                for j in range(lo + bs, bs):
                    total += res[j]
                lo = 0
            for j in range(lo, r0 + 1):
                total += res[j]
        return total

    def max_passes(self, g: int, cap: int, free: int) -> int:
        """Most passes (<= cap) from counter `g` whose new blocks fit in `free`."""
        if self.new_blocks(g, cap) <= free:
            return cap
        bs, res, used = self.block_size, self.res, 0
        for i in range(cap):
            used += res[(-(g + i)) % bs]
            if used > free:
                return i
        return cap

    def next_finish(self) -> int | None:
        """Smallest finish pass among decoders (drops stale heap entries)."""
        if self._top_f is not None:
            return self._top_f
        heap, live = self._heap, self._live
        while heap:
            top = heap[0]
            if (top & SEQ_MASK) in live:
                f = top >> SEQ_BITS
                self._top_f = f
                return f
            heappop(heap)
        return None

    def pop_finished(self, g: int) -> list[SeqState]:
        """Decoders whose last token came out by pass `g`, in (finish, admission) order."""
        heap, live = self._heap, self._live
        bound = (g + 1) << SEQ_BITS  # entries below it finish by pass g
        if not heap or heap[0] >= bound:
            return NO_ENTRIES  # the shared empty list (read-only): most steps finish nothing
        done: list[SeqState] = []
        while heap and heap[0] < bound:
            st = live.get(heappop(heap) & SEQ_MASK)
            if st is not None:
                done.append(st)
        return done


def step_sums(dec: DecodeSet, passes: int, chunks: list[tuple[SeqState, int]]
              ) -> tuple[int, int, int, float, int, int, int]:
    """The `BatchShape` fields of one pass, in order: `dec`'s decode rows (`passes` passes done)
    plus the prompt chunks `chunks` (sequence, tokens) scheduled with them."""
    n, new = dec.n, dec.n
    kv = dec.kv_read_tokens(passes)
    longest = dec.max_kv_read(passes) if n else 0
    pairs, pre, mx = float(kv), 0, 1 if n else 0
    for st, c in chunks:
        n += 1
        new += c
        kv += st.computed + c
        pairs += c * (st.computed + (c + 1) / 2)
        if c > 1:
            pre += c
            if st.computed > longest:  # a chunk streams its cached context like a decode row
                longest = st.computed
        elif st.computed + 1 > longest:  # a one-token chunk reads its KV like a decode row
            longest = st.computed + 1
        mx = max(mx, c)
    return n, new, kv, pairs, pre, mx, longest


def step_shape(dec: DecodeSet, passes: int, chunks: list[tuple[SeqState, int]]) -> BatchShape:
    """The batch of one pass as a `BatchShape` (`step_sums`)."""
    return BatchShape(*step_sums(dec, passes, chunks))
