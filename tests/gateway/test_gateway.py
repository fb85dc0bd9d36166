"""The gateway end to end on 127.0.0.1: streaming, chat, P/D hand-off, faults, safe mode,
rolling version change, tenants, bad input, admin."""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
import uuid

from gw_harness import ADMIN, run, running_fleet

COMPLETION = {"model": "m", "prompt": "hello world " * 20, "max_tokens": 5, "stream": True}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 4}


def texts(events: list) -> list[str]:
    return [e["choices"][0]["text"] for e in events if isinstance(e, dict) and e.get("choices")]


def test_streaming_completion_relays_every_chunk_and_round_robins() -> None:
    async def scenario() -> None:
        async with running_fleet(2, routing={"policy": "round-robin"}) as f:
            seen = []
            for _ in range(4):
                status, events, headers = await f.stream("/v1/completions", COMPLETION)
                assert status == 200
                assert texts(events) == ["t0 ", "t1 ", "t2 ", "t3 ", "t4 "]
                assert events[-1] == "[DONE]"
                seen.append(headers["x-fleetwise-backend"])
                rid = next(v for k, v in headers.items() if k.lower() == "x-request-id")
                assert str(uuid.UUID(rid)).replace("-", "") == rid  # a UUID's form: servers validating it accept it
            assert sorted(seen) == ["b0", "b0", "b1", "b1"]
            status, doc, _ = await f.post("/v1/completions", {**COMPLETION, "stream": False})
            assert status == 200 and doc["choices"][0]["text"] == "t0 t1 t2 t3 t4 "
            m = await f.metrics()
            assert m['fleetwise_gateway_requests_total{endpoint="completions",status="200"}'] == 5
            assert m['fleetwise_gateway_decisions_total{kind="round-robin"}'] == 5
    run(scenario)


def test_chat_streaming_usage_and_models() -> None:
    async def scenario() -> None:
        async with running_fleet(1) as f:
            status, doc, _ = await f.post("/v1/chat/completions", CHAT)
            assert status == 200 and doc["choices"][0]["message"]["content"] == "t0 t1 t2 t3 "
            body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
            status, events, _ = await f.stream("/v1/chat/completions", body)
            assert status == 200
            assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": "t0 "}
            assert events[-2]["usage"]["completion_tokens"] == 4 and events[-1] == "[DONE]"
            async with f.client.get(f.url + "/v1/models") as r:
                assert [m["id"] for m in (await r.json())["data"]] == ["m"]
            async with f.client.get(f.url + "/health") as r:
                assert r.status == 200
            async with f.client.get(f.url + "/readiness") as r:
                assert r.status == 200
            await f.responders[0].stop()
            await f.wait_for(lambda: not f.gw.backends.live["b0"].healthy)
            async with f.client.get(f.url + "/readiness") as r:  # a panic routes to all: still routable
                assert (r.status, (await r.json())["panic"]) == (200, ["mixed"])
            for _ in range(5):  # a role's last backend keeps its breaker closed (max_ejection_percent)
                assert (await f.post("/v1/chat/completions", CHAT))[0] == 502
            async with f.client.get(f.url + "/readiness") as r:
                assert (r.status, (await r.json())["routable"]) == (200, {"mixed": 1})
            async with f.client.delete(f.url + "/admin/backends/b0", headers=f.admin_headers()) as r:
                assert r.status == 200
            async with f.client.get(f.url + "/readiness") as r:  # no backend left to route to
                assert (r.status, (await r.json())["routable"]) == (503, {})
    run(scenario)


def test_pd_handoff_uses_vllm_kv_transfer_protocol() -> None:
    async def scenario() -> None:
        async with running_fleet(2, roles=("prefill", "decode")) as f:
            pre, dec = f.responders
            pre.keep_bodies = dec.keep_bodies = True
            status, events, headers = await f.stream("/v1/completions", {**COMPLETION, "stream_options": {
                "include_usage": True}})
            assert status == 200 and headers["x-fleetwise-backend"] == "b1"
            assert texts(events) == ["t0 ", "t1 ", "t2 ", "t3 ", "t4 "]
            leg1, leg2 = pre.bodies[0], dec.bodies[0]
            assert leg1["max_tokens"] == 1 and leg1["stream"] is False and "stream_options" not in leg1
            assert leg1["kv_transfer_params"]["do_remote_decode"] is True
            assert leg2["kv_transfer_params"]["remote_engine_id"] == "engine-0"
            assert leg2["kv_transfer_params"]["do_remote_prefill"] is True
            assert leg2["stream"] is True and leg2["max_tokens"] == 5
            assert (pre.prefills, dec.decodes_from_remote) == (1, 1)
            assert (await f.metrics())["fleetwise_gateway_pd_handoffs_total"] == 1
    run(scenario)


