"""vLLM's KV events over ZeroMQ: a subscriber that keeps the prefix index true across gaps.

vLLM started with `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": ""}'` publishes every
`KVEventBatch` on a PUB socket as a three-frame message: the topic, an 8-byte big-endian sequence
number (0, 1, 2, ... per publisher), and the batch encoded with msgpack (msgspec structs; events
are tagged unions, array-like or maps). It keeps its last batches (`buffer_steps`, 10 000 by
default) for a ROUTER socket at `replay_endpoint`: a request carrying a start sequence number
(8 bytes, big-endian) is answered with every buffered batch from there on, each as
`(seq, payload)`, then `(-1, b"")` (`vllm/distributed/kv_events.py`, `ZmqEventPublisher`).

The feed subscribes, then asks for the replay buffer from 0: vLLM sends no snapshot, so the
buffered tail is the best picture of what is cached (a subset: blocks stored before the buffer's
oldest batch are missing, never blocks that are not cached). Each live batch must carry the
next sequence number. On a gap the feed asks for the missing batches; when the buffer no longer
holds them (or there is no replay endpoint, or the replay times out) it resets: `KvCleared`, then
the buffered tail again. A sequence number that goes back on the live socket is a restarted
publisher, and resets likewise. A malformed message is counted, logged once, and skipped. Socket
errors close both sockets and start over after `RECONNECT_S`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from fleetwise.core.feedback import Feedback
from fleetwise.gateway.config import KvEventsSpec
from fleetwise.gateway.kv_events import (
    MAX_LINE_BYTES,
    RECONNECT_S,
    BadBatch,
    KvFollower,
    batch_events,
    zmq_source,
)

__all__ = ["ZmqKvEventFeed", "decode_batch"]

log = logging.getLogger("fleetwise.gateway")

SEQ_BYTES = 8
"""Width of a sequence number frame (vLLM: `seq.to_bytes(8, "big")`)."""
END_SEQ = -1
"""The sequence number that ends a replay (vLLM's `END_SEQ`, signed)."""
SUB_HWM = 100_000
"""Live batches queued on the subscriber socket before ZeroMQ drops new ones (a gap the feed then
fills by replay); vLLM's publisher uses the same high-water mark."""
MAX_REPLAY_BATCHES = 100_000
"""Most batches one replay may return (vLLM keeps 10 000 by default); more ends the replay as
failed."""
REPLAY_TIMEOUT_S = 2.0
"""Longest wait for the next frame of a replay before it counts as failed."""
POLL_MS = 100
"""How often the receive loop looks up from the socket (a resubscription request waits at most
this long)."""


def decode_batch(payload: bytes) -> Any:
    """One msgpack payload decoded (block hashes sent as bytes stay bytes); `BadBatch` if it is not
    msgpack."""
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, TypeError) as err:
        raise BadBatch(f"not msgpack: {err}") from None


