"""KV cache events: which prefix blocks a replica stored and evicted, published as vLLM publishes them.

Owns turning the block pool's cached contents into vLLM `KVEventBatch`es and sending them the way
`vllm serve --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint":
..., "replay_endpoint": ..., "topic": ...}'` does (`vllm/distributed/kv_events.py`,
`ZmqEventPublisher`): every batch goes out on a ZeroMQ PUB socket bound at `endpoint` as three
frames (topic, an 8-byte big-endian sequence number counting 0, 1, 2, ..., the batch as msgpack),
and the last `buffer_steps` batches stay buffered for a ROUTER socket at `replay_endpoint`, which
answers a request carrying a start sequence number (8 bytes) with every buffered batch from there
on, `(seq, payload)` each, then `(-1, b"")`. As in vLLM there is no snapshot: a subscriber replays
the buffer from 0.

Batches and events are encoded as vLLM's msgspec structs are (`array_like=True`, trailing defaults
omitted): a batch is `[ts, events]` (ts in modelled seconds), `BlockStored` is `["BlockStored",
block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name]`,
`BlockRemoved` is `["BlockRemoved", block_hashes, medium]`, `AllBlocksCleared` is
`["AllBlocksCleared"]`. The gateway's one subscriber (`gateway/kv_zmq.py`) reads exactly this.

The events come from the engine's block pool (`StepOutput.kv_events`: span stored / evicted by
hash id). Blocks are keyed by the chained hash of their tokens (`tokenizer.block_hashes`); the
engine keys one span per block because the emulator hashes every `block_size` tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from typing import Any, Literal

import msgpack
import zmq
import zmq.asyncio
from pydantic import Field, field_validator

from fleetwise.errors import SpecError
from fleetwise.spec.base import Spec

__all__ = ["KvEventPublisher", "KvEventsConfig"]

MEDIUM = "GPU"
"""`medium` of every event (vLLM's `MEDIUM_GPU`: the tier holding the block)."""
MAX_REMEMBERED_BLOCKS = 1_000_000
"""Most block contents kept for `token_ids` (oldest forgotten first; their events carry [])."""
SEQ_BYTES = 8
"""Width of a sequence number frame (vLLM: `seq.to_bytes(8, "big")`)."""
END_SEQ = (-1).to_bytes(SEQ_BYTES, "big", signed=True)
"""The sequence number frame that ends a replay (vLLM's `END_SEQ`)."""
BUFFER_STEPS = 10_000
"""Batches kept for replay (vLLM's `KVEventsConfig.buffer_steps` default)."""
HWM = 100_000
"""Send high-water mark of the PUB socket (vLLM's `KVEventsConfig.hwm` default)."""


class KvEventsConfig(Spec):
    """vLLM's `--kv-events-config` (`KVEventsConfig`): whether and where a replica publishes its
    KV events."""

    enable_kv_cache_events: bool = False
    publisher: Literal["null", "zmq"] | None = None
    """`zmq` publishes; `null` publishes nothing; unset: `zmq` when events are enabled (as vLLM)."""
    endpoint: str = "tcp://*:5557"
    """Where the PUB socket binds (vLLM's default); `tcp://127.0.0.1:*` picks a free port."""
    replay_endpoint: str | None = None
    """Where the replay ROUTER socket binds; null: no replay."""
    buffer_steps: int = Field(default=BUFFER_STEPS, ge=1)
    hwm: int = Field(default=HWM, ge=0)
    topic: str = ""

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("tcp://", "ipc://")):
            raise ValueError(f"--kv-events-config endpoint {v!r} must look like tcp://host:port (or tcp://*:5557)")
        return v

    @property
    def publishes(self) -> bool:
        """Whether this configuration publishes anything."""
        return self.enable_kv_cache_events and self.publisher in ("zmq", None)