def test_backend_dying_mid_stream_ends_with_error_event_and_gateway_stays_up() -> None:
    async def scenario() -> None:
        async with running_fleet(1) as f:
            f.responders[0].fault = "die_after:3"
            status, events, _ = await f.stream("/v1/completions", {**COMPLETION, "max_tokens": 8})
            assert status == 200
            assert texts(events) == ["t0 ", "t1 ", "t2 "]
            assert events[-2]["error"]["type"] == "upstream_error" and events[-1] == "[DONE]"
            f.responders[0].fault = ""
            status, events, _ = await f.stream("/v1/completions", COMPLETION)
            assert status == 200 and len(texts(events)) == 5
            m = await f.metrics()
            assert m["fleetwise_gateway_stream_errors_total"] == 1
            assert m["fleetwise_gateway_retries_total"] if "fleetwise_gateway_retries_total" in m else True
    run(scenario)


def test_hanging_backend_times_out_then_retries_elsewhere() -> None:
    async def scenario() -> None:
        async with running_fleet(2, routing={"policy": "round-robin"}, timeouts={"first_byte_s": 0.3}) as f:
            f.responders[0].fault = "hang"
            for _ in range(2):
                status, events, headers = await f.stream("/v1/completions", COMPLETION)
                assert status == 200 and headers["x-fleetwise-backend"] == "b1" and len(texts(events)) == 5
            status, doc, headers = await f.post("/v1/completions", {**COMPLETION, "stream": False})
            assert status == 200 and headers["x-fleetwise-backend"] == "b1"
            m = await f.metrics()
            assert m['fleetwise_gateway_retries_total{cause="timeout"}'] >= 1
            assert m['fleetwise_gateway_upstream_errors_total{backend="b0",kind="timeout"}'] >= 1
    run(scenario)


def test_5xx_is_retried_and_counted_but_client_4xx_is_relayed_without_breaker_fault() -> None:
    async def scenario() -> None:
        async with running_fleet(2, routing={"policy": "round-robin"}, models=["m", "other"],
                                 breaker={"failures": 2, "open_s": 60}) as f:
            f.responders[0].fault = "fail"
            for _ in range(3):
                status, _, headers = await f.post("/v1/completions", {**COMPLETION, "stream": False})
                assert status == 200 and headers["x-fleetwise-backend"] == "b1"
            assert f.gw.backends.live["b0"].breaker.state(f.gw.now()) == "open"
            # a model the gateway lists but the backend does not serve: the backend's 404 is relayed
            b1 = f.gw.backends.live["b1"]
            before = b1.breaker.consecutive
            for _ in range(3):
                status, doc, _ = await f.post("/v1/completions", {**COMPLETION, "model": "other"})
                assert status == 404 and "error" in doc
            assert b1.breaker.consecutive == before == 0 and b1.breaker.state(f.gw.now()) == "closed"
            assert f.gw.policy.report()["in_flight"] == 0  # every reservation confirmed or released
    run(scenario)


def test_client_leaving_mid_stream_aborts_upstream_and_releases_the_reservation() -> None:
    async def scenario() -> None:
        async with running_fleet(1, responder_kw={"token_delay_s": 0.05}) as f:
            async with f.client.post(f.url + "/v1/completions", json={**COMPLETION, "max_tokens": 100}) as r:
                assert r.status == 200
                await r.content.readany()
                r.close()  # the client hangs up after the first event
            await f.wait_for(lambda: f.responders[0].running == 0)
            await f.wait_for(lambda: f.gw.backends.live["b0"].in_flight == 0)
            m = await f.metrics()
            assert m['fleetwise_gateway_requests_total{endpoint="completions",status="499"}'] == 1
            assert f.gw.policy.report()["in_flight"] == 0
            assert f.gw.backends.live["b0"].breaker.consecutive == 0  # not the backend's fault
    run(scenario)


