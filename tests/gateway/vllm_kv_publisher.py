"""vLLM's KV events for tests, sent through the emulator's own ZeroMQ publisher (127.0.0.1 only).

What `vllm serve --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'`
sends (`vllm/distributed/kv_events.py`, `ZmqEventPublisher`): on a PUB socket, three frames per
batch: topic, the sequence number as 8 big-endian bytes, and the `KVEventBatch` as msgpack; a
ROUTER socket answers replays. The transport is `fleetwise.emulator.kv_events.KvEventPublisher`,
the one `fleetwise emulate --kv-events-config` runs, so the gateway's subscriber is tested against
the real publisher. What this adds is vLLM's side of the content: blocks named as vLLM names them
(a chained sha256 over the parent's hash and the block's token ids with a seed of its own, sent as
a 64-bit int or the digest's bytes, so nothing but the tokens tells the gateway which of its own
hashes a block is), LoRA blocks, a data-parallel rank, batches the subscriber misses, and
malformed messages.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import msgpack

from fleetwise.emulator.kv_events import KvEventPublisher, KvEventsConfig

BLOCK = 16
"""Tokens per KV block (vLLM's default `--block-size`)."""
MEDIUM = "GPU"
CLEARED: list[Any] = ["AllBlocksCleared"]
"""`AllBlocksCleared` array-like: the tag alone."""


class VllmKvPublisher:
    """The emulator's publisher (PUB + ROUTER bound on 127.0.0.1, `buffer_steps` batches kept for
    replay) sending vLLM-named events."""

    def __init__(self, *, topic: str = "kv@engine", buffer_steps: int = 10_000, seed: int = 0,
                 hash_bytes: bool = False, dp_rank: int = 0, bind: tuple[str, str] | None = None) -> None:
        self.topic, self.seed, self.hash_bytes, self.dp_rank = topic.encode(), seed.to_bytes(8, "big"), hash_bytes, dp_rank
        where = bind or ("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        self.inner = KvEventPublisher(BLOCK, KvEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=where[0], replay_endpoint=where[1],
            buffer_steps=buffer_steps, topic=topic))
        self.endpoint, self.replay_endpoint = self.inner.endpoint or "", self.inner.replay_endpoint or ""

    @property
    def seq(self) -> int:
        """Sequence number of the last batch."""
        return self.inner.seq

    @property
    def replays(self) -> int:
        """Replay requests answered."""
        return self.inner.replays

    async def __aenter__(self) -> VllmKvPublisher:
        self.inner.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop serving replays and close both sockets (an engine going away); idempotent."""
        self.inner.close()
        await asyncio.sleep(0)  # let the cancelled replay task end

    def spec(self, *, replay: bool = True) -> dict[str, Any]:
        """The gateway's `kv_events` entry for this publisher."""
        return {"transport": "zmq", "endpoint": self.endpoint,
                "replay_endpoint": self.replay_endpoint if replay else None, "topic": self.topic.decode()}

    def engine_hashes(self, tokens: list[int]) -> list[int | bytes]:
        """The engine's names of the full blocks of `tokens`."""
        out: list[int | bytes] = []
        parent = self.seed
        for i in range(len(tokens) // BLOCK):
            block = b"".join(t.to_bytes(4, "little") for t in tokens[i * BLOCK:(i + 1) * BLOCK])
            parent = hashlib.sha256(parent + block).digest()
            out.append(parent if self.hash_bytes else int.from_bytes(parent[-8:], "big"))
        return out

    def stored(self, tokens: list[int], first: int, end: int, lora_name: str | None = None,
               parent: int | bytes | None = None) -> list[Any]:
        """`BlockStored` of blocks [first, end) of `tokens`, array-like (parent: the block before
        `first`, unless given)."""
        hashes = self.engine_hashes(tokens)
        if parent is None and first > 0:
            parent = hashes[first - 1]
        return ["BlockStored", hashes[first:end], parent, tokens[first * BLOCK:end * BLOCK], BLOCK,
                None, MEDIUM, lora_name]

    def removed(self, hashes: list[int | bytes]) -> list[Any]:
        """`BlockRemoved` of the engine's blocks `hashes`, array-like."""
        return ["BlockRemoved", hashes, MEDIUM]

    def payload(self, events: list[Any]) -> bytes:
        """One `KVEventBatch`, array-like msgpack."""
        return msgpack.packb([time.time(), events, self.dp_rank])

    async def publish(self, events: list[Any], *, send: bool = True) -> int:
        """Buffer a batch under the next sequence number and send it (unless `send` is False: a
        batch the subscriber misses); returns its sequence number."""
        return await self.publish_payload(self.payload(events), send=send)

    async def publish_payload(self, payload: bytes, *, send: bool = True) -> int:
        """Like `publish`, for any payload bytes (malformed ones included)."""
        return self.inner.send_payload(payload, live=send)

    async def send_frames(self, frames: list[bytes]) -> None:
        """Send raw frames on the PUB socket (no sequence number is used)."""
        assert self.inner.socket is not None
        await self.inner.socket.send_multipart(frames)
