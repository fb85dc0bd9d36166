"""Sliding-window attention in the engine's KV accounting: what a sequence holds, and its decode growth.

A windowed layer keeps only the blocks that hold its last `window_tokens` positions; vLLM frees
the blocks that leave the window (its sliding-window KV manager). The pool counts blocks of
`block_size` tokens across every layer, so a sequence of n tokens (nb = cdiv(n, block_size) blocks
per layer) holds `cdiv(full_layers * nb + window_layers * min(nb, wb), layers)` pool blocks, where
wb = cdiv(window_tokens - 1, block_size) + 1 is the most blocks a window of positions can touch:
up to the window this is `cdiv(n, block_size)`, as without a window; beyond it a sequence grows
by the full layers' share only. `WindowedDecodeSet` prices decode passes with it, decoder by
decoder (windowless models keep `DecodeSet`'s residue counts: their results do not change).

Limits of the model: the layers are the whole model's (a pipeline stage's own mix is not used),
and prefix caching is off for a windowed engine (a cached prompt block holds every layer's KV,
which a windowed sequence does not keep).
"""

from __future__ import annotations

from dataclasses import dataclass

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
        """Blocks `st` takes in the pass that starts at counter `g`."""
        blocks, c = self.window.blocks, st.a + g
        return blocks(c + 1) - blocks(c)

    def new_blocks(self, g: int, passes: int) -> int:
        """Blocks the decoders need for `passes` passes starting at counter `g`."""
        blocks = self.window.blocks
        return sum([blocks(st.a + g + passes) - blocks(st.a + g) for st in self.live()])

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
