"""Faults a client brings: an Idempotency-Key reused (replayed, 409 in flight, 422 with another
body, never free service), a non-streaming client that leaves (aborted upstream, billed as
cancelled with nothing delivered), headers that contradict a tenant's pins (403), unknown API
keys (`unknown_keys: reject`) and a /metrics token."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from gw_harness import run, running_fleet

from fleetwise.gateway import GatewayConfig
from fleetwise.gateway.call import KV_RELEASE_PATH
from fleetwise.ledger import open_ledger
from fleetwise.spec.base import read_document

BODY = {"model": "m", "prompt": "hello world " * 10, "max_tokens": 6}
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"


def _rows(db: str) -> list[Any]:
    with open_ledger(db, create=False) as led:
        return led.rows()


def test_idempotency_key_replays_refuses_in_flight_and_other_bodies(tmp_path) -> None:
    db = str(tmp_path / "l.db")

    async def scenario() -> None:
        async with running_fleet(1, ledger=db, responder_kw={"token_delay_s": 0.05}) as f:
            k = {"Idempotency-Key": "order-7"}
            first = asyncio.create_task(f.post("/v1/completions", BODY, k))
            await f.wait_for(lambda: f.responders[0].running == 1)
            status, doc, _ = await f.post("/v1/completions", BODY, k)
            assert status == 409 and doc["error"]["code"] == "idempotency_key_in_use"
            s1, d1, h1 = await first
            assert s1 == 200 and d1["choices"][0]["text"]
            s2, d2, h2 = await f.post("/v1/completions", BODY, k)
            assert (s2, d2, h2.get("idempotent-replayed")) == (200, d1, "true")
            s3, d3, _ = await f.post("/v1/completions", {**BODY, "max_tokens": 7}, k)
            assert s3 == 422 and d3["error"]["param"] == "Idempotency-Key" and "different request body" in \
                d3["error"]["message"]
            assert f.responders[0].served == 1
            (row,) = _rows(db)
            assert (row.status, row.attempts, row.billed_generated_tokens) == ("completed", 1, 6)
            # The ledger holds the key completed but this gateway no longer keeps the answer (a
            # restart, another process): a 409, never a second unbilled run.
            f.gw.idempotency = type(f.gw.idempotency)(3600, 1 << 20)
            s4, d4, _ = await f.post("/v1/completions", BODY, k)
            assert s4 == 409 and d4["error"]["code"] == "idempotency_key_consumed" and f.responders[0].served == 1
            # A first attempt that failed keeps no answer: the retry runs and is billed.
            f.responders[0].fault = "fail"
            assert (await f.post("/v1/completions", BODY, {"Idempotency-Key": "order-8"}))[0] == 502
            f.responders[0].fault = ""
            again = await f.post("/v1/completions", BODY, {"Idempotency-Key": "order-8"})
            assert again[0] == 200, again
            row8 = next(r for r in _rows(db) if r.idempotency_key == "order-8")
            assert (row8.status, row8.attempts, row8.billed_generated_tokens) == ("completed", 2, 6)
    run(scenario)


def test_non_streaming_client_gone_aborts_upstream_and_bills_nothing(tmp_path) -> None:
    db = str(tmp_path / "l.db")

    async def scenario() -> None:
        async with running_fleet(1, ledger=db, responder_kw={"token_delay_s": 0.01}) as f:
            host, port = f.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            data = json.dumps({**BODY, "max_tokens": 1500}).encode()
            writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(data), data))
            await writer.drain()
            await f.wait_for(lambda: f.responders[0].running == 1)
            writer.close()  # the client disconnects while the whole answer is being generated
            # The gateway closed its upstream request at once (1500 tokens take 15 s here).
            await f.wait_for(lambda: f.gw.backends.get("b0").in_flight == 0, 5)
            await f.wait_for(lambda: len(_rows(db)) == 1, 5)
            (row,) = _rows(db)
            assert (row.status, row.reason, row.delivered_tokens, row.billed_generated_tokens) == (
                "cancelled", "client_gone", 0, 0)
            m = await f.metrics()
            assert m['fleetwise_gateway_requests_total{endpoint="completions",status="499"}'] == 1
            assert not any("kind=" in k and "b0" in k for k in m if k.startswith("fleetwise_gateway_upstream_errors"))
    run(scenario)


def test_tenant_pins_win_over_headers_and_unknown_keys_are_rejected() -> None:
    tenants = [{"name": "eu-v1", "api_keys": ["sk-eu"], "model_version": "v1", "region": "eu"}]

    async def scenario() -> None:
        async with running_fleet(2, versions=("v1", "v2"), tenants=tenants, unknown_keys="reject") as f:
            for b in f.gw.backends.live.values():
                b.spec = b.spec.model_copy(update={"region": "eu"})
            auth = {"authorization": "Bearer sk-eu"}
            status, doc, _ = await f.post("/v1/completions", BODY, {**auth, "x-fleetwise-model-version": "v2"})
            assert status == 403 and doc["error"]["param"] == "x-fleetwise-model-version"
            assert "contradicts tenant 'eu-v1'" in doc["error"]["message"]
            status, doc, _ = await f.post("/v1/completions", BODY, {**auth, "x-fleetwise-region": "us"})
            assert status == 403 and doc["error"]["param"] == "x-fleetwise-region"
            for _ in range(4):  # the pin holds whatever the headers say
                status, _, h = await f.post("/v1/completions", BODY, {**auth, "x-fleetwise-model-version": "v1"})
                assert status == 200 and h["x-fleetwise-backend"] == "b0"
            status, doc, _ = await f.post("/v1/completions", BODY, {"authorization": "Bearer sk-unknown"})
            assert status == 401 and doc["error"]["code"] == "invalid_api_key"
            assert (await f.post("/v1/completions", BODY))[0] == 200  # no key at all: tenant default
    run(scenario)


def test_metrics_token_when_set() -> None:
    async def scenario() -> None:
        async with running_fleet(1, metrics_token="m-secret") as f:
            async with f.client.get(f.url + "/metrics") as r:
                assert r.status == 401
            async with f.client.get(f.url + "/metrics", headers={"authorization": "Bearer m-secret"}) as r:
                assert r.status == 200 and "fleetwise_gateway_requests" in await r.text()
    run(scenario)


def test_the_example_config_rejects_unknown_keys() -> None:
    cfg = GatewayConfig.model_validate(read_document(EXAMPLE))
    assert cfg.unknown_keys == "reject" and cfg.tenants and os.path.basename(str(EXAMPLE)) == "gateway.yaml"


def test_context_is_checked_before_prefill_and_a_refused_hand_off_frees_the_kv_at_once() -> None:
    from gw_harness import FAST_SCRAPE, MODEL, TOKEN, emulators, served_gateway

    from fleetwise.core.tokens import words_text

    prompt = words_text(list(range(400)))  # 400 tokens

    async def metric(c: Any, url: str, name: str) -> float:
        async with c.get(url + "/metrics") as r:
            text = await r.text()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    async def scenario() -> None:
        roles = ("prefill", "decode")
        async with emulators(roles, max_model_len=1000) as emus:
            doc = {"backends": [{"url": u, "name": r, "role": r} for (_, u), r in zip(emus, roles, strict=True)],
                   "scrape": FAST_SCRAPE, "tokenizer": "fleetwise"}
            async with served_gateway(doc) as (gw, url):
                import aiohttp
                async with aiohttp.ClientSession() as c:
                    await asyncio.sleep(0.2)  # a health round: the backends' context lengths are known
                    pre_url = emus[0][1]
                    before = await metric(c, pre_url, "vllm:prompt_tokens_total")
                    body = {"model": MODEL, "prompt": prompt, "max_tokens": 700}
                    async with c.post(url + "/v1/completions", json=body) as r:
                        doc_ = await r.json()
                    assert r.status == 400 and doc_["error"]["param"] == "max_tokens"
                    assert "context of 1000 tokens" in doc_["error"]["message"]
                    assert await metric(c, pre_url, "vllm:prompt_tokens_total") == before  # never prefilled
                    async with c.post(url + "/v1/completions", json={**body, "max_tokens": 8}) as r:
                        assert r.status == 200  # within the context: prefilled, handed off, decoded
                    assert await metric(c, pre_url, "vllm:prompt_tokens_total") == before + 400
                    async with c.post(emus[1][1] + "/admin/faults", json={"kind": "fail_requests", "status": 429},
                                      headers={"authorization": f"Bearer {TOKEN}"}) as r:
                        assert r.status == 200
                    async with c.post(url + "/v1/completions", json={**body, "max_tokens": 8}) as r:
                        assert r.status == 429  # the decode side refused the hand-off
                    for _ in range(100):
                        if await metric(c, pre_url, "fleetwise:kv_leases") == 0:
                            break
                        await asyncio.sleep(0.02)
                    assert await metric(c, pre_url, "fleetwise:kv_leases") == 0  # freed now, not in 480 s
                    assert await metric(c, pre_url, "fleetwise:kv_orphaned_byte_seconds_total") > 0
    run(scenario)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_gone_between_the_prefill_and_the_decode_frees_the_prefilled_kv(stream: bool) -> None:
    """The prefill answered (its KV is leased for the hand-off), the decode leg is sent, and the
    client leaves before the decode answers: the gateway asks the prefill side to free the KV at
    once (it used to stay leased until the lease expired, 480 s on `fleetwise emulate`)."""
    async def scenario() -> None:
        async with running_fleet(2, roles=("prefill", "decode")) as f:
            pre, dec = f.responders
            dec.ttft_s = 0.3  # the decode side answers late: the client leaves first

            async def client() -> None:
                async with f.client.post(f.url + "/v1/completions", json={**BODY, "stream": stream}) as r:
                    await r.read()

            task = asyncio.create_task(client())
            await f.wait_for(lambda: pre.prefills == 1 and dec.running == 1)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await f.wait_for(lambda: KV_RELEASE_PATH in pre.paths)
            await f.wait_for(lambda: all(b.in_flight == 0 for b in f.gw.backends.live.values()))
            assert pre.paths.count(KV_RELEASE_PATH) == 1 and not f.gw.backends.handoffs
            assert (await f.metrics())["fleetwise_gateway_kv_released_total"] == 1
    run(scenario)


def test_a_backend_url_with_a_bad_port_or_a_relative_path_is_refused_naming_the_field() -> None:
    """`http://host:99999` used to be accepted (by the config and the admin API) and then fail every
    request routed to it with a 500 and a traceback in the log."""
    from fleetwise.gateway.upstream import ConnectFailed, _origin

    async def scenario() -> None:
        async with running_fleet(1) as f:
            url = f.gw.backends.live["b0"].spec.url
            for bad, field in [({"url": "http://127.0.0.1:99999"}, "url"), ({"url": "http://127.0.0.1:8x"}, "url"),
                               ({"url": url, "name": "m1", "metrics_path": "metrics"}, "metrics_path"),
                               ({"url": url, "name": "h1", "health_path": "health"}, "health_path")]:
                async with f.client.post(f.url + "/admin/backends", json=bad, headers=f.admin_headers()) as r:
                    msg = (await r.json())["error"]["message"]
                    assert r.status == 400 and f"backend: {field}:" in msg, msg
            assert list(f.gw.backends.live) == ["b0"]
    run(scenario)
    with pytest.raises(ConnectFailed, match="port"):
        _origin("http://127.0.0.1:99999/v1/completions")


def test_a_client_that_stops_reading_is_dropped_and_its_request_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A streaming client that reads nothing used to hold its request, the upstream connection and
    the backend's work for it as long as it kept the connection open. Once the gateway's writes to
    it stay blocked `send_timeout_s`, the connection is dropped and the request ends as a client
    gone (the backend is told by the closed upstream connection)."""
    import socket

    from fleetwise.live.http import GuardedHttpTools
    monkeypatch.setattr(GuardedHttpTools, "send_timeout_s", 0.3, raising=False)

    async def scenario() -> None:
        async with running_fleet(1) as f:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", int(f.url.rsplit(":", 1)[1])))
            body = json.dumps({**BODY, "max_tokens": 1000000, "stream": True}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      b"content-length: %d\r\n\r\n%s" % (len(body), body))  # and never read
            try:
                b0 = f.gw.backends.live["b0"]
                await f.wait_for(lambda: b0.in_flight == 1)
                await f.wait_for(lambda: b0.in_flight == 0)
                await f.wait_for(lambda: f.responders[0].running == 0)
                assert (await f.metrics())['fleetwise_gateway_requests_total{endpoint="completions",status="499"}'] == 1
            finally:
                s.close()
    run(scenario)


