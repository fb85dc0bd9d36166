"""Every way a request can end gives its admission back: the tenant's concurrency slot, the
backend's in-flight count and queued tokens, and the policy's reservation all return to 0."""

from __future__ import annotations

import asyncio
from typing import Any

from gw_harness import run, running_fleet

KEY = "sk-acme"
AUTH = {"authorization": f"Bearer {KEY}"}
TENANT = {"name": "acme", "api_keys": [KEY], "max_concurrency": 3}
GOOD = {"model": "m", "prompt": "hello " * 8, "max_tokens": 4}


def _counters(f: Any) -> dict[str, int]:
    lim = f.gw.limiters["acme"]
    bs = list(f.gw.backends.live.values())
    return {"tenant_active": lim.active, "backend_in_flight": sum(b.in_flight for b in bs),
            "queued_prefill": sum(b.own_prefill_tokens for b in bs),
            "queued_decode": sum(b.own_decode_tokens for b in bs),
            "policy_in_flight": int(f.gw.policy.report().get("in_flight", 0))}


async def _disconnect_mid_stream(f: Any) -> None:
    async with f.client.post(f.url + "/v1/completions", json={**GOOD, "max_tokens": 200, "stream": True},
                             headers=AUTH) as r:
        await r.content.readany()
    # leaving the block closes the connection mid-stream


def test_every_error_path_releases_its_admission() -> None:
    async def scenario() -> None:
        async with running_fleet(2, tenants=[TENANT], models=["m", "other", "llama-3.1-8b"], require_api_key=True,
                                 routing={"policy": "round-robin"}, retries={"max_retries": 1}, breaker={"failures": 1000},
                                 responder_kw={"token_delay_s": 0.01}) as f:
            cases: list[tuple[str, Any, int]] = [
                ("token id -1", {**GOOD, "prompt": [-1]}, 400),
                ("token id 2^32", {**GOOD, "prompt": [1, 2, 1 << 32]}, 400),
                ("token id past the vocabulary", {**GOOD, "model": "llama-3.1-8b", "prompt": [5, 128256]}, 400),
                ("malformed JSON", b"{not json", 400),
                ("unknown model", {**GOOD, "model": "nope"}, 404),
                ("backend 4xx", {**GOOD, "model": "other"}, 404),
                ("bad max_tokens", {**GOOD, "max_tokens": -3}, 400),
            ]
            for name, body, want in cases * 2:  # twice each: more than max_concurrency in all
                status, doc, _ = await f.post("/v1/completions", body, AUTH)
                assert status == want, (name, status, doc)
                assert isinstance(doc, dict) and "error" in doc, (name, doc)
            status, doc, _ = await f.post("/v1/completions", {**GOOD, "prompt": [-1]}, AUTH)
            assert doc["error"]["param"] == "prompt" and "token id -1" in doc["error"]["message"]
            for r in f.responders:
                r.fault = "fail"
            for _ in range(4):
                assert (await f.post("/v1/completions", GOOD, AUTH))[0] == 502
            f.responders[0].fault = f.responders[1].fault = "die_after:2"
            for _ in range(4):
                status, events, _ = await f.stream("/v1/completions", {**GOOD, "stream": True}, AUTH)
                assert status == 200 and events[-1] == "[DONE]"
            for r in f.responders:
                r.fault = ""
            for _ in range(4):
                await _disconnect_mid_stream(f)
            real_policy = f.gw.policy  # a compiled policy's methods cannot be replaced: wrap it
            f.gw.policy = _BuggyRoute(real_policy)
            for _ in range(4):
                assert (await f.post("/v1/completions", GOOD, AUTH))[0] == 500
            f.gw.policy = real_policy
            await f.wait_for(lambda: _counters(f)["tenant_active"] == 0 and _counters(f)["backend_in_flight"] == 0)
            await asyncio.sleep(0.1)
            assert _counters(f) == dict.fromkeys(_counters(f), 0)
            for _ in range(4):  # the tenant is not locked out
                assert (await f.post("/v1/completions", GOOD, AUTH))[0] == 200
            assert _counters(f)["tenant_active"] == 0
    run(scenario)


class _BuggyRoute:
    """A policy whose `route` raises (a bug in a policy), everything else the real one's."""

    def __init__(self, real: object) -> None:
        self._real = real

    def route(self, *args: object) -> None:
        raise RuntimeError("policy bug")

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)
