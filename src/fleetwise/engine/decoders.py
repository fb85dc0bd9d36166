"""`DecodeSet`: the running sequences that are decoding, kept as aggregates.

Owns the per-pass arithmetic of decoding so that a pass costs O(1) Python work, not O(seqs):
a global pass counter G advances by one per forward pass; a decoder stores `a` (its context is
`a + G`) and `f` (it produces its last token in the pass that brings G to `f`). The set keeps
sum(a), sum(f), a count of decoders per `a mod block_size` (a decoder needs a new KV block in
the pass where its context is a multiple of the block size), a heap of finish passes and a heap
of the largest `a` (the longest decode row, which bounds attention at small batch), both with
lazy deletion (an entry is stale once its record left decoding or was re-admitted).
"""

from __future__ import annotations

import heapq

from fleetwise.engine.sequence import DECODE, LEFT, SeqState
from fleetwise.perf.types import BatchShape


class DecodeSet:
    """Aggregates over decoding `SeqState`s; see the module docstring."""

    __slots__ = ("block_size", "n", "sum_a", "sum_f", "res", "_heap", "_amax", "_top_f", "_top_a")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.reset()

    def reset(self) -> None:
        self.n = 0
        self.sum_a = 0
        self.sum_f = 0
        self.res = [0] * self.block_size
        self._heap: list[tuple[int, int, SeqState]] = []
        self._amax: list[tuple[int, int, SeqState]] = []
        self._top_f: int | None = None
        """`next_finish()` while no decoder joined or left (None: look again)."""
        self._top_a: int | None = None
        """The largest live `a` while no decoder joined or left (None: look again)."""

    def join(self, st: SeqState, context: int, remaining: int, g: int) -> None:
        """`st` decodes from pass `g` with `context` tokens cached and `remaining` tokens to go."""
        st.phase = DECODE
        st.a = context - g
        st.f = g + remaining
        self.n += 1
        self.sum_a += st.a
        self.sum_f += st.f
        self.res[st.a % self.block_size] += 1
        heapq.heappush(self._heap, (st.f, st.seq, st))
        heapq.heappush(self._amax, (-st.a, st.seq, st))
        self._top_f = self._top_a = None

    def leave(self, st: SeqState) -> None:
        """`st` stops decoding (finished or preempted); its heap entry goes stale."""
        self.n -= 1
        self.sum_a -= st.a
        self.sum_f -= st.f
        self.res[st.a % self.block_size] -= 1
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
        heap = self._amax
        while heap:
            neg_a, seq, st = heap[0]
            if st.phase == DECODE and st.seq == seq and st.a == -neg_a:  # `_live_a`, inlined
                self._top_a = -neg_a
                return -neg_a + g + 1
            heapq.heappop(heap)
        return 0

    def needs_block(self, st: SeqState, g: int) -> bool:
        return (st.a + g) % self.block_size == 0

    def new_blocks(self, g: int, passes: int) -> int:
        """Blocks the decoders need for `passes` passes starting at counter `g`."""
        bs = self.block_size
        full, part = divmod(passes, bs)
        total = full * self.n
        if part:
            # Pass g + i needs res[(-(g + i)) % bs]: a run of `part` residues counting down from
            # r0 = (-g) % bs, wrapping below 0; summed as one or two slices.
            res = self.res
            r0 = (-g) % bs
            lo = r0 - part + 1
            total += sum(res[lo:r0 + 1]) if lo >= 0 else sum(res[:r0 + 1]) + sum(res[lo + bs:])
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
        heap = self._heap
        while heap:
            f, seq, st = heap[0]
            if st.phase == DECODE and st.seq == seq and st.f == f:  # `_live`, inlined
                self._top_f = f
                return f
            heapq.heappop(heap)
        return None

    def pop_finished(self, g: int) -> list[SeqState]:
        """Decoders whose last token came out by pass `g`, in (finish, admission) order."""
        heap = self._heap
        done: list[SeqState] = []
        while heap and heap[0][0] <= g:
            item = heapq.heappop(heap)
            if _live(item):
                done.append(item[2])
        return done


def _live(item: tuple[int, int, SeqState]) -> bool:
    st = item[2]
    return st.phase == DECODE and st.seq == item[1] and st.f == item[0]


def _live_a(item: tuple[int, int, SeqState]) -> bool:
    st = item[2]
    return st.phase == DECODE and st.seq == item[1] and st.a == -item[0]


def step_shape(dec: DecodeSet, passes: int, chunks: list[tuple[SeqState, int]]) -> BatchShape:
    """The batch of one pass: `dec`'s decode rows (`passes` passes done) plus the prompt chunks
    `chunks` (sequence, tokens) scheduled with them."""
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
        elif st.computed + 1 > longest:  # a one-token chunk reads its KV like a decode row
            longest = st.computed + 1
        mx = max(mx, c)
    return BatchShape(n, new, kv, pairs, pre, mx, longest)