def test_a_client_gone_during_the_prefill_asks_the_prefill_side_to_free_what_it_may_have_leased() -> None:
    """The client leaves while the prefill leg runs: the leg is cancelled, but a prefill that ended
    as the client left has leased its KV for a decode leg that never comes (1-3 of 54 requests in
    a sweep of disconnect times against two emulators). The gateway asks the prefill side to free
    the KV of its request id (`fleetwise emulate` names a hand-off by the X-Request-Id it got)."""
    async def scenario() -> None:
        async with running_fleet(2, roles=("prefill", "decode")) as f:
            pre, dec = f.responders
            pre.ttft_s = 0.3  # the prefill answers late: the client leaves first
            pre.keep_bodies = True

            async def client() -> None:
                async with f.client.post(f.url + "/v1/completions", json=BODY) as r:
                    await r.read()

            task = asyncio.create_task(client())
            await f.wait_for(lambda: pre.running == 1)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await f.wait_for(lambda: KV_RELEASE_PATH in pre.paths)
            assert dec.running == 0 and not f.gw.backends.handoffs
    run(scenario)


def test_pd_context_checks_the_prompt_on_prefill_backends_and_the_request_on_decode_ones() -> None:
    """A P/D prefill leg computes the prompt and one token, so a prefill backend's smaller context
    bounds only the prompt; the decode backend's bounds prompt + max_tokens (as each vLLM server checks)."""
    from gw_harness import FAST_SCRAPE, MODEL, emulators, served_gateway

    from fleetwise.core.tokens import words_text

    async def scenario() -> None:
        roles = ("prefill", "decode")
        async with emulators(roles, each=[{"max_model_len": 600}, {"max_model_len": 1000}]) as emus:
            doc = {"backends": [{"url": u, "name": r, "role": r} for (_, u), r in zip(emus, roles, strict=True)],
                   "scrape": FAST_SCRAPE, "tokenizer": "fleetwise"}
            async with served_gateway(doc) as (gw, url):
                import aiohttp
                async with aiohttp.ClientSession() as c:
                    await asyncio.sleep(0.2)  # a health round: the backends' context lengths are known
                    body = {"model": MODEL, "prompt": words_text(list(range(400))), "max_tokens": 500}
                    async with c.post(url + "/v1/completions", json=body) as r:
                        assert r.status == 200  # 400 + 500 > 600, but only 401 run on the prefill side
                    async with c.post(url + "/v1/completions", json={**body, "max_tokens": 700}) as r:
                        doc_ = await r.json()
                    assert r.status == 400 and doc_["error"]["param"] == "max_tokens"
                    assert "context of 1000 tokens" in doc_["error"]["message"]
                    long = {**body, "prompt": words_text(list(range(600))), "max_tokens": 8}
                    async with c.post(url + "/v1/completions", json=long) as r:
                        doc_ = await r.json()
                    assert r.status == 400 and doc_["error"]["param"] == "prompt"
                    assert doc_["error"]["message"] == ("prompt: the prompt (600 tokens) + 1 exceeds the prefill "
                                                        "backends' context of 600 tokens; shorten the prompt")
    run(scenario)
