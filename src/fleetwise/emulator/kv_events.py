"""KV cache events: which prefix blocks a replica stored and evicted, in vLLM's event format.

Owns turning the block pool's cached contents into vLLM `KVEventBatch`es
(`vllm/distributed/kv_events.py`: `BlockStored{block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium}`, `BlockRemoved{block_hashes, medium}`, `AllBlocksCleared`) and
handing them to subscribers (the `/kv_events` HTTP stream: one JSON batch per line, each
event an object with a `type` field). A new subscriber first gets every block cached now, so a
router starts from the true contents.

Blocks are keyed by the chained hash of their tokens (`tokenizer.block_hashes`), the same id a
router computes from the prompt. Events are computed only while someone subscribes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fleetwise.engine.blocks import BlockPool

MEDIUM = "GPU"
"""`medium` of every event (vLLM names the tier holding the block)."""
MAX_QUEUED_BATCHES = 10_000
"""A subscriber further behind than this many batches is disconnected (it must resubscribe)."""
MAX_REMEMBERED_BLOCKS = 1_000_000
"""Most block contents kept for `token_ids` (oldest forgotten first; their events carry [])."""


class KvEventPublisher:
    """Diffs the pool's cached blocks after each step and fans the events out to subscribers."""

    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool, self.block_size = pool, block_size
        self._subs: list[asyncio.Queue[bytes | None]] = []
        self._known: set[int] = set()
        self._version = -1
        self._blocks: dict[int, tuple[int | None, list[int]]] = {}

    @property
    def active(self) -> bool:
        """Whether anyone is listening (events are computed only then)."""
        return bool(self._subs)

    def remember(self, prompt_ids: list[int], hashes: tuple[int, ...]) -> None:
        """Keep the tokens and parent of each full prompt block (for BlockStored.token_ids)."""
        bs = self.block_size
        parent: int | None = None
        blocks = self._blocks
        for i, h in enumerate(hashes):
            if h not in blocks:
                blocks[h] = (parent, prompt_ids[i * bs:(i + 1) * bs])
            parent = h
        while len(blocks) > MAX_REMEMBERED_BLOCKS:
            del blocks[next(iter(blocks))]

    def _cached(self) -> set[int]:
        # Span keys are (block hash, index); with one hash per engine block a span is one block.
        return {key[0] for key in self.pool._cached}

    def _stored(self, hashes: list[int]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        blocks = self._blocks
        for h in hashes:
            parent, tokens = blocks.get(h, (None, []))
            last = events[-1] if events else None
            if last is not None and last["block_hashes"][-1] == parent and tokens and last["token_ids"]:
                last["block_hashes"].append(h)
                last["token_ids"].extend(tokens)
                continue
            events.append({"type": "BlockStored", "block_hashes": [h], "parent_block_hash": parent,
                           "token_ids": list(tokens), "block_size": self.block_size, "lora_id": None,
                           "medium": MEDIUM})
        return events

    def publish(self, ts: float) -> None:
        """Send what changed since the last call (call after each step)."""
        if not self._subs or self.pool.version == self._version:
            return
        self._version = self.pool.version
        now = self._cached()
        stored = [h for h in self._order(now - self._known)]
        removed = sorted(self._known - now)
        self._known = now
        events = self._stored(stored)
        if removed:
            events.append({"type": "BlockRemoved", "block_hashes": removed, "medium": MEDIUM})
        for h in removed:
            self._blocks.pop(h, None)
        if events:
            self._send(ts, events)

    def _order(self, hashes: set[int]) -> list[int]:
        """Parents before children, so chains come out in prompt order."""
        blocks = self._blocks
        out: list[int] = []
        seen: set[int] = set()
        for h in sorted(hashes):
            chain = []
            x: int | None = h
            while x is not None and x in hashes and x not in seen:
                chain.append(x)
                seen.add(x)
                x = blocks.get(x, (None, []))[0]
            out.extend(reversed(chain))
        return out

    def _send(self, ts: float, events: list[dict[str, Any]]) -> None:
        line = (json.dumps({"ts": ts, "events": events, "data_parallel_rank": None}) + "\n").encode()
        for q in list(self._subs):
            if q.qsize() >= MAX_QUEUED_BATCHES:
                self._subs.remove(q)
                q.put_nowait(None)
            else:
                q.put_nowait(line)

    def subscribe(self, ts: float) -> asyncio.Queue[bytes | None]:
        """A queue of event lines (None = closed), starting with every block cached now."""
        q: asyncio.Queue[bytes | None] = asyncio.Queue()
        if not self._subs:
            self._known = self._cached()
            self._version = self.pool.version
        self._subs.append(q)
        snapshot = self._stored(self._order(self._known))
        line = {"ts": ts, "events": [{"type": "AllBlocksCleared"}, *snapshot], "data_parallel_rank": None}
        q.put_nowait((json.dumps(line) + "\n").encode())
        return q

    def unsubscribe(self, q: asyncio.Queue[bytes | None]) -> None:
        if q in self._subs:
            self._subs.remove(q)

    def close(self) -> None:
        """End every subscription."""
        for q in self._subs:
            q.put_nowait(None)
        self._subs.clear()
