"""The gateway meters every request once: rows counted and matched to request ids and keys."""

from __future__ import annotations

import asyncio

from gw_harness import run, running_fleet

from fleetwise.ledger import open_ledger

PROMPT = "hello world " * 20
COMPLETION = {"model": "m", "prompt": PROMPT, "max_tokens": 6, "stream": True}


def texts(events: list) -> list[str]:
    return [e["choices"][0]["text"] for e in events if isinstance(e, dict) and e.get("choices")]


def rows(db: str) -> list:
    with open_ledger(db, create=False) as led:
        return led.rows()


def test_each_request_is_one_row_and_a_retried_key_is_replayed_and_billed_once(tmp_path) -> None:
    db = str(tmp_path / "ledger.db")

    async def scenario() -> None:
        async with running_fleet(2, ledger=db, routing={"policy": "round-robin"}) as f:
            s1, ev1, h1 = await f.stream("/v1/completions", COMPLETION, {"Idempotency-Key": "order-1"})
            served = sum(r.served for r in f.responders)
            s2, ev2, h2 = await f.stream("/v1/completions", COMPLETION, {"Idempotency-Key": "order-1"})
            # The same key and body: the stored answer again, from the gateway alone, billed once.
            assert h2.get("idempotent-replayed") == "true" and sum(r.served for r in f.responders) == served
            s3, ev3, h3 = await f.stream("/v1/completions", {**COMPLETION, "stream_options": {"include_usage": True}})
            s4, doc, h4 = await f.post("/v1/completions", {**COMPLETION, "stream": False, "max_tokens": 3})
            assert (s1, s2, s3, s4) == (200, 200, 200, 200)
            assert texts(ev1) == texts(ev2) == [f"t{i} " for i in range(6)] and ev1[-1] == ev2[-1] == "[DONE]"
            got = rows(db)
            by_rid = {r.request_id: r for r in got}
            assert len(got) == 3 and set(by_rid) == {h1["X-Request-ID"], h3["X-Request-ID"], h4["X-Request-ID"]}
            r1 = by_rid[h1["X-Request-ID"]]
            assert (r1.idempotency_key, r1.status, r1.attempts, r1.delivered_tokens, r1.billed_generated_tokens) == (
                "order-1", "completed", 1, 6, 6)
            # The gateway asked the backend for its usage block and kept it from the client.
            assert r1.prompt_tokens == 8 and not any(e != "[DONE]" and e["choices"] == [] for e in ev1)
            r3 = by_rid[h3["X-Request-ID"]]
            assert r3.idempotency_key.startswith("fw-") and (r3.prompt_tokens, r3.delivered_tokens) == (8, 6)
            r4 = by_rid[h4["X-Request-ID"]]
            assert (r4.prompt_tokens, r4.delivered_tokens, r4.billed_prompt_tokens) == (8, 3, 8)
            with open_ledger(db, create=False) as led:
                work = [(w[2], w[3], w[7]) for w in led.work(tenant="default") if w[1] == "order-1"]
            assert work == [(h1["X-Request-ID"], "prefill", 60), (h1["X-Request-ID"], "decode", 6)]
    run(scenario)


def test_bad_key_is_400_and_not_metered(tmp_path) -> None:
    db = str(tmp_path / "ledger.db")

    async def scenario() -> None:
        async with running_fleet(1, ledger=db) as f:
            status, doc, _ = await f.post("/v1/completions", COMPLETION, {"Idempotency-Key": "two words"})
            assert status == 400 and doc["error"]["param"] == "Idempotency-Key"
            assert doc["error"]["code"] == "invalid_idempotency_key"
            assert f.responders[0].served == 0
            assert rows(db) == []
    run(scenario)


