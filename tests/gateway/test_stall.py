"""A replica that hangs (accepts requests, answers /health, never produces a token): per-request
stall bounds fail requests over before their first token and migrate streams after it, the
active one-token probe takes the replica out, and the fleet keeps its goodput."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from gw_harness import FAST_SCRAPE, MODEL, TOKEN, emulators, loop_lag, run, running_fleet, served_gateway

from fleetwise.core.tokens import encode, words_text
from fleetwise.emulator.generation import text_of
from fleetwise.gateway.backends import Backend
from fleetwise.gateway.config import BackendSpec, BreakerSpec, StallSpec, TimeoutSpec
from fleetwise.gateway.scrape import EngineLoad
from fleetwise.gateway.stall import first_token_bound_s, fleet_ttft_s, next_token_bound_s

PROMPT = words_text(list(range(200)))
SLO_S = 1.5
"""End-to-end latency a request must meet to count as goodput (wall seconds, time scale 100)."""
CLIENTS = 12
PHASE_S = 4.0
SEGMENTS = 4
"""Each side's PHASE_S of closed-loop load, in this many alternating segments."""
STALL = {"min_first_token_s": 0.5, "min_next_token_s": 0.3, "probe_interval_s": 0.5}
"""Stall bounds for the tests (emulated hardware runs 100x faster than real time)."""


def _backend(ttft: float | None, tpot: float | None, waiting: int = 0, running: int = 0) -> Backend:
    b = Backend(BackendSpec(url="http://127.0.0.1:1", name="x"), BreakerSpec())  # type: ignore[call-arg]
    b.ttft_ewma_s, b.tpot_ewma_s = ttft, tpot
    b.load, b.scraped_at_s = EngineLoad(waiting=waiting, running=running), 0.0
    return b


def test_bounds_follow_the_replicas_own_latency_and_queue() -> None:
    st, to = StallSpec(factor=4.0, min_first_token_s=0.5, min_next_token_s=0.2), TimeoutSpec(first_byte_s=60, idle_s=30)
    assert first_token_bound_s(_backend(0.5, 0.02), None, st, to) == 2.0  # 4 x 0.5
    assert first_token_bound_s(_backend(0.5, 0.02, waiting=8, running=4), None, st, to) == 6.0  # queue x3
    assert first_token_bound_s(_backend(0.01, None), None, st, to) == 0.5  # the floor
    assert first_token_bound_s(_backend(None, None), 0.25, st, to) == 1.0  # the fleet's median
    assert first_token_bound_s(_backend(None, None), None, st, to) == 60  # no history anywhere
    assert first_token_bound_s(_backend(100.0, None), None, st, to) == 60  # never above the timeout
    assert next_token_bound_s(_backend(0.5, 0.1), st, to) == pytest.approx(0.4)
    assert next_token_bound_s(_backend(0.5, 0.01), st, to) == 0.2
    assert next_token_bound_s(_backend(0.5, None), st, to) == 30
    assert fleet_ttft_s([_backend(0.1, None), _backend(None, None), _backend(0.3, None), _backend(0.2, None)]) == 0.2
    off = StallSpec(enabled=False)
    assert first_token_bound_s(_backend(0.5, 0.02), None, off, to) == 60 and next_token_bound_s(_backend(0.5, 0.1), off, to) == 30


@contextlib.asynccontextmanager
async def _gateway(urls: list[str], **cfg: Any) -> AsyncIterator[tuple[Any, str]]:
    doc = {"backends": [{"url": u, "name": f"e{i}", "role": "mixed"} for i, u in enumerate(urls)],
           "scrape": FAST_SCRAPE, "routing": {"policy": "round-robin"}, "stall": STALL, **cfg}
    async with served_gateway(doc) as (gw, url):
        yield gw, url


async def _fault(c: aiohttp.ClientSession, emu_url: str, kind: str) -> None:
    async with c.post(emu_url + "/admin/faults", json={"kind": kind}, headers={"authorization": f"Bearer {TOKEN}"}) as r:
        assert r.status == 200, await r.text()


