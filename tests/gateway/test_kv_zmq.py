"""vLLM's KV events over ZeroMQ: the emulator's own publisher (vLLM's wire format: msgpack, topic /
sequence / payload frames, a ROUTER replay socket) drives a served gateway's prefix index. The
engine names blocks by hashes of its own; the gateway must hold its own hashes of the same tokens
(`core.tokens.block_hashes`), across gaps, replays, resets and malformed messages."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from gw_harness import FAST_SCRAPE, run, served_gateway
from responder import Responder
from vllm_kv_publisher import BLOCK, CLEARED, VllmKvPublisher

from fleetwise.core.tokens import VOCAB_SIZE, block_hashes
from fleetwise.errors import SpecError
from fleetwise.gateway import Gateway, GatewayConfig
from fleetwise.gateway.kv_events import BlockNames, Removed, Stored, batch_events
from fleetwise.gateway.kv_zmq import ZmqKvEventFeed, decode_batch
from fleetwise.spec.base import validate

WAIT_S = 10.0
"""Longest wait for a gateway to catch up with the publisher."""


def _doc(url: str, kv: dict[str, Any]) -> dict[str, Any]:
    return {"backends": [{"url": url, "name": "e0", "kv_events": kv}], "scrape": FAST_SCRAPE,
            "tokenizer": "fleetwise", "limits": {"hash_block_tokens": BLOCK},
            "routing": {"policy": "prefix-affinity", "params": {"load_bound": {"enabled": False}}}}


def _tokens(rng: random.Random, blocks: int) -> list[int]:
    return [rng.randrange(VOCAB_SIZE) for _ in range(blocks * BLOCK)]


def _ours(tokens: list[int], first: int = 0, end: int | None = None) -> set[int]:
    """The gateway's own hashes of blocks [first, end) of `tokens`."""
    return set(block_hashes(tokens, BLOCK)[first:end])


def _feed(gw: Gateway) -> ZmqKvEventFeed:
    feed = gw.kv_feeds["e0"][0]
    assert isinstance(feed, ZmqKvEventFeed)
    return feed


