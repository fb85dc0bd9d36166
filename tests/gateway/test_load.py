"""A bounded load test over loopback: a few thousand requests, one backend killed halfway; every
request is answered or cleanly refused, and the client's counts equal the gateway's metrics."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from gw_harness import FAST_SCRAPE, run, running_fleet

REQUESTS = 2000
CONCURRENCY = 32
PATIENT_HEALTH = {**FAST_SCRAPE, "timeout_s": 2.0, "health_failures": 3}
"""Health checks that tolerate a busy test host: the killed backend is caught by the breaker and
failed connects, so a late health answer from a live backend must not refuse traffic."""


def test_load_with_a_backend_killed_halfway() -> None:
    async def scenario() -> None:
        async with running_fleet(3, routing={"policy": "least-outstanding"}, breaker={"failures": 3},
                                 scrape=PATIENT_HEALTH) as f:
            outcome: Counter[str] = Counter()
            status_seen: Counter[int] = Counter()
            sem = asyncio.Semaphore(CONCURRENCY)
            started = 0
            killed = asyncio.Event()

            async def one(i: int) -> None:
                nonlocal started
                body = {"model": "m", "prompt": f"req {i % 50} " * 10, "max_tokens": 4, "stream": i % 2 == 0}
                async with sem:
                    started += 1
                    if started == REQUESTS // 2 and not killed.is_set():
                        killed.set()
                        await f.responders[2].stop()
                    async with f.client.post(f.url + "/v1/completions", json=body) as r:
                        raw = await r.read()
                    status_seen[r.status] += 1
                    if r.status != 200:
                        assert "error" in json.loads(raw), raw[:200]
                        outcome["refused"] += 1
                    elif body["stream"]:
                        text = raw.decode()
                        assert text.endswith("data: [DONE]\n\n"), text[-200:]
                        outcome["stream_error" if '"error"' in text else "ok"] += 1
                    else:
                        assert json.loads(raw)["choices"][0]["text"] == "t0 t1 t2 t3 "
                        outcome["ok"] += 1

            await asyncio.gather(*(one(i) for i in range(REQUESTS)))
            assert killed.is_set()
            assert sum(outcome.values()) == REQUESTS
            m = await f.metrics()
            gw = {int(k.split('status="')[1].split('"')[0]): v for k, v in m.items()
                  if k.startswith('fleetwise_gateway_requests_total{endpoint="completions"')}
            assert gw == dict(status_seen)
            assert m.get("fleetwise_gateway_stream_errors_total", 0) == outcome["stream_error"]
            assert outcome["ok"] >= REQUESTS * 0.95, outcome
            assert not f.gw.backends.live["b2"].available(f.gw.now())
            assert sum(b.in_flight for b in f.gw.backends.live.values()) == 0
            assert all(b.own_prefill_tokens == b.own_decode_tokens == 0 for b in f.gw.backends.live.values())
            assert f.gw.policy.report()["in_flight"] == 0
    run(scenario, timeout_s=240)