async def _closed_loop(c: aiohttp.ClientSession, url: str, seconds: float,
                       errors: list[str] | None = None) -> list[tuple[float, bool]]:
    """CLIENTS closed-loop streams for `seconds`: (latency, completed with [DONE] and no error) each;
    the answers of failed ones are appended to `errors`."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    out: list[tuple[float, bool]] = []
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "stream": True}

    async def client() -> None:
        while loop.time() < end:
            t0 = loop.time()
            async with c.post(url + "/v1/completions", json=body) as r:
                raw = (await r.read()).decode()
            ok = r.status == 200 and raw.endswith("data: [DONE]\n\n") and '"error"' not in raw
            out.append((loop.time() - t0, ok))
            if not ok and errors is not None:
                errors.append(f"{r.status} {r.headers.get('x-fleetwise-backend')}: {raw[-300:]}")

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return out


def _goodput(results: list[tuple[float, bool]]) -> float:
    return sum(ok and lat <= SLO_S for lat, ok in results) / PHASE_S


@pytest.mark.slow
def test_one_hung_replica_of_four_keeps_the_fleets_goodput() -> None:
    """Three healthy replicas against four with one hung, measured in alternating segments of one run
    (a load spike on the test machine falls on both sides, not on one phase)."""
    figures: dict[str, Any] = {}

    async def scenario() -> None:
        three: list[tuple[float, bool]] = []
        hung: list[tuple[float, bool]] = []
        errors: list[str] = []
        async with emulators(("mixed",) * 4) as emus, aiohttp.ClientSession() as c:
            urls = [u for _, u in emus]
            async with _gateway(urls[:3]) as (_, gw3), _gateway(urls) as (gw, gw4):
                await _closed_loop(c, gw3, 0.5)  # warm-up
                await _closed_loop(c, gw4, 0.5)  # every replica has a recent TTFT
                await _fault(c, urls[3], "hang")
                async with loop_lag() as lag:
                    for _ in range(SEGMENTS):  # the hung side first: its first segment meets the hang fresh
                        hung += await _closed_loop(c, gw4, PHASE_S / SEGMENTS, errors)
                        three += await _closed_loop(c, gw3, PHASE_S / SEGMENTS)
                figures["host_stall_s"] = lag[0]
                figures["e3_up"] = gw.backends.get("e3").available(gw.now())
            await _fault(c, urls[3], "clear")
        figures.update(three=_goodput(three), hung=_goodput(hung), worst_s=max(lat for lat, _ in hung),
                       failed=sum(not ok for _, ok in hung), errors=errors)
    run(scenario, 90)
    print(f"goodput 3 replicas {figures['three']:.1f}/s, 4 with one hung {figures['hung']:.1f}/s, "
          f"slowest {figures['worst_s']:.2f} s, longest host stall of the event loop {figures['host_stall_s']:.2f} s")
    assert figures["failed"] == 0, figures["errors"][:5]
    assert not figures["e3_up"]
    assert figures["hung"] >= 0.7 * figures["three"]
    assert figures["worst_s"] <= 2 * SLO_S + figures["host_stall_s"]  # a stall of the host delays every request alike


def test_a_stream_on_a_replica_that_hangs_mid_way_migrates_and_completes() -> None:
    async def scenario() -> None:
        async with emulators(("mixed", "mixed"), time_scale=1.0) as emus, aiohttp.ClientSession() as c:
            urls = [u for _, u in emus]
            async with _gateway(urls, stall={**STALL, "probe_interval_s": 0}) as (gw, url):
                warm = {"model": MODEL, "prompt": "hi", "max_tokens": 8, "stream": True}
                for _ in range(2):  # each replica gets a recent TPOT
                    async with c.post(url + "/v1/completions", json=warm) as r:
                        await r.read()
                body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 120, "stream": True, "ignore_eos": True}
                async with c.post(url + "/v1/completions", json=body) as r:
                    first = r.headers["x-fleetwise-backend"]
                    raw = await r.content.readany()
                    while raw.count(b"data: {") < 3:
                        raw += await r.content.readany()
                    await _fault(c, urls[int(first[1:])], "hang")
                    raw += await r.content.read()
                text = raw.decode()
                events = [json.loads(b[6:]) for b in text.split("\n\n") if b.startswith("data: {")]
                assert text.endswith("data: [DONE]\n\n") and not any("error" in e for e in events), text[-300:]
                assert "".join(e["choices"][0]["text"] for e in events if e.get("choices")) == \
                    text_of(encode(PROMPT), 0, 120)
                page = gw.telemetry.render().decode()
                assert "fleetwise_gateway_migrations_total 1.0" in page
                assert f'fleetwise_gateway_upstream_errors_total{{backend="{first}",kind="timeout"}} 1.0' in page
                await _fault(c, urls[int(first[1:])], "clear")
    run(scenario, 60)


def test_every_replica_failing_its_health_checks_at_once_never_empties_the_fleet() -> None:
    """With `health_failures: 1`, one slow health round (or a stall bound hit by requests on every
    replica, as an event-loop pause on a busy machine causes) marks every healthy replica down at
    once. Health verdicts alone never empty a role (the panic threshold): one replica of four
    failing is left out, all four failing are all routed to, and once three pass again the fourth
    is left out again."""
    body = {"model": "m", "prompt": "hello", "max_tokens": 3}

    async def served_by(f: Any, n: int) -> list[str]:
        out = []
        for _ in range(n):
            status, doc, headers = await f.post("/v1/completions", body)
            assert status == 200, doc
            out.append(headers["x-fleetwise-backend"])
        return out

    async def scenario() -> None:
        async with running_fleet(4, routing={"policy": "round-robin"}, stall={"probe_interval_s": 0}) as f:
            live = f.gw.backends.live
            f.responders[3].fault = "health_fail"
            await f.wait_for(lambda: not live["b3"].healthy)
            assert "b3" not in await served_by(f, 6)
            for r in f.responders:
                r.fault = "health_fail"
            await f.wait_for(lambda: not any(b.healthy for b in live.values()))
            assert sorted(set(await served_by(f, 8))) == ["b0", "b1", "b2", "b3"]
            assert f.gw.fleet_document()["panic"] == ["mixed"]
            for r in f.responders[:3]:
                r.fault = ""
            await f.wait_for(lambda: all(live[f"b{i}"].healthy for i in range(3)))
            assert "b3" not in await served_by(f, 6)
            assert f.gw.fleet_document()["panic"] == []
    run(scenario)


def test_every_replica_slowing_down_at_once_is_not_a_fleet_outage_until_the_next_probe() -> None:
    """The whole fleet's TTFT jumps past the stall bound at once (a load spike, or an event-loop
    pause that makes every request in flight miss its bound): each stall holds its replica out
    until an active probe passes. Without the panic threshold the fleet was empty until then (a
    503 for every request; here the probe is 60 s away); with it, the next request is served."""
    async def scenario() -> None:
        async with running_fleet(3, routing={"policy": "round-robin"}, retries={"max_retries": 0},
                                 stall={"min_first_token_s": 0.3, "probe_interval_s": 60}) as f:
            body = {"model": "m", "prompt": "hello", "max_tokens": 2, "stream": True}
            for _ in range(3):  # each replica gets a recent TTFT: the bound is the 0.3 s floor
                assert (await f.stream("/v1/completions", body))[0] == 200
            for r in f.responders:
                r.ttft_s = 2.0
            res = await asyncio.gather(*(f.stream("/v1/completions", body) for _ in range(3)))
            assert [r[0] for r in res] == [502] * 3  # each missed its bound on its replica
            live = f.gw.backends.live.values()
            assert not any(b.probe_ok for b in live) and not any(b.healthy for b in live)
            for r in f.responders:
                r.ttft_s = 0.0
            status, events, _ = await f.stream("/v1/completions", body)
            assert status == 200 and events[-1] == "[DONE]", events
    run(scenario)
