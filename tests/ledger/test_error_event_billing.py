"""A backend that ends a stream with an SSE error event after some tokens: a broken stream, billed
as one (the tokens delivered, status failed), or migrated and billed once as completed."""

from __future__ import annotations

from gw_harness import run, running_fleet

from fleetwise.ledger import open_ledger

BODY = {"model": "m", "prompt": "hello world " * 20, "max_tokens": 8, "stream": True}


def texts(events: list) -> list[str]:
    return [e["choices"][0]["text"] for e in events if isinstance(e, dict) and e.get("choices")]


def test_an_error_event_mid_stream_is_billed_failed_with_the_tokens_delivered(tmp_path) -> None:
    db = str(tmp_path / "ledger.db")

    async def scenario() -> None:
        async with running_fleet(1, ledger=db) as f:
            f.responders[0].fault = "error_after:3"
            status, events, h = await f.stream("/v1/completions", BODY, {"Idempotency-Key": "e"})
            assert status == 200 and texts(events) == ["t0 ", "t1 ", "t2 "]
            assert events[-2]["error"]["type"] == "upstream_error" and events[-1] == "[DONE]"
            assert "engine failed" not in str(events)  # the backend's own error event is not relayed
            with open_ledger(db, create=False) as led:
                (r,) = led.rows()
            assert (r.request_id, r.status, r.reason, r.delivered_tokens) == (
                h["X-Request-ID"], "failed", "stream_broken_error_event", 3)
            assert (r.billed_prompt_tokens, r.billed_generated_tokens) == (0, 0)
            m = await f.metrics()
            assert m['fleetwise_gateway_upstream_errors_total{backend="b0",kind="error_event"}'] == 1
            assert f.gw.backends.live["b0"].breaker.consecutive == 1
    run(scenario)


def test_an_error_event_mid_stream_migrates_and_is_billed_once(tmp_path) -> None:
    db = str(tmp_path / "ledger.db")

    async def scenario() -> None:
        async with running_fleet(2, ledger=db, routing={"policy": "round-robin"}) as f:
            for r in f.responders:
                r.chunk_usage = True
            f.responders[0].fault = "error_after:3"
            status, events, h = await f.stream("/v1/completions", BODY, {"Idempotency-Key": "m"})
            assert status == 200 and h["x-fleetwise-backend"] == "b0"
            # three tokens from b0, the remaining five from b1's continuation, no error event
            assert texts(events) == ["t0 ", "t1 ", "t2 ", "t0 ", "t1 ", "t2 ", "t3 ", "t4 "]
            assert events[-1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for e in events)
            with open_ledger(db, create=False) as led:
                (r,) = led.rows()
                work = [(w[3], w[4], w[6], w[7]) for w in led.work()]
            assert (r.status, r.delivered_tokens, r.billed_generated_tokens, r.attempts) == ("completed", 8, 8, 1)
            assert work == [("prefill", "first", "b0", 60), ("migration", "error_event", "b1", 8 + 3),
                            ("decode", "error_event", "b1", 8)]
    run(scenario)
