"""The retry budget (Envoy's `retry_budget`): retries in flight are bounded by a share of the
requests in flight, so failing backends under load do not get up to `max_retries + 1` times it."""

from __future__ import annotations

import asyncio

from gw_harness import run, running_fleet

from fleetwise.gateway.retry_budget import RetryBudget

BODY = {"model": "m", "prompt": "hi", "max_tokens": 2}
NO_EJECTION = {"failures": 1000, "open_s": 60}


def test_budget_limit_is_the_share_of_requests_in_flight_or_the_floor() -> None:
    b = RetryBudget(20.0, 3)
    assert b.limit() == 3  # nothing in flight: the floor
    b.active = 40
    assert b.limit() == 8
    assert [b.take() for _ in range(9)] == [True] * 8 + [False]
    assert (b.retrying, b.refused) == (8, 1)
    b.give()
    assert b.take() and b.retrying == 8
    assert RetryBudget(0.0, 0).take() is False
    free = RetryBudget(None, 0)  # no budget: every request in flight may be on a retry
    free.active = 5
    assert [free.take() for _ in range(5)] == [True] * 5 and free.refused == 0


def test_a_spent_budget_ends_the_request_with_its_error_and_says_why() -> None:
    async def scenario() -> None:
        async with running_fleet(3, retries={"max_retries": 2, "budget_percent": 0, "min_retry_concurrency": 0},
                                 breaker=NO_EJECTION) as f:
            for r in f.responders:
                r.fault = "fail"
            for _ in range(4):
                status, doc, _ = await f.post("/v1/completions", BODY)
                assert status == 502 and doc["error"]["code"] == "upstream_failed"
                assert "no retry: the retry budget is spent (0 retries in flight, at most 0)" in doc["error"]["message"]
            assert sum(r.failed for r in f.responders) == 4  # one attempt each
            assert f.gw.telemetry.retries_refused._value.get() == 4
            assert (f.gw.retry_budget.active, f.gw.retry_budget.retrying) == (0, 0)
    run(scenario)


def test_within_the_budget_each_request_retries_up_to_max_retries_and_the_slots_come_back() -> None:
    async def scenario() -> None:
        async with running_fleet(3, retries={"max_retries": 2, "budget_percent": 20}, breaker=NO_EJECTION) as f:
            for r in f.responders:
                r.fault = "fail"
            for _ in range(3):  # one at a time: the floor of 3 retries in flight always allows one
                status, doc, _ = await f.post("/v1/completions", BODY)
                assert status == 502 and "retry budget" not in doc["error"]["message"]
            assert sum(r.failed for r in f.responders) == 9
            results = await asyncio.gather(*(f.post("/v1/completions", BODY) for _ in range(12)))
            assert [s for s, _, _ in results] == [502] * 12
            refused = f.gw.telemetry.retries_refused._value.get()
            # 12 first attempts; a request whose retry found the budget spent made no more
            assert sum(r.failed for r in f.responders) == 9 + 12 + 2 * (12 - refused)
            assert (f.gw.retry_budget.active, f.gw.retry_budget.retrying) == (0, 0)
    run(scenario)
