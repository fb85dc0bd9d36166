"""Following an engine's KV events: the blocks it stored and evicted, fed to the policy's prefix index.

One transport carries vLLM's `KVEventBatch`es (`vllm/distributed/kv_events.py`): vLLM's ZeroMQ
publisher, which `fleetwise emulate --kv-events-config` speaks too (`kv_events: {transport: zmq,
...}`, followed by `gateway.kv_zmq`: msgpack batches with sequence numbers and a replay socket).

A batch decodes to engine events (`batch_events`), which `BlockNames` turns into the
gateway's block hashes and `KvFollower.apply` into the policy's `KvStored`, `KvEvicted` and
`KvCleared`. Until a feed reconnects the index keeps what it had, and the policy's own dispatch
guesses fill the gaps as they do for a backend without events.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetwise.core.feedback import Feedback, KvCleared, KvEvicted, KvStored
from fleetwise.core.tokens import block_digests, block_id
from fleetwise.gateway.config import BackendSpec, KvEventsSpec

__all__ = ["BadBatch", "BlockNames", "Cleared", "KvFollower", "Removed", "Stored", "batch_events", "kv_source",
           "zmq_source"]

log = logging.getLogger("fleetwise.gateway")

RECONNECT_S = 1.0
"""Wait before subscribing again after the sockets failed."""
MAX_LINE_BYTES = 64 << 20
"""Longest batch accepted; a longer ZeroMQ message is dropped by the socket (a gap the feed fills
by replay)."""
MAX_MAPPED_BLOCKS = 1 << 18
"""Most engine block hashes `BlockNames` remembers per backend, cached or evicted (the least
recently stored forgotten first; a later `BlockRemoved` of a forgotten block is not applied, and
the prefix index's own LRU bound ages it out): about 5x the blocks of an H200 serving Llama 3.1 8B
(128 KiB of KV per token, 16-token blocks, about 110 GB of cache: 55 000 blocks), about 40 MB."""
PREFIX_MEDIA = (None, "GPU")
"""`medium` values of blocks the prefix index follows (vLLM's `MEDIUM_GPU`; None from engines that
do not name a tier). Blocks offloaded to CPU or disk tiers are not followed."""
PREFIX_GROUPS = (None, 0)
"""`group_idx` values followed: the first KV cache group (a hybrid model's full-attention layers)."""

BLOCK_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                       "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                       "kv_cache_spec_sliding_window")
"""`BlockStored`'s fields in declaration order: the positions of an array-like encoding (vLLM's
msgspec structs with `array_like=True`, trailing defaults omitted)."""
BLOCK_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
"""`BlockRemoved`'s fields in declaration order."""
FIELDS = {"BlockStored": BLOCK_STORED_FIELDS, "BlockRemoved": BLOCK_REMOVED_FIELDS, "AllBlocksCleared": ()}
"""The event types that concern prefix blocks, by tag; any other tag (a newer engine's) is skipped."""

EngineHash = int | bytes
"""An engine's name for a block (vLLM's `ExternalBlockHash`: a 64-bit int, or the hash's bytes)."""


def kv_source(spec: BackendSpec) -> str | None:
    """Where a backend's KV events come from (its ZeroMQ endpoints and topic); None when it
    publishes none. A changed source starts a new subscription."""
    return None if spec.kv_events is None else zmq_source(spec.kv_events)


def zmq_source(z: KvEventsSpec) -> str:
    """A ZeroMQ KV-event source as one string: its endpoints and topic."""
    return f"{z.endpoint} replay={z.replay_endpoint} topic={z.topic!r}"


class BadBatch(ValueError):
    """A message that is not a KV event batch."""


@dataclass(frozen=True, slots=True)
class Stored:
    """`BlockStored`: full blocks the engine cached, `block_size` tokens each, after `parent`."""

    hashes: tuple[EngineHash, ...]
    parent: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int | None
    plain: bool
    """Named by its tokens alone on the GPU tier (no LoRA, no extra keys such as multimodal inputs
    or a cache salt, the first cache group): what a prompt's hashes can match."""


@dataclass(frozen=True, slots=True)
class Removed:
    """`BlockRemoved`: blocks the engine evicted."""

    hashes: tuple[EngineHash, ...]
    plain: bool


@dataclass(frozen=True, slots=True)
class Cleared:
    """`AllBlocksCleared`: the engine dropped every block."""


EngineEvent = Stored | Removed | Cleared


def _hashes(v: Any, kind: str) -> tuple[EngineHash, ...]:
    if not isinstance(v, list | tuple) or not all(isinstance(h, int | bytes) and not isinstance(h, bool)
                                                   for h in v):
        raise BadBatch(f"{kind}.block_hashes is not a list of integers")
    return tuple(v)


def _event(ev: Any) -> EngineEvent | None:
    if isinstance(ev, list | tuple):  # array-like: [tag, field, ...]
        if not ev or not isinstance(ev[0], str):
            raise BadBatch("an array-like event without a tag")
        fields = FIELDS.get(ev[0])
        if fields is None:
            return None
        kind: Any = ev[0]
        doc = dict(zip(fields, ev[1:], strict=False))  # fields a newer engine appends are left out
    elif isinstance(ev, dict):
        kind, doc = ev.get("type"), ev
        if kind not in FIELDS:
            return None
    else:
        raise BadBatch(f"an event is a {type(ev).__name__}")
    if kind == "AllBlocksCleared":
        return Cleared()
    hashes = _hashes(doc.get("block_hashes"), kind)
    tier = doc.get("medium") in PREFIX_MEDIA and doc.get("group_idx") in PREFIX_GROUPS
    if kind == "BlockRemoved":
        return Removed(hashes, tier)
    parent, tokens, bs = doc.get("parent_block_hash"), doc.get("token_ids") or [], doc.get("block_size")
    if parent is not None and (not isinstance(parent, int | bytes) or isinstance(parent, bool)):
        raise BadBatch("BlockStored.parent_block_hash is not an integer")
    if not isinstance(tokens, list | tuple) or not all(isinstance(t, int) for t in tokens):
        raise BadBatch("BlockStored.token_ids is not a list of integers")
    extra = doc.get("extra_keys")
    plain = (tier and doc.get("lora_id") is None and doc.get("lora_name") is None
             and (not extra or all(k is None for k in extra)))
    return Stored(hashes, parent, tuple(tokens), bs if isinstance(bs, int) and bs > 0 else None, plain)


def batch_events(doc: Any) -> list[EngineEvent]:
    """The prefix-block events of one decoded batch, map-like (`{"ts", "events", ...}`) or
    array-like (`[ts, events, data_parallel_rank]`); `BadBatch` when it is neither."""
    if isinstance(doc, dict):
        events = doc.get("events")
    elif isinstance(doc, list | tuple) and len(doc) >= 2:
        events = doc[1]
    else:
        raise BadBatch(f"not a KV event batch: a {type(doc).__name__}")
    if not isinstance(events, list | tuple):
        raise BadBatch("`events` is not a list")
    return [e for e in map(_event, events) if e is not None]


class BlockNames:
    """An engine's block hashes -> the gateway's (`core.tokens.block_hashes` of the same tokens).

    Each `BlockStored` block is named by hashing its `token_ids` in the chain after its parent's
    digest, and the engine's hash -> that digest is kept to name children and to apply
    `BlockRemoved` (vLLM names blocks by sha256 over token ids with a seed of its own, the
    emulator by its tokenizer's chained hashes). A digest depends on the block's tokens and its
    prefix only, so it stays true after the block is evicted or the cache cleared: a child stored
    after its parent's eviction is still named."""

    def __init__(self, hash_block_tokens: int) -> None:
        self.hash_block_tokens = hash_block_tokens
        self._digest: OrderedDict[EngineHash, bytes] = OrderedDict()  # oldest first, O(1) eviction

    def __len__(self) -> int:
        return len(self._digest)

    def stored(self, ev: Stored) -> tuple[int, ...] | None:
        """The gateway's hashes of `ev`'s blocks; None when they cannot be named (another block
        size, tokens missing, a parent never seen)."""
        bs = ev.block_size
        if bs != self.hash_block_tokens or len(ev.token_ids) != bs * len(ev.hashes):
            return None
        digests = self._digest
        parent = b"" if ev.parent is None else digests.get(ev.parent)
        if parent is None:
            return None
        out = block_digests(list(ev.token_ids), bs, parent)
        for h, d in zip(ev.hashes, out, strict=True):
            digests.pop(h, None)
            digests[h] = d
        while len(digests) > MAX_MAPPED_BLOCKS:
            digests.popitem(last=False)
        return tuple(map(block_id, out))

    def removed(self, hashes: tuple[EngineHash, ...]) -> tuple[int, ...]:
        """The gateway's hashes of the removed blocks it could name."""
        get = self._digest.get
        return tuple(block_id(d) for d in (get(h) for h in hashes) if d is not None)


class KvFollower:
    """What every KV-event subscription shares: engine events -> the policy's feedback, through
    one `BlockNames`, and the counts /admin/fleet shows."""

    def __init__(self, worker: str, url: str, source: str, hash_block_tokens: int,
                 observe: Callable[[Feedback], None], now: Callable[[], float]) -> None:
        self.worker, self.url, self.source, self.hash_block_tokens = worker, url, source, hash_block_tokens
        self.names = BlockNames(hash_block_tokens)
        self._observe, self._now = observe, now
        self.connected = False
        self.subscriptions = 0
        self.batches = 0
        self.stored = 0
        self.evicted = 0
        self.unmapped = 0
        self.ignored = 0
        self.errors = 0
        self.block_size: int | None = None
        self.last_batch_s: float | None = None

    def admin(self) -> dict[str, Any]:
        """This subscription's state as /admin/fleet shows it."""
        return {"url": self.url, "connected": self.connected, "subscriptions": self.subscriptions,
                "batches": self.batches, "blocks_stored": self.stored, "blocks_evicted": self.evicted,
                "blocks_unmapped": self.unmapped, "blocks_ignored": self.ignored, "errors": self.errors,
                "block_size": self.block_size,
                "hashes_match": self.block_size is None or self.block_size == self.hash_block_tokens,
                "last_batch_s": None if self.last_batch_s is None else round(self.last_batch_s, 3)}

    def clear(self) -> None:
        """Empty this backend's index (a new subscription, or a gap that could not be filled)."""
        self._observe(KvCleared(self._now(), self.worker))

    def apply(self, events: list[EngineEvent]) -> None:
        """Relay one batch's events to the policy."""
        now = self._now()
        self.batches += 1
        self.last_batch_s = now
        names, observe, worker = self.names, self._observe, self.worker
        for ev in events:
            if isinstance(ev, Cleared):
                observe(KvCleared(now, worker))
            elif not ev.plain:
                self.ignored += len(ev.hashes)
            elif isinstance(ev, Stored):
                self._block_size(ev.block_size)
                ids = names.stored(ev)
                if ids is None:
                    self.unmapped += len(ev.hashes)
                else:
                    self.stored += len(ids)
                    observe(KvStored(now, worker, ids))
            else:
                ids = names.removed(ev.hashes)
                if ids:
                    self.evicted += len(ids)
                    observe(KvEvicted(now, worker, ids))

    def _block_size(self, bs: int | None) -> None:
        if bs is not None and bs != self.block_size:
            self.block_size = bs
            if bs != self.hash_block_tokens:
                log.warning("KV events of %s name %d-token blocks but limits.hash_block_tokens is %d: its "
                            "hashes will not match the gateway's; set hash_block_tokens: %d", self.worker, bs,
                            self.hash_block_tokens, bs)