def test_broken_stream_is_failed_with_what_was_delivered_and_billed_nothing(tmp_path) -> None:
    db = str(tmp_path / "ledger.db")

    async def scenario() -> None:
        async with running_fleet(1, ledger=db) as f:
            f.responders[0].fault = "die_after:3"
            status, events, h = await f.stream("/v1/completions", {**COMPLETION, "max_tokens": 8},
                                               {"Idempotency-Key": "k"})
            assert texts(events) == ["t0 ", "t1 ", "t2 "] and events[-2]["error"]["type"] == "upstream_error"
            (r,) = rows(db)
            assert (r.request_id, r.status, r.reason, r.delivered_tokens) == (
                h["X-Request-ID"], "failed", "stream_broken_disconnect", 3)
            assert (r.billed_prompt_tokens, r.billed_generated_tokens) == (0, 0)
            # The client retries with the same key: the completed retry replaces the failed attempt.
            f.responders[0].fault = ""
            status, events, h2 = await f.stream("/v1/completions", {**COMPLETION, "max_tokens": 8},
                                                {"Idempotency-Key": "k"})
            assert len(texts(events)) == 8
            (r,) = rows(db)
            assert (r.request_id, r.status, r.attempts, r.billed_generated_tokens) == (h2["X-Request-ID"], "completed",
                                                                                      2, 8)
    run(scenario)


def test_retry_before_first_byte_is_recorded_as_reprefill_work(tmp_path) -> None:
    db = str(tmp_path / "ledger.db")

    async def scenario() -> None:
        async with running_fleet(2, ledger=db, routing={"policy": "round-robin"}) as f:
            f.responders[0].fault = "fail"
            status, events, h = await f.stream("/v1/completions", COMPLETION, {"Idempotency-Key": "r"})
            assert status == 200 and h["x-fleetwise-backend"] == "b1"
            with open_ledger(db, create=False) as led:
                work = [(w[3], w[4], w[6]) for w in led.work()]
                (r,) = led.rows()
            assert work == [("prefill", "first", "b0"), ("reprefill", "5xx", "b1"), ("decode", "5xx", "b1")]
            assert (r.status, r.billed_generated_tokens) == ("completed", 6)
    run(scenario)


def test_client_gone_mid_stream_is_cancelled_with_the_tokens_it_received(tmp_path) -> None:
    db = str(tmp_path / "ledger.db")

    async def scenario() -> None:
        async with running_fleet(1, ledger=db, responder_kw={"token_delay_s": 0.02}) as f:
            async with f.client.post(f.url + "/v1/completions", json={**COMPLETION, "max_tokens": 200},
                                     headers={"Idempotency-Key": "gone"}) as r:
                got = b""
                while got.count(b"data:") < 3:
                    got += await r.content.readany()
                r.close()
            await f.wait_for(lambda: len(rows(db)) == 1)
            (row,) = rows(db)
            assert row.status == "cancelled" and row.reason == "client_gone"
            assert 3 <= row.delivered_tokens < 200 and row.billed_generated_tokens == row.delivered_tokens
    run(scenario)


def test_pd_pair_records_both_pools(tmp_path) -> None:
    db = str(tmp_path / "ledger.db")

    async def scenario() -> None:
        async with running_fleet(2, roles=("prefill", "decode"), ledger=db) as f:
            status, events, h = await f.stream("/v1/completions", COMPLETION)
            assert status == 200
            await asyncio.sleep(0)
            (r,) = rows(db)
            assert (r.prefill_pool, r.decode_pool, r.status, r.delivered_tokens) == ("default", "default", "completed", 6)
            with open_ledger(db, create=False) as led:
                assert [(w[3], w[6]) for w in led.work()] == [("prefill", "b0"), ("decode", "b1")]
    run(scenario)


def test_a_stream_the_backend_ends_without_done_is_an_error_event_and_never_billed_completed(tmp_path) -> None:
    """A backend that ends its answer well-formed (the last chunk of a chunked body, or the close of
    a close-delimited one) before `[DONE]` cut the stream short: the client gets the error event and
    `[DONE]`, the record says failed with what was delivered; it used to be a completed record and
    a stream that just stopped, without `[DONE]` or an error."""
    db = str(tmp_path / "ledger.db")

    async def scenario() -> None:
        async with running_fleet(1, ledger=db) as f:
            f.responders[0].fault = "end_after:3"
            status, events, headers = await f.stream("/v1/completions", COMPLETION)
            assert status == 200 and texts(events) == ["t0 ", "t1 ", "t2 "]
            assert events[-2]["error"]["type"] == "upstream_error" and events[-1] == "[DONE]"
            (row,) = rows(db)
            assert (row.request_id, row.status, row.delivered_tokens) == (headers["X-Request-ID"], "failed", 3)
            assert (await f.metrics())["fleetwise_gateway_stream_errors_total"] == 1
    run(scenario)
