"""KV events and tokenisation: gateways that tokenize prompts as the emulator does follow its KV
events, so two gateways in front of the same replicas hold the same prefix view, and a gateway
that never dispatched a prompt still routes it to the replica caching it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import msgpack
import pytest
from gw_harness import FAST_SCRAPE, MODEL, emulators, run, served_gateway

from fleetwise.core.feedback import Feedback, KvCleared, KvEvicted, KvStored
from fleetwise.core.tokens import block_hashes, encode, words_text
from fleetwise.emulator.kv_events import KvEventPublisher, KvEventsConfig
from fleetwise.emulator.protocol import parse_request as emulator_parse
from fleetwise.errors import SpecError
from fleetwise.gateway import Gateway, GatewayConfig
from fleetwise.gateway.kv_events import KvFollower, batch_events
from fleetwise.gateway.kv_zmq import decode_batch
from fleetwise.gateway.prompt_tokens import make_tokenizer, request_ids

BLOCK = 16
"""The emulator's KV block size (its default), which the gateways hash prompts by."""


KV_EVENTS = {"kv_events": KvEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint="tcp://127.0.0.1:*",
                                         replay_endpoint="tcp://127.0.0.1:*", topic="kv")}
"""The emulators' `--kv-events-config`: vLLM's ZeroMQ publisher on free 127.0.0.1 ports."""


def _kv_events(app: Any) -> dict[str, Any]:
    """The gateway's `kv_events` entry for an emulator app's publisher."""
    pub = app.state.replica.events
    return {"transport": "zmq", "endpoint": pub.endpoint, "replay_endpoint": pub.replay_endpoint, "topic": "kv"}


def _engine_blocks(app: Any) -> frozenset[int]:
    """Hashes of the blocks an emulator's engine caches (every request finished: all evictable)."""
    return frozenset(key[0] for key in app.state.replica.engine.pool.lru_keys())


def _doc(emus: list[tuple[Any, str]], **extra: Any) -> dict[str, Any]:
    return {"backends": [{"url": u, "name": f"e{i}", "kv_events": _kv_events(app)} for i, (app, u) in enumerate(emus)],
            "scrape": FAST_SCRAPE, "tokenizer": "fleetwise", "limits": {"hash_block_tokens": BLOCK},
            "routing": {"policy": "prefix-affinity", "params": {"load_bound": {"enabled": False}}}, **extra}


async def _complete(c: aiohttp.ClientSession, url: str, prompt: str) -> str:
    async with c.post(url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4}) as r:
        assert r.status == 200, await r.text()
        await r.read()
        return r.headers["x-fleetwise-backend"]


def test_two_gateways_converge_on_the_same_prefix_view_from_kv_events() -> None:
    prompts = [words_text(list(range(k * 1000, k * 1000 + 200))) + words_text([7, k]) for k in range(4)]

    async def scenario() -> None:
        async with emulators(("mixed", "mixed"), **KV_EVENTS) as emus, aiohttp.ClientSession() as c:
            async with served_gateway(_doc(emus)) as (ga, ua), served_gateway(_doc(emus)) as (gb, ub):
                names = ["e0", "e1"]

                def engine_blocks(i: int) -> frozenset[int]:
                    return _engine_blocks(emus[i][0])

                def converged() -> bool:
                    return all(ga.policy.index.blocks(n) == gb.policy.index.blocks(n) == engine_blocks(i)
                               for i, n in enumerate(names))

                await asyncio.gather(*(_complete(c, ua, p) for p in prompts))  # gateway A dispatches all
                loop = asyncio.get_running_loop()
                end = loop.time() + 10
                while not converged():
                    assert loop.time() < end, "the two gateways' prefix views did not converge"
                    await asyncio.sleep(0.02)
                assert all(engine_blocks(i) for i in range(2)), "both replicas should cache something"
                # Gateway B never saw these prompts: its index came from the engines' events alone,
                # and it sends a follow-up with one prompt's prefix to the replica caching it.
                for p in prompts:
                    hashes = block_hashes(encode(p), BLOCK)
                    holder = next(n for i, n in enumerate(names) if hashes[0] in engine_blocks(i))
                    assert await _complete(c, ub, p + words_text([3, 4, 5])) == holder
                assert gb.policy.report()["by_reason"].get("prefix", 0) == len(prompts)
                doc = gb.fleet_document()["backends"]
                assert all(b["kv_events"]["connected"] and b["kv_events"]["hashes_match"] for b in doc)
                assert sum(b["kv_events"]["blocks_stored"] for b in doc) > 0

    run(scenario)


def test_a_resubscription_replaces_the_index_with_the_engine_contents() -> None:
    async def scenario() -> None:
        async with emulators(("mixed",), **KV_EVENTS) as emus, aiohttp.ClientSession() as c:
            async with served_gateway(_doc(emus)) as (gw, url):
                await _complete(c, url, words_text(list(range(100))))
                gw.policy.index.insert("e0", [12345])  # a guess the engine never confirms
                feed = gw.kv_feeds["e0"][0]
                subs = feed.subscriptions
                feed.resubscribe()
                cached = _engine_blocks(emus[0][0])
                assert cached
                loop = asyncio.get_running_loop()
                end = loop.time() + 10
                while not (feed.subscriptions > subs and gw.policy.index.blocks("e0") == cached):
                    assert loop.time() < end, "the index was not rebuilt from the engine's replayed events"
                    await asyncio.sleep(0.02)

    run(scenario)