class KvEventPublisher:
    """Turns the engine's events into vLLM batches; with a `zmq` config, publishes them with a
    replay buffer: the sockets bind at construction, `start()` (inside the running event loop)
    serves replays, `close()` ends both."""

    def __init__(self, block_size: int, cfg: KvEventsConfig | None = None) -> None:
        self.block_size = block_size
        self.cfg = cfg if cfg is not None and cfg.publishes else None
        self._blocks: OrderedDict[int, tuple[int | None, list[int]]] = OrderedDict()  # oldest first, O(1) eviction
        self.seq = -1
        """Sequence number of the last batch sent."""
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps if cfg else BUFFER_STEPS)
        self.replays = 0
        self.endpoint: str | None = None
        """Where the PUB socket listens, once started (a `*` port resolved)."""
        self.replay_endpoint: str | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self.socket: zmq.asyncio.Socket | None = None
        """The PUB socket, once bound."""
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        if self.cfg is not None:
            self._bind(self.cfg)

    @property
    def active(self) -> bool:
        """Whether batches are published."""
        return self.socket is not None

    def _bind(self, cfg: KvEventsConfig) -> None:
        """Bind the PUB (and replay) sockets; `SpecError` naming the endpoint when one is taken."""
        self._ctx = ctx = zmq.asyncio.Context()
        try:
            self.socket = ctx.socket(zmq.PUB)
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.setsockopt(zmq.SNDHWM, cfg.hwm)
            self.socket.bind(cfg.endpoint)
            self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
            if cfg.replay_endpoint is not None:
                self._router = ctx.socket(zmq.ROUTER)
                self._router.setsockopt(zmq.LINGER, 0)
                self._router.bind(cfg.replay_endpoint)
                self.replay_endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as err:
            self.close()
            raise SpecError(f"--kv-events-config: cannot bind endpoint {cfg.endpoint} / replay_endpoint "
                            f"{cfg.replay_endpoint} ({err}); pick free ports") from None

    def start(self) -> None:
        """Serve replay requests (call inside the running event loop)."""
        if self._router is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replays())

    def remember(self, prompt_ids: list[int], hashes: tuple[int, ...]) -> None:
        """Keep the tokens and parent of each full prompt block (for BlockStored.token_ids)."""
        if self.cfg is None:
            return
        bs = self.block_size
        parent: int | None = None
        blocks = self._blocks
        for i, h in enumerate(hashes):
            if h not in blocks:
                blocks[h] = (parent, prompt_ids[i * bs:(i + 1) * bs])
            parent = h
        while len(blocks) > MAX_REMEMBERED_BLOCKS:
            blocks.popitem(last=False)

    def _stored(self, hashes: list[int]) -> list[list[Any]]:
        """`BlockStored` events of `hashes`, consecutive blocks of one chain in one event."""
        events: list[list[Any]] = []
        blocks = self._blocks
        for h in hashes:
            parent, tokens = blocks.get(h, (None, []))
            last = events[-1] if events else None
            if last is not None and last[1][-1] == parent and tokens and last[3]:
                last[1].append(h)
                last[3].extend(tokens)
                continue
            events.append(["BlockStored", [h], parent, list(tokens), self.block_size, None, MEDIUM, None])
        return events

    def _removed(self, hashes: list[int]) -> list[list[Any]]:
        for h in hashes:
            self._blocks.pop(h, None)
        return [["BlockRemoved", hashes, MEDIUM]] if hashes else []

    def batch(self, events: list[tuple[bool, int]]) -> list[list[Any]]:
        """One step's engine events `(stored, hash)` as vLLM events, in order."""
        out: list[list[Any]] = []
        run: list[int] = []
        run_stored = True
        for is_stored, h in events:
            if is_stored != run_stored and run:
                out += self._stored(run) if run_stored else self._removed(run)
                run = []
            run_stored = is_stored
            run.append(h)
        if run:
            out += self._stored(run) if run_stored else self._removed(run)
        return out

    def publish(self, ts: float, events: list[tuple[bool, int]]) -> None:
        """Send one step's engine events `(stored, hash)` as one batch at modelled second `ts`."""
        if self.socket is None or not events:
            return
        self.send([ts, self.batch(events)])

    def send(self, batch: list[Any]) -> int:
        """Buffer one array-like batch under the next sequence number and publish it; returns
        the sequence number."""
        return self.send_payload(msgpack.packb(batch))

    def send_payload(self, payload: bytes, live: bool = True) -> int:
        """Buffer `payload` under the next sequence number and publish it (`live` False: buffered
        for replay only, as a batch the high-water mark dropped); returns the sequence number."""
        assert self.socket is not None and self.cfg is not None
        self.seq += 1
        self.buffer.append((self.seq, payload))
        if live:  # a PUB socket never blocks: past the high-water mark ZeroMQ drops (a gap replay fills)
            self.socket.send_multipart([self.cfg.topic.encode(), self.seq.to_bytes(SEQ_BYTES, "big"), payload],
                                       flags=zmq.NOBLOCK)
        return self.seq

    async def _serve_replays(self) -> None:
        router = self._router
        assert router is not None
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != SEQ_BYTES:
                continue  # vLLM ignores a request it cannot read
            ident, start = frames[0], int.from_bytes(frames[2], "big")
            self.replays += 1
            for seq, payload in list(self.buffer):
                if seq >= start:
                    await router.send_multipart([ident, b"", seq.to_bytes(SEQ_BYTES, "big"), payload])
            await router.send_multipart([ident, b"", END_SEQ, b""])

    def close(self) -> None:
        """Stop serving replays and close both sockets; idempotent."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._ctx is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._ctx.destroy(linger=0)
        self._ctx = self.socket = self._router = None
