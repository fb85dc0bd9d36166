"""The gateway in front of `fleetwise emulate` replicas (served on 127.0.0.1 in the test's event
loop): relayed text is the emulator's own, prefix affinity yields real cache hits, the P/D
hand-off pulls KV from the prefill replica, and an injected fault is retried elsewhere."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from gw_harness import FAST_SCRAPE, MODEL, TOKEN, emulators, run, served_gateway

from fleetwise.core.tokens import encode, words_text
from fleetwise.emulator.generation import text_of
from fleetwise.gateway.scrape import parse_metrics

PROMPT = words_text(list(range(400)))


@contextlib.asynccontextmanager
async def gateway(urls: list[str], roles: tuple[str, ...], **cfg: Any) -> AsyncIterator[str]:
    doc = {"backends": [{"url": u, "name": f"e{i}", "role": r} for i, (u, r) in enumerate(zip(urls, roles,
                                                                                              strict=True))],
           "scrape": FAST_SCRAPE, **cfg}
    async with served_gateway(doc) as (_, url):
        yield url


async def stream(c: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[str, str]:
    """(concatenated text, backend) of a streamed completion through the gateway."""
    async with c.post(url + "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status == 200, await r.text()
        raw = (await r.read()).decode()
        backend = r.headers["x-fleetwise-backend"]
    events = [json.loads(b[6:]) for b in raw.split("\n\n") if b.startswith("data: {")]
    assert raw.endswith("data: [DONE]\n\n") and not any("error" in e for e in events), raw[-300:]
    return "".join(e["choices"][0]["text"] for e in events if e.get("choices")), backend


def test_prefix_affinity_in_front_of_emulators_hits_their_cache() -> None:
    async def scenario() -> None:
        roles = ("mixed", "mixed")
        async with emulators(roles) as emus, gateway([u for _, u in emus], roles,
                                                     routing={"policy": "prefix-affinity", "params": {"load_bound": {"enabled": False}}}) as gw, \
                aiohttp.ClientSession() as c:
            want = text_of(encode(PROMPT), 0, 8)
            picks = []
            for _ in range(3):
                text, backend = await stream(c, gw, {"model": MODEL, "prompt": PROMPT, "max_tokens": 8})
                assert text == want
                picks.append(backend)
            assert len(set(picks)) == 1, picks
            chosen = emus[int(picks[0][1])][1]
            async with c.get(chosen + "/metrics") as r:
                load = parse_metrics(await r.text())
            assert load.prefix_hit_rate is not None and load.prefix_hit_rate > 0.5
    run(scenario)


def test_pd_hand_off_between_emulators_through_the_gateway() -> None:
    async def scenario() -> None:
        roles = ("prefill", "decode")
        async with emulators(roles) as emus, gateway([u for _, u in emus], roles) as gw, \
                aiohttp.ClientSession() as c:
            text, backend = await stream(c, gw, {"model": MODEL, "prompt": PROMPT, "max_tokens": 12})
            assert backend == "e1" and text == text_of(encode(PROMPT), 0, 12)
            async with c.get(emus[1][1] + "/metrics") as r:
                page = await r.text()
            pulled = [ln for ln in page.splitlines() if ln.startswith("fleetwise:kv_transfer_seconds_count")]
            assert pulled and float(pulled[0].rsplit(" ", 1)[1]) == 1
            assert emus[1][0].state.replica.engine.stats.prompt_tokens_admitted == 400  # no prefill on decode
    run(scenario)


def test_emulator_fault_is_retried_on_another_replica() -> None:
    async def scenario() -> None:
        roles = ("mixed", "mixed")
        async with emulators(roles) as emus, gateway([u for _, u in emus], roles,
                                                     routing={"policy": "round-robin"}) as gw, \
                aiohttp.ClientSession() as c:
            async with c.post(emus[0][1] + "/admin/faults", json={"kind": "fail_requests", "status": 503},
                              headers={"authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 200
            backends = [(await stream(c, gw, {"model": MODEL, "prompt": "hi", "max_tokens": 3}))[1]
                        for _ in range(4)]
            assert backends == ["e1"] * 4
    run(scenario)


def test_colocated_stream_cut_mid_way_is_continued_on_the_other_replica() -> None:
    async def scenario() -> None:
        roles = ("mixed", "mixed")
        async with emulators(roles) as emus, gateway([u for _, u in emus], roles,
                                                     routing={"policy": "round-robin"}) as gw, \
                aiohttp.ClientSession() as c:
            async with c.post(emus[0][1] + "/admin/faults", json={"kind": "drop_streams", "after_tokens": 5},
                              headers={"authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 200
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "stream": True,
                    "stream_options": {"include_usage": True}}
            for _ in range(2):  # round-robin: one starts on the faulty replica
                async with c.post(gw + "/v1/completions", json=body) as r:
                    raw = (await r.read()).decode()
                events = [json.loads(b[6:]) for b in raw.split("\n\n") if b.startswith("data: {")]
                assert raw.endswith("data: [DONE]\n\n") and not any("error" in e for e in events), raw[-300:]
                assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == text_of(encode(PROMPT), 0, 16)
                assert all("usage" not in e for e in events if e["choices"])  # per-chunk usage was the gateway's
                assert events[-1]["usage"]["prompt_tokens"] == 400  # the whole request's counts
                assert events[-1]["usage"]["completion_tokens"] == 16
            async with c.get(gw + "/metrics") as r:
                page = await r.text()
            moved = parse_counter(page, "fleetwise_gateway_migrations_total")
            cut = parse_counter(page, 'fleetwise_gateway_upstream_errors_total{backend="e0",kind="disconnect"}')
            assert moved == cut >= 1  # every cut stream was continued (the continuation takes e1's turn)
    run(scenario)


def parse_counter(page: str, name: str) -> float:
    """The value of one sample line of a Prometheus text page (0 when absent)."""
    return next((float(ln.rsplit(" ", 1)[1]) for ln in page.splitlines() if ln.startswith(name + " ")), 0.0)
