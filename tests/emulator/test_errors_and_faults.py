"""Bad input gets an OpenAI-style 4xx; admin needs the bearer token; every fault kind acts."""

from __future__ import annotations

import asyncio

import pytest
from emu_helpers import TOKEN, asgi_post, cfg, run, serve, sse_events

from fleetwise.emulator.streams import StreamDropped

AUTH = {"Authorization": f"Bearer {TOKEN}"}
OK = {"prompt": "hello", "max_tokens": 4}


@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**12}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x " * 300, "max_tokens": 1}, 400, "prompt"),  # max_model_len 256
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, 400, "messages"),
    ("/v1/completions", {"prompt": "x", "kv_transfer_params": {"do_remote_decode": True}}, 400,
     "kv_transfer_params"),
])
def test_bad_input_gets_a_4xx_with_an_error_body(path, body, status, param):
    async def go():
        async with serve(cfg(max_model_len=256)) as (app, c):
            r = await c.post(path, json=body)
            assert r.status_code == status, r.text
            err = r.json()["error"]
            assert err["code"] == status and err["param"] == param and err["message"]
            assert (await c.post("/v1/completions", json=OK)).status_code == 200  # still serving
    run(go())


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b"\xff\xfe", b"[" * 100_000])
def test_malformed_json_is_a_400(raw):
    async def go():
        async with serve() as (app, c):
            r = await c.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    run(go())


def test_admin_without_or_with_a_wrong_token_is_401():
    async def go():
        async with serve() as (app, c):
            for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
                r = await c.post("/admin/faults", json={"kind": "hang"}, headers=headers)
                assert r.status_code == 401 and r.json()["error"]["code"] == 401
                assert (await c.get("/admin/faults", headers=headers)).status_code == 401
            assert app.state.replica.faults.hung is False
        async with serve(cfg(admin_token=None)) as (app, c):  # no token configured: admin disabled
            assert (await c.post("/admin/faults", json={"kind": "hang"}, headers=AUTH)).status_code == 401
    run(go())


def test_bad_fault_bodies_are_400():
    async def go():
        async with serve() as (app, c):
            for body in ({"kind": "meteor"}, {"kind": "slowdown"}, {"kind": "slowdown", "factor": -1},
                         {"kind": "hang", "duration_s": 0}, {"kind": "fail_requests", "status": 200},
                         {"kind": "hang", "bogus": 1}):
                r = await c.post("/admin/faults", json=body, headers=AUTH)
                assert r.status_code == 400, body
    run(go())


def test_slowdown_multiplies_step_time():
    async def go():
        async with serve() as (app, c):
            rep = app.state.replica
            await c.post("/v1/completions", json=OK)
            base = rep.status.busy_s
            r = await c.post("/admin/faults", json={"kind": "slowdown", "factor": 3.0}, headers=AUTH)
            assert r.json()["active"]["slowdown"]["factor"] == 3.0
            await c.post("/v1/completions", json=OK)  # the same prompt: same steps, cache hit aside
            slowed = rep.status.busy_s - base
            await c.post("/admin/faults", json={"kind": "clear"}, headers=AUTH)
            await c.post("/v1/completions", json=OK)
            again = rep.status.busy_s - base - slowed
            assert slowed == pytest.approx(3.0 * again, rel=1e-9)
    run(go())


def test_a_measured_step_time_factor_scales_every_step_and_faults_multiply_it():
    async def go():
        busy = []
        for factor in (1.0, 1.3):
            async with serve(cfg(step_time_factor=factor)) as (app, c):
                rep = app.state.replica
                await c.post("/v1/completions", json=OK)
                busy.append(rep.status.busy_s)
                if factor != 1.0:
                    await c.post("/admin/faults", json={"kind": "slowdown", "factor": 2.0}, headers=AUTH)
                    assert rep.driver.slowdown == pytest.approx(2.6)
                    await c.post("/admin/faults", json={"kind": "clear"}, headers=AUTH)
                    assert rep.driver.slowdown == pytest.approx(1.3)
        assert busy[1] == pytest.approx(1.3 * busy[0], rel=1e-9)
    run(go())


