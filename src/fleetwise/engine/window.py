"""Sliding-window attention in the engine's KV accounting: what a sequence holds, and its decode growth.

A windowed layer keeps only the blocks that hold its last `window_tokens` positions; vLLM frees
the blocks that leave the window (its sliding-window KV manager). The pool counts blocks of
`block_size` tokens across every layer, so a sequence of n tokens (nb = cdiv(n, block_size) blocks
per layer) holds `cdiv(full_layers * nb + window_layers * min(nb, wb), layers)` pool blocks, where
wb = cdiv(window_tokens - 1, block_size) + 1 is the most blocks a window of positions can touch:
up to the window this is `cdiv(n, block_size)`, as without a window; beyond it a sequence grows
by the full layers' share only. `WindowedDecodeSet` prices decode passes with it, decoder by
decoder (windowless models keep `DecodeSet`'s residue counts: their results do not change).

Prefix caching (vLLM's hybrid KV cache manager: one block table per KV cache group; a hit of h
blocks needs every full-attention block before h and the sliding-window group's blocks of the
last window before h). A cached chain of spans ending at e blocks of tokens holds `cost(e) =
blocks(e * block_size)` pool blocks: the full layers' KV of every block and the windowed layers'
of the last window before e, what a hit at e needs; span j's entry holds `cost(e_j) - cost(e_j-1)`
(`chain_costs`). A branch that a sequence with a hit of h blocks caches past h holds its own
window too (`cost(h) + blocks((e - h) * block_size)` up to e). A lookup (`lookup_windowed`) takes
the longest prefix whose chain cost the entries still hold, so a chain whose tail an eviction
trimmed is a shorter hit, as vLLM's search from the right finds. A sequence with a hit of `wo`
tokens holds, besides the chain, `blocks(context - wo)` blocks of its own (its full layers past
the hit and its own window); one without a hit holds what it held with caching off.

Limits of the model: the layers are the whole model's (a pipeline stage's own mix is not used).
The pool counts blocks across layers (a pool block is one block of tokens in every layer), so a
chain's blocks are its layers' shares rounded up per chain end. A hit at a shorter prefix of a
chain (a shared system prompt that prompts continue) takes the windowed layers' blocks before it
as cached: vLLM keeps them hashed in its free queue after they slide out, until they are reused,
and the model does not count them. A sequence keeps the window before its hit referenced until it
finishes (vLLM frees it once the sequence's own window has moved past it).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetwise.engine.blocks import BlockPool, CacheEntry, SpanKey
from fleetwise.engine.decoders import DecodeSet
from fleetwise.engine.sequence import SeqState, cdiv


@dataclass(frozen=True, slots=True)
class KvWindow:
    """The layer mix of a windowed model, as the engine's block accounting needs it."""

    full_layers: int
    """Layers that keep every position."""
    window_layers: int
    """Layers that keep only the last `window_tokens` positions."""
    window_tokens: int
    """The sliding window, positions (`ModelSpec.sliding_window`)."""
    block_size: int
    """Tokens per KV block."""

    def blocks(self, tokens: int) -> int:
        """Pool blocks one sequence of `tokens` positions holds (see the module docstring)."""
        bs = self.block_size
        nb = cdiv(tokens, bs)
        wb = min(nb, cdiv(self.window_tokens - 1, bs) + 1)
        return cdiv(self.full_layers * nb + self.window_layers * wb, self.full_layers + self.window_layers)

    def chain_costs(self, ends: list[int], hit: int = 0) -> list[int]:
        """Pool blocks a cached chain holds up to each of `ends` (cumulative blocks of tokens); past
        a prefix hit of `hit` blocks, the chain's cost up to it plus the branch's own from it."""
        bs, blocks = self.block_size, self.blocks
        base = blocks(hit * bs)
        return [blocks(e * bs) if e <= hit else base + blocks((e - hit) * bs) for e in ends]

    def served(self, start: int, held: int, most: int) -> int:
        """Most blocks of tokens (at most `most`) past `start` whose chain cost fits `held` pool blocks."""
        bs, blocks = self.block_size, self.blocks
        base = blocks(start * bs)
        lo, hi = 0, most
        if blocks((start + hi) * bs) - base <= held:
            return hi
        while hi - lo > 1:  # the chain cost does not decrease with its length: bisect the last that fits
            mid = (lo + hi) // 2
            if blocks((start + mid) * bs) - base <= held:
                lo = mid
            else:
                hi = mid
        return lo

    def max_tokens(self, capacity_blocks: int, limit: int) -> int:
        """The most positions (at most `limit`) one sequence may have within `capacity_blocks`."""
        lo, hi = 0, limit  # blocks() does not decrease with tokens: bisect the last that fits
        if self.blocks(hi) <= capacity_blocks:
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.blocks(mid) <= capacity_blocks:
                lo = mid
            else:
                hi = mid
        return lo


class WindowedDecodeSet(DecodeSet):
    """`DecodeSet` whose per-pass block needs follow `KvWindow.blocks` (summed per decoder)."""

    __slots__ = ("window",)

    def __init__(self, block_size: int, window: KvWindow) -> None:
        super().__init__(block_size)
        self.window = window

    def needs_block(self, st: SeqState, g: int) -> int:
        """Blocks `st` takes in the pass that starts at counter `g` (its own: past its prefix hit)."""
        blocks, c = self.window.blocks, st.a + g - st.wo
        return blocks(c + 1) - blocks(c)

    def new_blocks(self, g: int, passes: int) -> int:
        """Blocks the decoders need for `passes` passes starting at counter `g`."""
        blocks = self.window.blocks
        return sum([blocks(st.a + g + passes - st.wo) - blocks(st.a + g - st.wo) for st in self.live()])

    def max_passes(self, g: int, cap: int, free: int) -> int:
        """Most passes (<= cap) from counter `g` whose new blocks fit in `free`."""
        if self.new_blocks(g, cap) <= free:
            return cap
        lo, hi = 0, cap  # new blocks do not decrease with passes: bisect the last count that fits
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.new_blocks(g, mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo


def lookup_windowed(pool: BlockPool, keys: list[SpanKey], ends: list[int], costs: list[int], max_blocks: int,
                    window: KvWindow) -> tuple[list[CacheEntry], list[int], int]:
    """`sequence.lookup` for a windowed engine: (entries, pool blocks used of each, blocks of tokens hit);
    a span serves the blocks of tokens whose chain cost its entry still holds (see the module docstring)."""
    entries: list[CacheEntry] = []
    uses: list[int] = []
    start = 0
    for key, end, cend in zip(keys, ends, costs, strict=True):
        stop = min(end, max_blocks)
        entry = pool.get(key) if stop > start else None
        if entry is None:
            break
        k = stop - start if entry.num_blocks >= cend - window.blocks(start * window.block_size) \
            else window.served(start, entry.num_blocks, stop - start)
        if k <= 0:
            break
        entries.append(entry)
        uses.append(window.blocks((start + k) * window.block_size) - window.blocks(start * window.block_size))
        start += k
        if start < end:
            break
    return entries, uses, start