async def _until(cond: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + WAIT_S
    while not cond():
        assert loop.time() < end, what
        await asyncio.sleep(0.01)


async def _synced(pub: VllmKvPublisher, gws: list[Gateway]) -> None:
    """Empty batches until every gateway applied the latest (the subscription is live)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + WAIT_S
    while True:
        seq = await pub.publish([])
        for _ in range(20):
            if all(_feed(g).seq == seq for g in gws):
                return
            await asyncio.sleep(0.01)
        assert loop.time() < end, "the gateway never caught up with the publisher"


async def _caught_up(pub: VllmKvPublisher, gws: list[Gateway], want: set[int]) -> None:
    await _until(lambda: all(_feed(g).seq == pub.seq and g.policy.index.blocks("e0") == want for g in gws),
                 "the prefix index did not reach the expected contents")


def _scenario(body: Callable[[VllmKvPublisher, Gateway], Any], replay: bool = True, **pub: Any) -> None:
    async def scenario() -> None:
        backend = Responder()
        await backend.start()
        try:
            async with VllmKvPublisher(**pub) as p, served_gateway(_doc(backend.url, p.spec(replay=replay))) as (gw, _):
                await _synced(p, [gw])
                await body(p, gw)
        finally:
            await backend.stop()

    run(scenario)


def test_stored_removed_and_cleared_events_set_the_index() -> None:
    rng = random.Random(10)
    a = _tokens(rng, 6)
    b = a[:2 * BLOCK] + _tokens(rng, 3)  # shares a's first two blocks
    c, d = _tokens(rng, 2), _tokens(rng, 2)

    async def body(p: VllmKvPublisher, gw: Gateway) -> None:
        feed = _feed(gw)
        await p.publish([p.stored(a, 0, 4), p.stored(a, 4, 6)])
        await p.publish([p.stored(b, 2, 5), p.stored(c, 0, 2, lora_name="adapter-1"), p.removed(p.engine_hashes(a)[5:])])
        await _caught_up(p, [gw], _ours(a, 0, 5) | _ours(b, 2, 5))
        assert (feed.stored, feed.evicted, feed.ignored, feed.unmapped) == (9, 1, 2, 0)
        orphan = p.stored(d, 1, 2, parent=12345)  # a parent the engine never announced
        await p.publish([CLEARED, p.stored(c, 0, 2), orphan])
        await _caught_up(p, [gw], _ours(c))
        assert (feed.stored, feed.unmapped, feed.gaps, feed.resets, feed.malformed) == (11, 1, 0, 0, 0)
        doc = gw.fleet_document()["backends"][0]["kv_events"]
        assert doc["connected"] and doc["hashes_match"] and doc["transport"] == "zmq" and doc["seq"] == p.seq

    _scenario(body)


def test_a_gap_is_filled_from_the_replay_socket() -> None:
    rng = random.Random(11)
    a, b, c = _tokens(rng, 3), _tokens(rng, 4), _tokens(rng, 2)

    async def body(p: VllmKvPublisher, gw: Gateway) -> None:
        feed = _feed(gw)
        gaps, filled, replays = feed.gaps, feed.replays_filled, p.replays
        await p.publish([p.stored(a, 0, 3)])
        await p.publish([p.stored(b, 0, 4)], send=False)  # lost on the way
        await p.publish([p.removed(p.engine_hashes(b)[3:])], send=False)
        await p.publish([p.stored(c, 0, 2)])
        await _caught_up(p, [gw], _ours(a) | _ours(b, 0, 3) | _ours(c))
        assert (feed.gaps - gaps, feed.replays_filled - filled, p.replays - replays, feed.resets) == (1, 1, 1, 0)

    _scenario(body)


def test_a_gap_the_replay_buffer_no_longer_holds_resets_the_index() -> None:
    rng = random.Random(12)
    a, b, c, d = (_tokens(rng, 3) for _ in range(4))

    async def body(p: VllmKvPublisher, gw: Gateway) -> None:
        feed = _feed(gw)
        await p.publish([p.stored(a, 0, 3)])
        await _caught_up(p, [gw], _ours(a))
        await p.publish([p.stored(b, 0, 3)], send=False)  # lost, and gone from the 3-batch buffer
        await p.publish([p.stored(c, 0, 3)], send=False)
        await p.publish([p.removed(p.engine_hashes(c)[2:] + p.engine_hashes(a)[:1])], send=False)
        await p.publish([p.stored(d, 0, 2)])
        # The index restarts from the buffered tail: c (less its removed block) and d. a is
        # still cached on the engine, but nothing the gateway can still read says so.
        await _caught_up(p, [gw], _ours(c, 0, 2) | _ours(d, 0, 2))
        assert (feed.gaps, feed.replays_filled, feed.resets) == (1, 0, 1)

    _scenario(body, buffer_steps=3)


def test_without_a_replay_socket_a_gap_resets_the_index() -> None:
    rng = random.Random(13)
    a, b, c = (_tokens(rng, 2) for _ in range(3))

    async def body(p: VllmKvPublisher, gw: Gateway) -> None:
        feed = _feed(gw)
        resets = feed.resets
        await p.publish([p.stored(a, 0, 2)])
        await _caught_up(p, [gw], _ours(a))
        await p.publish([p.stored(b, 0, 2)], send=False)
        await p.publish([p.stored(c, 0, 2)])
        await _caught_up(p, [gw], _ours(c))
        assert feed.resets - resets == 1 and p.replays == 0

    _scenario(body, replay=False)


def test_malformed_messages_are_counted_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(14)
    a = _tokens(rng, 3)
    bad_event = msgpack.packb([0.0, [["BlockStored", "not-a-list", None, [], BLOCK, None, "GPU", None]], 0])

    async def body(p: VllmKvPublisher, gw: Gateway) -> None:
        feed = _feed(gw)
        gaps = feed.gaps
        with caplog.at_level(logging.WARNING, logger="fleetwise.gateway"):
            for payload in (b"\xc1", msgpack.packb(42), msgpack.packb({"ts": 1.0, "events": 7}), bad_event):
                await p.publish_payload(payload)
            await p.send_frames([p.topic, b"\x00\x01"])  # a sequence frame of two bytes
            await p.send_frames([p.topic])
            await p.publish([p.stored(a, 0, 3)])
            await _caught_up(p, [gw], _ours(a))
        assert (feed.malformed, feed.gaps - gaps, feed.resets) == (6, 0, 0)
        assert sum("malformed" in r.getMessage() for r in caplog.records) == 1

    _scenario(body)


def test_a_restarted_engine_and_a_resubscription_rebuild_the_index() -> None:
    """A new publisher on the same endpoints (sequence numbers from 0 again, hashes of a new seed)
    resets the index to its events; `resubscribe` (the backend came back up) drops the gateway's
    own guesses and takes the buffered events again."""
    rng = random.Random(17)
    a, b = _tokens(rng, 3), _tokens(rng, 2)

    async def scenario() -> None:
        backend = Responder()
        await backend.start()
        try:
            async with VllmKvPublisher(seed=1) as p1:
                bind = (p1.endpoint, p1.replay_endpoint)
                async with served_gateway(_doc(backend.url, p1.spec())) as (gw, _):
                    feed = _feed(gw)
                    await _synced(p1, [gw])
                    for _ in range(5):
                        await p1.publish([p1.stored(a, 0, 3)])
                    await _caught_up(p1, [gw], _ours(a))
                    await p1.close()
                    async with VllmKvPublisher(seed=2, bind=bind) as p2:
                        await _synced(p2, [gw])
                        await p2.publish([p2.stored(b, 0, 2)])
                        await _caught_up(p2, [gw], _ours(b))
                        assert feed.resets == 1
                        gw.policy.index.insert("e0", [12345])  # a dispatch guess the engine never confirms
                        subs = feed.subscriptions
                        feed.resubscribe()
                        await _until(lambda: feed.subscriptions == subs + 1 and gw.policy.index.blocks("e0") == _ours(b),
                                     "the resubscription did not rebuild the index")
                        assert feed.resets == 1
        finally:
            await backend.stop()

    run(scenario)


def _workload(rng: random.Random, p: VllmKvPublisher, batches: int, cached: dict[int | bytes, int]
              ) -> list[list[Any]]:
    """Seeded batches of stores (sequences sharing prefixes), removals and one clear; `cached` is
    kept as the engine's contents (its hash -> the gateway's)."""
    roots = [_tokens(rng, 4) for _ in range(3)]
    out: list[list[Any]] = []
    for i in range(batches):
        events: list[Any] = []
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            if kind < 0.6:
                seq = rng.choice(roots)[:rng.randint(1, 4) * BLOCK] + _tokens(rng, rng.randint(1, 3))
                ours, theirs = block_hashes(seq, BLOCK), p.engine_hashes(seq)
                first = rng.randrange(len(ours))
                for j in range(first):  # the engine holds a block's prefix when it stores the block
                    if theirs[j] not in cached:
                        first = j
                        break
                events.append(p.stored(seq, first, len(ours)))
                cached.update(zip(theirs[first:], ours[first:], strict=True))
            elif cached:
                gone = rng.sample(sorted(cached, key=repr), min(len(cached), rng.randint(1, 3)))
                events.append(p.removed(gone))
                for h in gone:
                    del cached[h]
        if i == batches // 2:
            events.append(CLEARED)
            cached.clear()
        out.append(events)
    return out


def test_two_gateways_following_one_publisher_hold_the_same_index() -> None:
    """One gateway follows from the start, the other joins after 40 batches (it reads them from the
    replay buffer); both end with the engine's contents in their own hashes."""
    rng = random.Random(15)

    async def scenario() -> None:
        backend = Responder()
        await backend.start()
        try:
            async with VllmKvPublisher(hash_bytes=True, seed=99) as p, \
                    served_gateway(_doc(backend.url, p.spec())) as (ga, _):
                await _synced(p, [ga])
                cached: dict[int | bytes, int] = {}
                for events in _workload(rng, p, 40, cached):
                    await p.publish(events)
                async with served_gateway(_doc(backend.url, p.spec())) as (gb, _):
                    await _synced(p, [ga, gb])
                    for events in _workload(rng, p, 20, cached):
                        await p.publish(events)
                    want = set(cached.values())
                    await _caught_up(p, [ga, gb], want)
                    assert want and ga.policy.index.blocks("e0") == gb.policy.index.blocks("e0") == want
                    assert _feed(gb).resets == _feed(ga).resets == 0
        finally:
            await backend.stop()

    run(scenario)


