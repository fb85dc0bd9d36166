"""Following an engine's KV events: the blocks it stored and evicted, fed to the policy's prefix index.

A backend with `kv_events_path` streams vLLM `KVEventBatch`es, one JSON object per line
(`{"ts", "events": [...], "data_parallel_rank"}`; `fleetwise emulate` serves them at
`/kv_events`). Each `BlockStored` becomes `KvStored`, each `BlockRemoved` `KvEvicted`, and
`AllBlocksCleared` (the first event of every subscription, before the snapshot of what is
cached) `KvCleared`, so after each (re)connection the index holds the engine's true contents.

The subscription reconnects after `RECONNECT_S` when the stream ends or fails; until then the
index keeps what it had, and the policy's own dispatch guesses fill the gaps as they do for a
backend without events.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from fleetwise.core.feedback import Feedback, KvCleared, KvEvicted, KvStored
from fleetwise.gateway.upstream import FAULT_ERRORS

__all__ = ["KvEventFeed", "batch_feedback"]

log = logging.getLogger("fleetwise.gateway")

RECONNECT_S = 1.0
"""Wait before resubscribing after the stream ended or failed."""
MAX_LINE_BYTES = 64 << 20
"""Longest batch line accepted (a snapshot of a full cache is one line); longer ones end the
subscription, which starts over."""


class BadBatch(ValueError):
    """A line that is not a KV event batch."""


def batch_feedback(line: bytes, worker: str, now_s: float) -> tuple[list[Feedback], int | None]:
    """The policy feedback of one batch line, and the `block_size` its `BlockStored` events name
    (None when it has none); `BadBatch` for a line that is not a batch."""
    try:
        doc = json.loads(line)
        events = doc["events"]
    except (ValueError, KeyError, TypeError):
        raise BadBatch(f"not a KV event batch: {line[:80]!r}") from None
    if not isinstance(events, list):
        raise BadBatch(f"`events` is not a list: {line[:80]!r}")
    out: list[Feedback] = []
    block_size: int | None = None
    for ev in events:
        kind = ev.get("type") if isinstance(ev, dict) else None
        if kind == "AllBlocksCleared":
            out.append(KvCleared(now_s, worker))
            continue
        if kind not in ("BlockStored", "BlockRemoved"):
            continue  # another event type (a newer engine's): not about prefix blocks
        hashes = ev.get("block_hashes")
        if not isinstance(hashes, list) or not all(isinstance(h, int) for h in hashes):
            raise BadBatch(f"{kind}.block_hashes is not a list of integers")
        if kind == "BlockStored":
            bs = ev.get("block_size")
            if isinstance(bs, int):
                block_size = bs
            out.append(KvStored(now_s, worker, tuple(hashes)))
        else:
            out.append(KvEvicted(now_s, worker, tuple(hashes)))
    return out, block_size


_ENDS: tuple[type[BaseException], ...] = (*FAULT_ERRORS, BadBatch)
"""What ends one subscription (it is then started again)."""


class KvEventFeed:
    """One backend's KV-event subscription: connects, relays every batch to `observe`,
    reconnects; counts what it saw for /admin/fleet."""

    def __init__(self, worker: str, url: str, hash_block_tokens: int,
                 session: Callable[[], aiohttp.ClientSession | None], observe: Callable[[Feedback], None],
                 now: Callable[[], float], connect_s: float) -> None:
        self.worker, self.url, self.hash_block_tokens = worker, url, hash_block_tokens
        self._session, self._observe, self._now = session, observe, now
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=None)
        self._response: aiohttp.ClientResponse | None = None
        self.connected = False
        self.subscriptions = 0
        self.batches = 0
        self.stored = 0
        self.evicted = 0
        self.errors = 0
        self.block_size: int | None = None
        self.last_batch_s: float | None = None

    def admin(self) -> dict[str, Any]:
        """This subscription's state as /admin/fleet shows it."""
        return {"url": self.url, "connected": self.connected, "subscriptions": self.subscriptions,
                "batches": self.batches, "blocks_stored": self.stored, "blocks_evicted": self.evicted,
                "errors": self.errors, "block_size": self.block_size,
                "hashes_match": self.block_size is None or self.block_size == self.hash_block_tokens,
                "last_batch_s": None if self.last_batch_s is None else round(self.last_batch_s, 3)}

    def resubscribe(self) -> None:
        """Drop the current stream; the loop reconnects and the engine sends its contents again."""
        if self._response is not None:
            self._response.close()

    async def run(self) -> None:
        """Follow the stream until cancelled."""
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except _ENDS as err:
                self.errors += 1
                log.info("KV events of %s: %s; resubscribing in %.0f s", self.worker, err or type(err).__name__,
                         RECONNECT_S)
            finally:
                self.connected, self._response = False, None
            await asyncio.sleep(RECONNECT_S)

    async def _follow(self) -> None:
        session = self._session()
        if session is None:
            return
        async with session.get(self.url, timeout=self._timeout) as r:
            if r.status != 200:
                raise BadBatch(f"GET {self.url}: HTTP {r.status}")
            self._response, self.connected = r, True
            self.subscriptions += 1
            buf = b""
            async for chunk in r.content.iter_any():
                buf += chunk
                if b"\n" not in chunk:
                    if len(buf) > MAX_LINE_BYTES:
                        raise BadBatch(f"a batch line over {MAX_LINE_BYTES} bytes")
                    continue
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._apply(line)

    def _apply(self, line: bytes) -> None:
        now = self._now()
        fbs, bs = batch_feedback(line, self.worker, now)
        if bs is not None and bs != self.block_size:
            self.block_size = bs
            if bs != self.hash_block_tokens:
                log.warning("KV events of %s name %d-token blocks but limits.hash_block_tokens is %d: its "
                            "hashes will not match the gateway's; set hash_block_tokens: %d", self.worker, bs,
                            self.hash_block_tokens, bs)
        self.batches += 1
        self.last_batch_s = now
        for fb in fbs:
            if isinstance(fb, KvStored):
                self.stored += len(fb.block_hashes)
            elif isinstance(fb, KvEvicted):
                self.evicted += len(fb.block_hashes)
            self._observe(fb)
