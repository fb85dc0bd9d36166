"""Answers a healthy replica gives that are not the client's fault: another model after a
restart, a 429 while it sheds load. The request goes to a replica that can serve it; only when
none can does the client get a clear error."""

from __future__ import annotations

import asyncio

from gw_harness import run, running_fleet

COMPLETION = {"model": "m", "prompt": "hello world", "max_tokens": 3}
REQUESTS = 6
"""Requests per scenario: three rounds of round-robin over two replicas."""


def test_a_replica_back_with_another_model_gets_no_request_for_the_old_one() -> None:
    async def scenario() -> None:
        async with running_fleet(2, routing={"policy": "round-robin"}) as f:
            f.responders[1].model = "m2"  # restarted serving another model
            await f.wait_for(lambda: f.gw.discovered_models.get("b1") == frozenset({"m2"}))
            answers = [await f.post("/v1/completions", COMPLETION) for _ in range(REQUESTS)]
            assert [(s, h["x-fleetwise-backend"]) for s, _, h in answers] == [(200, "b0")] * REQUESTS
            f.responders[0].model = "m3"  # now no replica serves m; m2 still is
            await f.wait_for(lambda: f.gw.discovered_models.get("b0") == frozenset({"m3"}))
            status, doc, _ = await f.post("/v1/completions", COMPLETION)
            assert status == 404 and doc["error"]["param"] == "model"
            status, _, h = await f.post("/v1/completions", {**COMPLETION, "model": "m2"})
            assert (status, h["x-fleetwise-backend"]) == (200, "b1")
    run(scenario)


def test_a_busy_replica_429_fails_over_and_all_busy_is_one_429_with_retry_after() -> None:
    async def scenario() -> None:
        async with running_fleet(2, routing={"policy": "round-robin"}) as f:
            f.responders[1].fault = "busy"
            for stream in (False, True):
                for _ in range(REQUESTS // 2):
                    if stream:
                        status, events, h = await f.stream("/v1/completions", {**COMPLETION, "stream": True})
                        assert events[-1] == "[DONE]"
                    else:
                        status, _, h = await f.post("/v1/completions", COMPLETION)
                    assert (status, h["x-fleetwise-backend"]) == (200, "b0")
            m = await f.metrics()
            assert m['fleetwise_gateway_retries_total{cause="busy"}'] >= REQUESTS // 2
            assert f.gw.backends.live["b1"].breaker.consecutive == 0  # busy is not broken
            f.responders[0].fault = "busy"
            status, doc, h = await f.post("/v1/completions", COMPLETION)
            assert (status, doc["error"]["code"], h["Retry-After"]) == (429, "backends_busy", "3")
            assert "every backend tried is busy" in doc["error"]["message"]
        await asyncio.sleep(0)
    run(scenario)


def test_a_whole_answer_trickled_byte_by_byte_fails_over_within_its_bound() -> None:
    async def scenario() -> None:
        async with running_fleet(2, routing={"policy": "round-robin"}, timeouts={"first_byte_s": 1.0}) as f:
            f.responders[1].fault = "trickle:0.05"  # about 12 s for the whole answer, 0.05 s per read
            loop = asyncio.get_running_loop()
            for _ in range(2):  # round-robin: the second is sent to b1 first
                t0 = loop.time()
                status, doc, h = await f.post("/v1/completions", COMPLETION)
                assert (status, h["x-fleetwise-backend"], doc["choices"][0]["text"]) == (200, "b0", "t0 t1 t2 ")
                assert loop.time() - t0 < 3.0  # the 1 s bound and the retry, not the 12 s trickle
            m = await f.metrics()
            assert m['fleetwise_gateway_retries_total{cause="timeout"}'] == 1
    run(scenario)


def test_a_stream_event_trickled_byte_by_byte_is_a_stall_at_the_next_token_bound() -> None:
    async def scenario() -> None:
        async with running_fleet(1, timeouts={"idle_s": 1.0}) as f:
            f.responders[0].fault = "trickle_mid:0.05"  # about 7 s for the third event, 0.05 s per read
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            status, events, _ = await f.stream("/v1/completions", {**COMPLETION, "max_tokens": 5, "stream": True})
            assert loop.time() - t0 < 4.0  # the 1 s bound (twice at most), not the 7 s trickle
            assert status == 200 and [e["choices"][0]["text"] for e in events[:2]] == ["t0 ", "t1 "]
            assert events[2]["error"]["code"] == 502 and events[3:] == ["[DONE]"]
            m = await f.metrics()
            assert m['fleetwise_gateway_upstream_errors_total{backend="b0",kind="timeout"}'] == 1
    run(scenario)


def test_a_broken_stream_never_migrates_to_a_replica_serving_another_model() -> None:
    async def scenario() -> None:
        async with running_fleet(2) as f:
            for r in f.responders:
                r.chunk_usage = True  # counted usage: the stream may migrate
            f.responders[0].fault = "error_after:2"
            f.responders[1].model = "m2"
            await f.wait_for(lambda: f.gw.discovered_models.get("b1") == frozenset({"m2"}))
            status, events, h = await f.stream("/v1/completions", {**COMPLETION, "stream": True})
            assert (status, h["x-fleetwise-backend"]) == (200, "b0")
            assert events[-2]["error"]["code"] == 502 and events[-1] == "[DONE]"  # nowhere to continue it
            assert "/v1/completions" not in f.responders[1].paths
    run(scenario)