def test_vllm_batches_decode_array_like_and_map_like() -> None:
    """Both msgspec encodings of a batch (array-like structs, or maps with a `type` tag) give the
    same events; fields a newer engine appends are ignored, unknown event types skipped."""
    stored = ["BlockStored", [7, 8], None, list(range(2 * BLOCK)), BLOCK, None, "GPU", None, None, 0, "full", None,
              "a-field-from-later"]
    as_map = {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None,
              "token_ids": list(range(2 * BLOCK)), "block_size": BLOCK, "lora_id": None, "medium": "GPU",
              "lora_name": None}
    arr = decode_batch(msgpack.packb([1.0, [stored, ["BlockRemoved", [8], "GPU"], ["Other", 1], CLEARED], 0]))
    mp = decode_batch(msgpack.packb({"ts": 1.0, "events": [as_map, {"type": "BlockRemoved", "block_hashes": [8],
                                                                    "medium": "GPU"}, {"type": "Other"},
                                                           {"type": "AllBlocksCleared"}]}))
    assert batch_events(arr) == batch_events(mp)
    ev = batch_events(arr)
    assert ev[0] == Stored((7, 8), None, tuple(range(2 * BLOCK)), BLOCK, True) and ev[1] == Removed((8,), True)
    cpu = batch_events([0.0, [["BlockStored", [1], None, list(range(BLOCK)), BLOCK, None, "CPU", None]]])
    assert cpu[0].plain is False  # type: ignore[union-attr]


