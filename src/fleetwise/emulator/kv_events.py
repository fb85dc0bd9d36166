"""KV cache events: which prefix blocks a replica stored and evicted, in vLLM's event format.

Owns turning the block pool's cached contents into vLLM `KVEventBatch`es
(`vllm/distributed/kv_events.py`: `BlockStored{block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium}`, `BlockRemoved{block_hashes, medium}`, `AllBlocksCleared`) and
handing them to subscribers (the `/kv_events` HTTP stream: one JSON batch per line, each
event an object with a `type` field). A new subscriber first gets every block cached now, so a
router starts from the true contents.

The events come from the engine's block pool (`StepOutput.kv_events`: span stored / evicted by
hash id). Blocks are keyed by the chained hash of their tokens (`tokenizer.block_hashes`), the
same id a router computes from the prompt; the engine keys one span per block because the
emulator hashes every `block_size` tokens.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

MEDIUM = "GPU"
"""`medium` of every event (vLLM names the tier holding the block)."""
MAX_QUEUED_BATCHES = 10_000
"""A subscriber further behind than this many batches is disconnected (it must resubscribe)."""
MAX_REMEMBERED_BLOCKS = 1_000_000
"""Most block contents kept for `token_ids` (oldest forgotten first; their events carry [])."""


class KvEventPublisher:
    """Keeps the set of cached blocks from the engine's events and fans them out to subscribers."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._subs: list[asyncio.Queue[bytes | None]] = []
        self._known: dict[int, None] = {}
        """Blocks cached now, in the order they were stored."""
        self._blocks: dict[int, tuple[int | None, list[int]]] = {}

    @property
    def active(self) -> bool:
        """Whether anyone is listening."""
        return bool(self._subs)

    @property
    def cached(self) -> list[int]:
        """Hashes of the blocks cached now, oldest first."""
        return list(self._known)

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

    def publish(self, ts: float, events: list[tuple[bool, int]]) -> None:
        """Apply one step's engine events `(stored, hash)` and send them to subscribers."""
        known = self._known
        out: list[dict[str, Any]] = []
        stored: list[int] = []
        removed: list[int] = []
        for is_stored, h in events:
            if is_stored:
                if removed:
                    out += self._removed(removed)
                    removed = []
                known[h] = None
                stored.append(h)
            else:
                if stored:
                    out += self._stored(stored)
                    stored = []
                known.pop(h, None)
                removed.append(h)
        out += self._stored(stored) + self._removed(removed)
        if self._subs and out:
            self._send(ts, out)

    def _removed(self, hashes: list[int]) -> list[dict[str, Any]]:
        for h in hashes:
            self._blocks.pop(h, None)
        return [{"type": "BlockRemoved", "block_hashes": hashes, "medium": MEDIUM}] if hashes else []

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
        self._subs.append(q)
        line = {"ts": ts, "events": [{"type": "AllBlocksCleared"}, *self._stored(list(self._known))],
                "data_parallel_rank": None}
        q.put_nowait((json.dumps(line) + "\n").encode())
        return q

    def unsubscribe(self, q: asyncio.Queue[bytes | None]) -> None:
        """Stop sending to `q`."""
        if q in self._subs:
            self._subs.remove(q)

    def close(self) -> None:
        """End every subscription."""
        for q in self._subs:
            q.put_nowait(None)
        self._subs.clear()
