"""/readiness: ready while every role a request needs has a backend the router may send to (a
panic routes to all, so it stays ready), and the panic stays visible."""

from __future__ import annotations

from typing import Any

from gw_harness import run, running_fleet


async def _ready(f: Any) -> tuple[int, dict[str, Any]]:
    async with f.client.get(f.url + "/readiness") as r:
        return r.status, await r.json()


def test_a_health_panic_stays_ready_and_visible() -> None:
    async def scenario() -> None:
        async with running_fleet(2) as f:
            assert await _ready(f) == (200, {"ready": True, "available_backends": 2, "routable": {"mixed": 2},
                                             "panic": []})
            for r in f.responders:
                r.fault = "health_fail"
            await f.wait_for(lambda: f.gw.backends.panic == {"mixed"})
            assert await _ready(f) == (200, {"ready": True, "available_backends": 0, "routable": {"mixed": 2},
                                             "panic": ["mixed"]})
            assert f.gw.fleet_document()["panic"] == ["mixed"]
            status, _, _ = await f.post("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2})
            assert status == 200  # the gateway routes, so it is ready
    run(scenario)


def test_pd_is_ready_only_with_both_legs_routable() -> None:
    async def scenario() -> None:
        async with running_fleet(2, roles=("prefill", "decode"), scrape={
                "interval_s": 0.05, "timeout_s": 0.5, "health_interval_s": 0.05, "health_failures": 1,
                "panic_threshold": 0.0}) as f:
            assert (await _ready(f))[0] == 200
            f.responders[1].fault = "health_fail"
            await f.wait_for(lambda: not f.gw.backends.live["b1"].healthy)
            assert await _ready(f) == (503, {"ready": False, "available_backends": 1, "routable": {"prefill": 1},
                                             "panic": []})
    run(scenario)
