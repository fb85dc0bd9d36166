"""A KV-event publisher speaking vLLM's ZeroMQ wire format, for tests (127.0.0.1 only).

What `vllm serve --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'`
sends (`vllm/distributed/kv_events.py`, `ZmqEventPublisher`): on a PUB socket, three frames per
batch: topic, the sequence number as 8 big-endian bytes, and the `KVEventBatch` as msgpack. The
batch and its events are msgspec structs encoded array-like (`[ts, events, data_parallel_rank]`;
an event is `[tag, field, ...]` in declaration order, trailing defaults omitted). A ROUTER socket
answers a replay request (start sequence number, 8 bytes) with every buffered batch from there
on, `[seq, payload]` each, then `[-1, b""]`.

Blocks are named as vLLM names them: a chained sha256 over the parent's hash and the block's
token ids with a seed of its own, sent as a 64-bit int (or the digest's bytes), so nothing but the
tokens tells the gateway which of its own hashes a block is.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import deque
from typing import Any

import msgpack
import zmq
import zmq.asyncio

BLOCK = 16
"""Tokens per KV block (vLLM's default `--block-size`)."""
END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The frame that ends a replay."""
MEDIUM = "GPU"
CLEARED: list[Any] = ["AllBlocksCleared"]
"""`AllBlocksCleared` array-like: the tag alone."""


class VllmKvPublisher:
    """PUB + ROUTER sockets bound on 127.0.0.1, a replay buffer of `buffer_steps` batches."""

    def __init__(self, *, topic: str = "kv@engine", buffer_steps: int = 10_000, seed: int = 0,
                 hash_bytes: bool = False, dp_rank: int = 0, bind: tuple[str, str] | None = None) -> None:
        self.topic, self.seed, self.hash_bytes, self.dp_rank = topic.encode(), seed.to_bytes(8, "big"), hash_bytes, dp_rank
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.seq = -1
        self.replays = 0
        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._task: asyncio.Task[None] | None = None
        self._bind = bind or ("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        """Where the PUB and ROUTER sockets bind (a free port each by default)."""
        self.endpoint = self.replay_endpoint = ""

    async def __aenter__(self) -> VllmKvPublisher:
        for s, where in zip((self._pub, self._router), self._bind, strict=True):
            s.setsockopt(zmq.LINGER, 0)
            s.bind(where)
        self.endpoint = self._pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.replay_endpoint = self._router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._task = asyncio.create_task(self._serve_replays())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop serving replays and close both sockets (an engine going away); idempotent."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._ctx.destroy(linger=0)

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
        self.seq += 1
        self.buffer.append((self.seq, payload))
        if send:
            await self._pub.send_multipart([self.topic, self.seq.to_bytes(8, "big"), payload])
        return self.seq

    async def send_frames(self, frames: list[bytes]) -> None:
        """Send raw frames on the PUB socket (no sequence number is used)."""
        await self._pub.send_multipart(frames)

    async def _serve_replays(self) -> None:
        while True:
            frames = await self._router.recv_multipart()
            if len(frames) != 3:
                continue
            ident, _, start_b = frames
            start = int.from_bytes(start_b, "big")
            self.replays += 1
            for seq, payload in list(self.buffer):
                if seq >= start:
                    await self._router.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
            await self._router.send_multipart([ident, b"", END_SEQ, b""])
