"""`SeqState`: one request's runtime record inside an engine, and its KV bookkeeping.

Owns the mapping from a request's prompt to cached spans (prefix-cache keys), the prefix
lookup at admission, caching of computed spans, and returning a request's blocks to the pool.
It does not decide when any of this happens: that is the scheduler's job.

Span keys. A request carries Mooncake-style `block_hashes` (one chained id per
`hash_block_tokens` prompt tokens). Engine block i is keyed by the hash id of the hash block
that holds its last token, so a key names the whole prefix up to that block. Consecutive engine
blocks with the same hash id form one span, cached as one `CacheEntry` (key `(hash_id, index)`).
Only full engine blocks are cached, and only inside the hashed part of the prompt; prompts
without hashes share nothing. One `hash_block_tokens` per engine is assumed.
"""

from __future__ import annotations

from enum import IntEnum

from fleetwise.core.request import Request
from fleetwise.engine.blocks import BlockPool, CacheEntry, SpanKey


class Phase(IntEnum):
    """Where a request is inside one engine."""

    LEFT = -1
    """Left the decode set (finished, or preempted and about to be requeued)."""
    WAITING = 0
    """Queued for admission (new, transferred KV, or requeued after a preemption)."""
    PREFILL = 1
    """Admitted; its prompt is being computed, chunk by chunk."""
    DECODE = 2
    """Producing output tokens, one per pass."""
    HANDOFF = 3
    """Prefill role: prompt computed; its KV is held until the driver releases it."""


LEFT, WAITING, PREFILL, DECODE, HANDOFF = Phase.LEFT, Phase.WAITING, Phase.PREFILL, Phase.DECODE, Phase.HANDOFF


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def prompt_spans(req: Request, block_size: int) -> tuple[list[SpanKey], list[int]]:
    """Keys of the prompt's cacheable spans and the cumulative block count at each span's end."""
    keys: list[SpanKey] = []
    ends: list[int] = []
    full = req.prompt_tokens // block_size
    hbt = req.hash_block_tokens
    prev = 0
    for j, h in enumerate(req.block_hashes):
        end = min((j + 1) * hbt // block_size, full)
        if end > prev:
            keys.append((h, j))
            ends.append(end)
            prev = end
        if end >= full:
            break
    return keys, ends


def lookup(pool: BlockPool, keys: list[SpanKey], ends: list[int], max_blocks: int
           ) -> tuple[list[CacheEntry], list[int], int]:
    """Longest cached prefix of at most `max_blocks` blocks: (entries, blocks used of each, total)."""
    entries: list[CacheEntry] = []
    uses: list[int] = []
    start = 0
    for key, end in zip(keys, ends, strict=True):
        need = min(end, max_blocks) - start
        if need <= 0:
            break
        entry = pool.get(key)
        if entry is None:
            break
        use = min(need, entry.num_blocks)
        entries.append(entry)
        uses.append(use)
        if start + use < end:
            start += use
            break
        start = end
    return entries, uses, start


def hit_blocks(pool: BlockPool, req: Request, block_size: int, max_blocks: int) -> int:
    """How many blocks of `req`'s prompt are cached now (read-only)."""
    keys, ends = prompt_spans(req, block_size)
    return lookup(pool, keys, ends, max_blocks)[2]


class SeqState:
    """A request inside one engine (one is made per admission to a queue: a plain class with its
    own `__init__`, see `step_state.ScheduledStep`).

    target: tokens that must be in the KV cache before the next output token is sampled (the
        prompt, plus the outputs already produced when recomputing after a preemption).
    computed: tokens in the KV cache (prefill phase; decoders derive it as `a + pass counter`).
    outputs: output tokens produced so far (decoders derive it from `f`).
    scheduled: admitted once already (a re-admission after preemption is not a first schedule).
    shared/private: blocks held in cached spans / privately (decoders derive private).
    entries/uses: the cached spans it uses (aligned with its span index; None = kept private).
    costs: blocks a cached chain holds up to each span's end (None: `ends`, one block per block of
        tokens; a windowed engine's are `window.KvWindow.chain_costs`).
    wo, base: a windowed engine's prefix hit at admission, tokens and the blocks of its spans (0, 0
        otherwise): the sequence holds `window.blocks(context - wo)` blocks of its own.
    a, f: decoder bookkeeping: context = a + passes; finishes when passes reach f.
    seq: admission number in its engine (-1 before the first).
    """

    __slots__ = ("req", "target", "transferred", "computed", "outputs", "first_done", "scheduled", "phase", "seq",
                 "shared", "private", "entries", "uses", "next_span", "keys", "ends", "costs", "wo", "base", "a", "f")

    def __init__(self, req: Request, target: int, transferred: bool = False) -> None:
        self.req = req
        self.target = target
        self.transferred = transferred
        self.computed = 0
        self.outputs = 0
        self.first_done = False
        self.scheduled = False
        self.phase: Phase = WAITING
        self.seq = -1
        self.shared = 0
        self.private = 0
        self.entries: list[CacheEntry | None] = []
        self.uses: list[int] = []
        self.next_span = 0
        self.keys: list[SpanKey] | None = None
        self.ends: list[int] | None = None
        self.costs: list[int] | None = None
        self.wo = 0
        self.base = 0
        self.a = 0
        self.f = 0

    def spans(self, block_size: int) -> tuple[list[SpanKey], list[int]]:
        if self.keys is None or self.ends is None:
            self.keys, self.ends = prompt_spans(self.req, block_size)
        return self.keys, self.ends

    def attach(self, pool: BlockPool, entries: list[CacheEntry], uses: list[int], hit: int) -> None:
        """Take references on the prefix-cache hits found by `lookup` (`hit` blocks of tokens)."""
        for entry in entries:
            pool.acquire(entry)
        self.entries = list(entries)
        self.uses = list(uses)
        self.shared = sum(uses)
        ends = self.ends or []
        n = len(uses)
        tail_full = n > 0 and hit == ends[n - 1]
        self.next_span = n if tail_full else max(n - 1, 0)

    def cache_computed(self, pool: BlockPool, block_size: int) -> None:
        """Offer every span completed by `computed` tokens to the prefix cache."""
        keys, ends = self.spans(block_size)
        cum = ends if self.costs is None else self.costs
        full = self.computed // block_size
        j = self.next_span
        while j < len(ends) and ends[j] <= full:
            size = cum[j] - (cum[j - 1] if j else 0)
            if j < len(self.entries):
                self._grow_tail(pool, j, size)
            else:
                entry = pool.promote(keys[j], size)
                self.entries.append(entry)
                self.uses.append(size if entry is not None else 0)
                if entry is not None:
                    self.private -= size
                    self.shared += size
            j += 1
        self.next_span = j

    def _grow_tail(self, pool: BlockPool, j: int, size: int) -> None:
        entry, use = self.entries[j], self.uses[j]
        if entry is not None and use < size and entry.num_blocks == use:
            pool.grow(entry, size - use)
            self.private -= size - use
            self.shared += size - use
            self.uses[j] = size

    def free_blocks(self, pool: BlockPool, private: int) -> None:
        """Return every block: cached spans tail first (evicted first), then `private` blocks."""
        for entry in reversed(self.entries):
            if entry is not None:
                pool.release(entry)
        pool.free(private)
        self.entries = []
        self.uses = []
        self.shared = self.private = self.next_span = self.wo = self.base = 0