def test_all_backends_failing_gives_one_clean_502_after_bounded_retries() -> None:
    async def scenario() -> None:
        async with running_fleet(3, retries={"max_retries": 1}) as f:
            for r in f.responders:
                r.fault = "fail"
            status, doc, _ = await f.post("/v1/completions", COMPLETION)
            assert status == 502 and doc["error"]["type"] == "upstream_error"
            tried = sum(p == "/v1/completions" for r in f.responders for p in r.paths)
            assert tried == 2
    run(scenario)


def test_stale_metrics_engage_safe_mode_and_fresh_ones_leave_it() -> None:
    async def scenario() -> None:
        async with running_fleet(2, routing={"policy": "least-outstanding",
                                             "safe_mode": {"stale_after_s": 0.3, "action": "round_robin"}}) as f:
            status, _, _ = await f.post("/v1/completions", COMPLETION)
            assert status == 200 and not f.gw.policy.report()["safe_mode"]["active"]
            for r in f.responders:
                r.fault = "metrics_fail"
            await asyncio.sleep(0.5)
            status, _, _ = await f.post("/v1/completions", COMPLETION)
            assert status == 200
            m = await f.metrics()
            assert m["fleetwise_gateway_safe_mode"] == 1
            assert m['fleetwise_gateway_decisions_total{kind="safe-mode"}'] == 1
            for r in f.responders:
                r.fault = ""
            await asyncio.sleep(0.3)
            status, _, _ = await f.post("/v1/completions", COMPLETION)
            m = await f.metrics()
            assert status == 200 and m["fleetwise_gateway_safe_mode"] == 0
            assert m["fleetwise_gateway_safe_mode_seconds"] > 0.2
            assert f.gw.policy.report()["safe_mode"]["entries"] == 1
    run(scenario)


def test_rolling_version_change_through_admin_api() -> None:
    async def scenario() -> None:
        async with running_fleet(2, versions=("v1", "v1"), routing={"policy": "round-robin"}) as f:
            from responder import Responder
            new = Responder(engine_id="engine-new")
            await new.start()
            try:
                h = f.admin_headers()
                status, doc, _ = await f.post("/admin/backends", {"url": new.url, "name": "n0",
                                                                  "model_version": "v2"}, h)
                assert status == 201 and doc == {"name": "n0", "added": True}
                pin = {"x-fleetwise-model-version": "v2"}
                for _ in range(3):
                    status, _, headers = await f.post("/v1/completions", COMPLETION, pin)
                    assert status == 200 and headers["x-fleetwise-backend"] == "n0"
                for name in ("b0", "b1"):
                    async with f.client.delete(f"{f.url}/admin/backends/{name}", headers=h) as r:
                        assert r.status == 200
                for _ in range(4):
                    status, _, headers = await f.post("/v1/completions", COMPLETION)
                    assert status == 200 and headers["x-fleetwise-backend"] == "n0"
                status, doc, _ = await f.post("/v1/completions", COMPLETION, {"x-fleetwise-model-version": "v1"})
                assert status == 400 and "v1" in doc["error"]["message"]
            finally:
                await new.stop()
    run(scenario)


