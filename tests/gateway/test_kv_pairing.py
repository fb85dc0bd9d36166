"""The gateway pairs prefill and decode backends by the same rule as the simulator: a request
is never handed from a prefill replica to a decode replica of another model version (whose
emulator would refuse the pull), and a fleet with no compatible pair answers one clear line."""

from __future__ import annotations

import aiohttp
from gw_harness import FAST_SCRAPE, MODEL, emulators, run, served_gateway

from fleetwise.core.tokens import encode, words_text
from fleetwise.emulator.generation import text_of

PROMPT = words_text(list(range(300)))
ROLES = ("prefill", "prefill", "decode", "decode", "decode")
VERSIONS = ("v1", "v2", "v1", "v2", "v2")


def _doc(urls: list[str], roles: tuple[str, ...], versions: tuple[str, ...], policy: str) -> dict:
    return {"backends": [{"url": u, "name": f"e{i}", "role": r, "model_version": v, "accelerator": "h100-sxm",
                          "kv_dtype": "bf16", "tp": 1}
                         for i, (u, r, v) in enumerate(zip(urls, roles, versions, strict=True))],
            "scrape": FAST_SCRAPE, "routing": {"policy": policy}}


def test_every_hand_off_stays_within_a_model_version() -> None:
    async def scenario() -> None:
        each = [{"model_version": v} for v in VERSIONS]
        async with emulators(ROLES, each=each) as emus, aiohttp.ClientSession() as c:
            urls = [u for _, u in emus]
            for policy in ("round-robin", "fleetwise-default"):
                async with served_gateway(_doc(urls, ROLES, VERSIONS, policy)) as (gw, url):
                    for k in range(8):
                        async with c.post(url + "/v1/completions",
                                          json={"model": MODEL, "prompt": f"{k} {PROMPT}", "max_tokens": 6}) as r:
                            assert r.status == 200, await r.text()
                            body = await r.json()
                            backend = r.headers["x-fleetwise-backend"]
                        assert body["choices"][0]["text"] == text_of(encode(f"{k} {PROMPT}"), 0, 6)
                        assert backend in ("e2", "e3", "e4")
            # an emulator refuses a pull across versions (409), so every request above succeeding means
            # each was paired within its version; both versions served some
            pulls = {i: emus[i][0].state.replica.metrics.kv_transfer._sum.get() > 0 for i in (2, 3, 4)}
            assert pulls[2] and (pulls[3] or pulls[4])  # both versions served
            for i in (0, 1):  # no lease left behind: every prefilled KV was pulled by a matching decode
                assert not emus[i][0].state.replica.leases.held
    run(scenario)


def test_no_compatible_pair_is_a_clear_refusal() -> None:
    async def scenario() -> None:
        roles, versions = ("prefill", "decode"), ("v1", "v2")
        async with emulators(roles, each=[{"model_version": v} for v in versions]) as emus, \
                aiohttp.ClientSession() as c:
            async with served_gateway(_doc([u for _, u in emus], roles, versions, "fleetwise-default")) as (_, url):
                async with c.post(url + "/v1/completions", json={"model": MODEL, "prompt": PROMPT,
                                                                 "max_tokens": 4}) as r:
                    assert r.status == 503  # the fleet cannot serve it now (as when no backend is eligible)
                    msg = (await r.json())["error"]["message"]
            assert "model_version 'v1' -> 'v2'" in msg, msg
            assert not emus[0][0].state.replica.leases.held  # nothing was prefilled for a pair that cannot exist
    run(scenario)