def test_hang_stalls_requests_until_cleared_and_health_stays_up():
    async def go():
        async with serve() as (app, c):
            await c.post("/admin/faults", json={"kind": "hang"}, headers=AUTH)
            pending = asyncio.create_task(c.post("/v1/completions", json=OK))
            await asyncio.sleep(0.3)  # 30 modelled seconds: an 8B prefill takes milliseconds
            assert not pending.done()
            assert (await c.get("/health")).status_code == 200
            await c.post("/admin/faults", json={"kind": "clear"}, headers=AUTH)
            r = await asyncio.wait_for(pending, 10)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    run(go())


def test_fail_requests_then_clear_and_duration_clears_by_itself():
    async def go():
        async with serve() as (app, c):
            await c.post("/admin/faults", json={"kind": "fail_requests", "status": 503}, headers=AUTH)
            r = await c.post("/v1/completions", json=OK)
            assert r.status_code == 503 and r.json()["error"]["code"] == 503
            assert (await c.get("/admin/faults", headers=AUTH)).json()["active"] == {
                "fail_requests": {"kind": "fail_requests", "duration_s": None, "status": 503}}
            await c.post("/admin/faults", json={"kind": "clear"}, headers=AUTH)
            assert (await c.post("/v1/completions", json=OK)).status_code == 200
            # 60 modelled seconds = 0.6 s at the test time scale
            await c.post("/admin/faults", json={"kind": "fail_requests", "duration_s": 60}, headers=AUTH)
            assert (await c.post("/v1/completions", json=OK)).status_code == 503
            await asyncio.sleep(1.2)
            assert (await c.post("/v1/completions", json=OK)).status_code == 200
            assert app.state.replica.faults.active == {}
    run(go())


def test_drop_streams_cuts_a_stream_after_n_tokens():
    async def go():
        async with serve() as (app, c):
            await c.post("/admin/faults", json={"kind": "drop_streams", "after_tokens": 2}, headers=AUTH)
            with pytest.raises(StreamDropped):
                await c.post("/v1/completions", json={"prompt": "hello", "max_tokens": 6, "stream": True})
            # non-streamed responses are not affected
            assert (await c.post("/v1/completions", json=OK)).status_code == 200
            await c.post("/admin/faults", json={"kind": "clear"}, headers=AUTH)
            s = sse_events((await c.post("/v1/completions", json={**OK, "stream": True})).text)
            assert s[-1] == "[DONE]"
    run(go())


def test_crash_calls_the_crash_hook():
    async def go():
        crashes: list[int] = []
        async with serve(crashes=crashes) as (app, c):
            r = await c.post("/admin/faults", json={"kind": "crash"}, headers=AUTH)
            assert r.status_code == 200 and crashes == [1]
    run(go())


def test_streamed_error_when_the_server_stops():
    async def go():
        async with serve() as (app, c):
            await c.post("/admin/faults", json={"kind": "hang"}, headers=AUTH)
            task = asyncio.create_task(c.post("/v1/completions", json={**OK, "stream": True}))
            rep = app.state.replica
            for _ in range(1000):  # until the request is in (bounded: 10 s)
                if rep.status.requests:
                    break
                await asyncio.sleep(0.01)
            await rep.stop()
            r = await asyncio.wait_for(task, 10)
            events = sse_events(r.text)
            assert events[0]["error"]["code"] == 503 and events[-1] == "[DONE]"
    run(go())


def test_unreachable_prefill_gives_a_503_on_the_decode_side():
    async def go():
        async with serve(cfg(role="decode"), kv_post=asgi_post({})) as (app, c):
            r = await c.post("/v1/completions", json={**OK, "kv_transfer_params": {
                "do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": 9, "remote_request_id": "x"}})
            assert r.status_code == 503 and "unreachable" in r.json()["error"]["message"]
    run(go())