def test_the_emulators_batches_name_blocks_as_the_gateway_hashes_prompts() -> None:
    pub = KvEventPublisher(BLOCK, KV_EVENTS["kv_events"])
    pub.close()  # the batches alone
    ids = list(range(1000, 1000 + 5 * BLOCK + 3))
    hashes = block_hashes(ids, BLOCK)
    pub.remember(ids, hashes)
    stored = [(True, h) for h in hashes]
    batches = [pub.batch(stored[:2]), pub.batch([*stored[2:], (False, hashes[4])]), [["AllBlocksCleared"]]]
    seen: list[Feedback] = []
    feed = KvFollower("w", "u", "u", BLOCK, seen.append, lambda: 3.0)
    for events in batches:
        feed.apply(batch_events(decode_batch(msgpack.packb([3.0, events]))))
    assert seen == [KvStored(3.0, "w", hashes[:2]), KvStored(3.0, "w", hashes[2:]),
                    KvEvicted(3.0, "w", (hashes[4],)), KvCleared(3.0, "w")]
    assert (feed.block_size, feed.stored, feed.evicted, feed.unmapped, feed.batches) == (BLOCK, 5, 1, 0, 3)
    assert batches[0][0][:3] == ["BlockStored", list(hashes[:2]), None]


@pytest.mark.parametrize("body,chat", [
    ({"prompt": "Hello there, general Kenobi! " * 20}, False),
    ({"prompt": [" one two three"]}, False),
    ({"prompt": [5, 6, 7, 8]}, False),
    ({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]}, True),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]},
                   {"role": "assistant", "content": "partial answ"}],
      "add_generation_prompt": False, "continue_final_message": True}, True),
])
def test_fleetwise_tokenizer_counts_what_the_emulator_counts(body: dict[str, Any], chat: bool) -> None:
    tok = make_tokenizer("fleetwise")
    assert tok is not None
    want = emulator_parse("chat" if chat else "completion", {"model": MODEL, **body}, MODEL).prompt_ids
    assert request_ids(tok, body, chat) == want


async def _statuses(gw: Gateway, prompt: str, n: int) -> list[int]:
    """The HTTP statuses `gw.handle` answers `n` completion requests with (in-process ASGI)."""
    sent: list[dict[str, Any]] = []

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": json.dumps({"model": "m", "prompt": prompt}).encode(),
                "more_body": False}

    await gw.upstream.open()
    try:
        for _ in range(n):
            await gw.handle({"type": "http", "path": "/v1/completions", "headers": []}, receive, send, False)
    finally:
        await gw.upstream.close()
    return [int(m["status"]) for m in sent if m["type"] == "http.response.start"]


def test_gateway_counts_the_tokenized_length() -> None:
    """With a tokenizer the tenant's token-rate limit counts exact prompt tokens: two prompts of
    30 tokens fit an 80-token bucket, which the character estimate (about 64 each) overflows."""
    prompt = words_text(list(range(5000, 5030)))
    assert len(prompt) / 4 > 60 and len(encode(prompt)) == 30
    doc = {"backends": [{"url": "http://127.0.0.1:9"}], "default_tenant": {"name": "default", "tokens_per_s": 80},
           "limits": {"default_max_tokens": 1}, "retries": {"max_retries": 0}}
    for tokenizer, second_admitted in (("fleetwise", True), (None, False)):
        gw = Gateway(GatewayConfig.model_validate({**doc, "tokenizer": tokenizer}), admin_token="x")
        first, second = asyncio.run(asyncio.wait_for(_statuses(gw, prompt, 2), 10))
        assert first == 502  # admitted; nothing listens on port 9
        assert (second != 429) == second_admitted, (tokenizer, second)


def test_huggingface_tokenizer_json(tmp_path: Any) -> None:
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed (pip install -e '.[test]' installs it)")
    vocab = {"[UNK]": 0, "<s>": 1, "hello": 2, "world": 3}
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tk.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    path = tmp_path / "tokenizer.json"
    tk.save(str(path))
    tok = make_tokenizer(str(path))
    assert tok is not None
    assert request_ids(tok, {"prompt": "hello world hello"}, False) == [1, 2, 3, 2]  # BOS, as vLLM adds
    assert request_ids(tok, {"prompt": [9, 9]}, False) == [9, 9]
    assert len(request_ids(tok, {"messages": [{"role": "user", "content": "hello"}]}, True)) >= 2
    with pytest.raises(SpecError, match="not a file"):
        make_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SpecError, match="tokenizer.json"):
        make_tokenizer(str(tmp_path / "bad.json"))