def test_watched_backends_file_is_reconciled(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def scenario() -> None:
        from responder import Responder
        extra = [Responder(engine_id=f"file-{i}") for i in range(2)]
        for r in extra:
            await r.start()
        path = tmp_path / "fleet.yaml"
        path.write_text(f"- {{url: '{extra[0].url}', name: f0}}\n")
        try:
            async with running_fleet(1, backends_file=str(path)) as f:
                assert set(f.gw.backends.live) == {"b0", "f0"}
                time.sleep(0.01)
                path.write_text(f"backends:\n  - {{url: '{extra[1].url}', name: f1}}\n")
                await f.wait_for(lambda: set(f.gw.backends.live) == {"b0", "f1"})
                path.write_text("backends: [{url: 'not a url'}]\n")
                await asyncio.sleep(0.2)
                assert set(f.gw.backends.live) == {"b0", "f1"}  # a bad file keeps the last good fleet
        finally:
            for r in extra:
                await r.stop()
    run(scenario)


def test_a_models_answer_of_another_shape_fails_the_health_check_without_a_traceback(caplog) -> None:  # type: ignore[no-untyped-def]
    """/v1/models answering JSON that is not `{"data": [...]}` (a list, `data` a number) escaped the
    health check as an AttributeError or TypeError: a traceback every round, and the backend never
    got a verdict. It now fails the check as invalid JSON does."""
    async def scenario() -> None:
        async with running_fleet(2, routing={"policy": "round-robin"}) as f:
            for shape in ('[{"id": "m"}]', '{"data": 5}', '"m"'):
                f.responders[1].fault = f"models:{shape}"
                await f.wait_for(lambda: not f.gw.backends.live["b1"].healthy)
                f.responders[1].fault = ""
                await f.wait_for(lambda: f.gw.backends.live["b1"].healthy)
    with caplog.at_level(logging.WARNING, logger="fleetwise.gateway"):
        run(scenario)
    assert not [r.getMessage() for r in caplog.records if r.exc_info], caplog.text[-500:]


def test_a_backends_file_naming_one_backend_twice_is_not_applied(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two entries with one name (a copy-paste with a new url) used to apply silently with the last
    url winning; like any bad file, it keeps the last good fleet and the log names the name."""
    async def scenario() -> None:
        path = tmp_path / "fleet.yaml"
        path.write_text("- {url: 'http://127.0.0.1:9', name: f0}\n")
        async with running_fleet(1, backends_file=str(path)) as f:
            assert set(f.gw.backends.live) == {"b0", "f0"}
            time.sleep(0.01)
            path.write_text("- {url: 'http://127.0.0.1:9', name: f1}\n- {url: 'http://127.0.0.1:10', name: f1}\n")
            f.gw.reload_backends_file()
            assert set(f.gw.backends.live) == {"b0", "f0"}
            assert f.gw.backends.live["f0"].spec.url == "http://127.0.0.1:9"
    run(scenario)


def test_tenant_limits_answer_429_with_retry_after() -> None:
    async def scenario() -> None:
        tenants = [{"name": "a", "api_keys": ["ka"], "requests_per_s": 1, "burst_s": 2},
                   {"name": "b", "api_keys": ["kb"], "tokens_per_s": 10},
                   {"name": "c", "api_keys": ["kc"], "max_concurrency": 1}]
        async with running_fleet(1, tenants=tenants, require_api_key=True,
                                 responder_kw={"token_delay_s": 0.05}) as f:
            ka, kb = {"authorization": "Bearer ka"}, {"authorization": "Bearer kb"}
            codes = [(await f.post("/v1/completions", {**COMPLETION, "stream": False}, ka))[0] for _ in range(3)]
            assert codes == [200, 200, 429]
            status, doc, headers = await f.post("/v1/completions", COMPLETION, ka)
            assert status == 429 and doc["error"]["code"] == "rate_limit_exceeded" and int(headers["Retry-After"]) >= 1
            big = {**COMPLETION, "max_tokens": 2, "stream": False}  # 60 prompt + 2 > the 10-token bucket
            assert (await f.post("/v1/completions", big, kb))[0] == 200  # a full bucket lets one through
            status, doc, _ = await f.post("/v1/completions", big, kb)
            assert status == 429 and "tokens/s" in doc["error"]["message"]
            kc = {"authorization": "Bearer kc"}
            res = await asyncio.gather(*(f.post("/v1/completions", {**COMPLETION, "stream": False}, kc)
                                         for _ in range(3)))
            assert sorted(r[0] for r in res) == [200, 429, 429]
            status, doc, _ = await f.post("/v1/completions", COMPLETION)
            assert status == 401 and doc["error"]["type"] == "authentication_error"
            status, doc, _ = await f.post("/v1/completions", COMPLETION, {"authorization": "Bearer nope"})
            assert status == 401
    run(scenario)


def test_bad_input_is_4xx_with_openai_error_body() -> None:
    async def scenario() -> None:
        async with running_fleet(1, limits={"max_body_bytes": 10_000}) as f:
            cases = [
                (b"{not json", 400, None),
                (b"[1, 2]", 400, None),
                (b"\xff\xfe{}", 400, None),
                (b"[" * 5000 + b"]" * 5000, 400, None),
                (b'{"model": "m", "prompt": "' + b"x" * 20_000 + b'"}', 413, None),
                ({"model": "nope", "prompt": "x"}, 404, "model"),
                ({"model": "m", "prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
                ({"model": "m", "prompt": "x", "max_tokens": 10**40}, 400, None),  # refused by the JSON reader
                ({"model": "m", "prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
                ({"model": "m", "prompt": 5}, 400, "prompt"),
                ({"model": "m"}, 400, "prompt"),
                ({"model": "m", "prompt": "x", "stream": "yes"}, 400, "stream"),
                ({"model": 3, "prompt": "x"}, 400, "model"),
            ]
            for body, code, param in cases:
                status, doc, _ = await f.post("/v1/completions", body)
                assert status == code, (body if isinstance(body, dict) else body[:40], status, doc)
                assert set(doc["error"]) == {"message", "type", "param", "code"}
                assert doc["error"]["param"] == param
            status, doc, _ = await f.post("/v1/chat/completions", {"model": "m", "messages": "hi"})
            assert status == 400 and doc["error"]["param"] == "messages"
            async with f.client.get(f.url + "/v1/nothing") as r:
                assert r.status == 404 and "error" in await r.json()
            m = await f.metrics()
            assert m['fleetwise_gateway_requests_total{endpoint="completions",status="400"}'] == 11
            assert not any(k.startswith("fleetwise_gateway_requests_total") and 'status="5' in k for k in m)
    run(scenario)


def test_admin_refuses_without_token_and_reports_the_fleet() -> None:
    async def scenario() -> None:
        async with running_fleet(2) as f:
            await f.post("/v1/completions", COMPLETION)
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": ADMIN}):
                async with f.client.get(f.url + "/admin/fleet", headers=headers) as r:
                    assert r.status == 401 and (await r.json())["error"]["type"] == "authentication_error"
            status, doc, _ = await f.post("/admin/backends", {"url": "http://127.0.0.1:1"})
            assert status == 401
            async with f.client.get(f.url + "/admin/fleet", headers=f.admin_headers()) as r:
                doc = await r.json()
            assert r.status == 200 and doc["policy"] == "fleetwise-default"
            assert [b["name"] for b in doc["backends"]] == ["b0", "b1"]
            b = next(b for b in doc["backends"] if b["selected"])
            assert b["recent"][0]["kind"] and b["recent"][0]["reason"]
            assert b["scrape_age_s"] is not None and b["scrape_age_s"] < 1.0
        async with running_fleet(1, admin_token=None) as f:
            async with f.client.get(f.url + "/admin/fleet", headers={"authorization": "Bearer x"}) as r:
                assert r.status == 403
    run(scenario)


def test_first_byte_through_gateway_adds_no_nagle_stall() -> None:
    """Time to first byte on pooled connections, through the gateway vs straight to the backend.

    A socket without TCP_NODELAY on either hop holds the first small write until the peer's
    delayed ACK (~40 ms on Linux); the gateway's median must stay well below that."""

    async def scenario() -> None:
        async with running_fleet(1) as f:
            r0 = f.responders[0]

            async def ttfb(url: str) -> float:
                t0 = time.perf_counter()
                async with f.client.post(url, json={**COMPLETION, "max_tokens": 2}) as r:
                    await r.content.readany()
                    t = time.perf_counter() - t0
                    await r.read()
                return t

            direct, via = [], []
            for _ in range(3):  # warm both pools
                await ttfb(r0.url + "/v1/completions")
                await ttfb(f.url + "/v1/completions")
            for _ in range(15):
                direct.append(await ttfb(r0.url + "/v1/completions"))
                via.append(await ttfb(f.url + "/v1/completions"))
            added = statistics.median(via) - statistics.median(direct)
            assert added < 0.025, f"first byte through the gateway {added * 1e3:.1f} ms slower than direct"
    run(scenario)


def test_listening_and_upstream_sockets_set_tcp_nodelay() -> None:
    import socket

    from fleetwise.gateway.server import listening_socket
    from fleetwise.gateway.upstream import nodelay_socket

    s = listening_socket("127.0.0.1", 0)
    u = nodelay_socket((socket.AF_INET, socket.SOCK_STREAM, 6))
    try:
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert u.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        s.close()
        u.close()