class ZmqKvEventFeed(KvFollower):
    """One backend's vLLM ZeroMQ KV-event subscription (`kv_events: {transport: zmq}`)."""

    def __init__(self, worker: str, spec: KvEventsSpec, hash_block_tokens: int, observe: Callable[[Feedback], None],
                 now: Callable[[], float]) -> None:
        super().__init__(worker, spec.endpoint, zmq_source(spec), hash_block_tokens, observe, now)
        self.replay_endpoint, self.topic = spec.replay_endpoint, spec.topic.encode()
        self.seq: int | None = None
        """Sequence number of the last batch applied."""
        self._live_seq: int | None = None
        self.gaps = 0
        self.replays_filled = 0
        self.resets = 0
        self.malformed = 0
        self._resync = True
        self._resync_first = True
        self._ctx: zmq.asyncio.Context | None = None

    def admin(self) -> dict[str, Any]:
        """This subscription's state as /admin/fleet shows it."""
        return {**super().admin(), "transport": "zmq", "replay_endpoint": self.replay_endpoint, "seq": self.seq,
                "gaps": self.gaps, "replays_filled": self.replays_filled, "resets": self.resets,
                "malformed": self.malformed, "mapped_blocks": len(self.names)}

    def resubscribe(self) -> None:
        """Take the engine's buffered events again from an empty index (the backend came back)."""
        self._resync = True

    async def run(self) -> None:
        """Follow the publisher until cancelled."""
        self._ctx = zmq.asyncio.Context()
        try:
            while True:
                try:
                    await self._follow()
                except zmq.ZMQError as err:
                    self.errors += 1
                    log.info("KV events of %s (%s): %s; reconnecting in %.0f s", self.worker, self.url, err,
                             RECONNECT_S)
                finally:
                    self.connected = False
                await asyncio.sleep(RECONNECT_S)
        finally:
            self._ctx.destroy(linger=0)

    async def _follow(self) -> None:
        assert self._ctx is not None
        sub = self._ctx.socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, SUB_HWM)
            sub.setsockopt(zmq.MAXMSGSIZE, MAX_LINE_BYTES)
            sub.setsockopt(zmq.SUBSCRIBE, self.topic)
            sub.connect(self.url)
            self.connected, self._resync, self._resync_first, self._live_seq = True, True, True, None
            self.subscriptions += 1
            while True:
                if self._resync:
                    if not self._resync_first:
                        self.subscriptions += 1
                    self._resync = self._resync_first = False
                    await self._reset(counted=False)
                if await sub.poll(POLL_MS):
                    await self._on_live(await sub.recv_multipart())
        finally:
            sub.close(linger=0)

    async def _on_live(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
            self._bad(f"a message of {len(frames)} frames")
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        if self._live_seq is not None and seq <= self._live_seq:
            log.info("KV events of %s: sequence went back %d -> %d (publisher restarted)", self.worker,
                     self._live_seq, seq)
            await self._reset()
        self._live_seq = seq
        if self.seq is not None and seq <= self.seq:
            return  # already applied (from a replay)
        if self.seq is not None and seq > self.seq + 1:
            self.gaps += 1
            if await self._fill(self.seq + 1):
                self.replays_filled += 1
            else:
                await self._reset()
            if self.seq is not None and seq <= self.seq:
                return
        self._apply(seq, frames[2])

    async def _reset(self, counted: bool = True) -> None:
        """Empty the index, then apply what the publisher still buffers (`counted`: a gap that
        could not be filled or a restarted publisher, not a new subscription)."""
        self.resets += counted
        self.clear()
        self.seq = None
        got = await self._replay(0)
        for seq, payload in got or ():
            self._apply(seq, payload)

    async def _fill(self, start: int) -> bool:
        """Apply the batches from `start` on from the replay buffer; False when it no longer holds
        `start` (or cannot be asked)."""
        got = await self._replay(start)
        if not got or got[0][0] != start or any(b[0] != a[0] + 1 for a, b in zip(got, got[1:], strict=False)):
            return False
        for seq, payload in got:
            self._apply(seq, payload)
        return True

    def _apply(self, seq: int, payload: bytes) -> None:
        self.seq = seq
        try:
            events = batch_events(decode_batch(payload))
        except BadBatch as err:
            self._bad(f"batch {seq}: {err}")
            return
        self.apply(events)

    def _bad(self, what: str) -> None:
        self.malformed += 1
        if self.malformed == 1:
            log.warning("KV events of %s (%s): skipping a malformed message (%s); further ones are only counted "
                        "(/admin/fleet kv_events.malformed)", self.worker, self.url, what)

    async def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """The publisher's buffered batches from `start` on, in order; None without a replay
        endpoint, on a timeout or an oversized answer."""
        if self.replay_endpoint is None:
            return None
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)  # a fresh socket: a late answer to a failed replay is never read
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.replay_endpoint)
            await sock.send_multipart([b"", start.to_bytes(SEQ_BYTES, "big")])
            out: list[tuple[int, bytes]] = []
            while True:
                if not await sock.poll(round(REPLAY_TIMEOUT_S * 1000)):
                    log.info("KV events of %s: replay from %d timed out", self.worker, start)
                    return None
                frames = await sock.recv_multipart()
                if len(frames) != 3 or frames[0] != b"" or len(frames[1]) != SEQ_BYTES:
                    self._bad(f"a replay message of {len(frames)} frames")
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                if seq == END_SEQ:
                    return out
                if len(out) >= MAX_REPLAY_BATCHES:
                    return None
                out.append((seq, frames[2]))
        finally:
            sock.close(linger=0)