def test_block_names_follow_the_tokens_not_the_engine_hashes() -> None:
    rng = random.Random(16)
    seq = _tokens(rng, 5)
    names = BlockNames(BLOCK)
    first = names.stored(Stored((b"x", b"y"), None, tuple(seq[:2 * BLOCK]), BLOCK, True))
    rest = names.stored(Stored((3, 4, 5), b"y", tuple(seq[2 * BLOCK:]), BLOCK, True))
    assert first is not None and rest is not None and first + rest == block_hashes(seq, BLOCK)
    assert names.removed((4, 99)) == (block_hashes(seq, BLOCK)[3],)
    # block 3 is still named after its removal: its child stored again continues the chain
    assert names.stored(Stored((6,), 4, tuple(seq[4 * BLOCK:]), BLOCK, True)) == (block_hashes(seq, BLOCK)[4],)
    assert names.stored(Stored((7,), None, tuple(seq[:BLOCK]), 2 * BLOCK, True)) is None  # another block size


def test_zmq_kv_events_config() -> None:
    kv = {"transport": "zmq", "endpoint": "tcp://10.0.0.1:5557", "replay_endpoint": "tcp://10.0.0.1:5558"}
    doc = {"backends": [{"url": "http://10.0.0.1:8000", "kv_events": kv}]}
    with pytest.raises(SpecError, match="kv_events but no tokenizer"):
        validate(GatewayConfig, doc, "gw.yaml")
    cfg = validate(GatewayConfig, {**doc, "tokenizer": "fleetwise"}, "gw.yaml")
    assert cfg.backends[0].kv_events is not None and cfg.backends[0].kv_events.topic == ""
    # the HTTP feed is gone: one clear line naming what to write instead
    with pytest.raises(SpecError, match=r"backends\.0\.kv_events_path: no longer read; KV events now come over ZeroMQ"):
        validate(GatewayConfig, {"tokenizer": "fleetwise", "backends": [
            {"url": "http://10.0.0.1:8000", "kv_events_path": "/kv_events"}]}, "gw.yaml")
    with pytest.raises(SpecError, match="tcp://host:port"):
        validate(GatewayConfig, {"tokenizer": "fleetwise", "backends": [
            {"url": "http://10.0.0.1:8000", "kv_events": {"endpoint": "10.0.0.1:5557"}}]}, "gw.yaml")
