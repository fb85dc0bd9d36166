"""What a backend sends that no engine should: garbage /metrics samples, oversized events and
bodies, error events mid-stream. Each is a backend fault, never a view or a buffer taken as is."""

from __future__ import annotations

import asyncio

import pytest
from gw_harness import ADMIN, run, running_fleet

from fleetwise.gateway.openai import (
    ANSWER_BASE_BYTES,
    KV_BLOCK_ID_BYTES,
    LOGPROB_BYTES,
    STEP_TOKENS,
    TOKEN_BYTES,
    answer_bounds,
)
from fleetwise.gateway.scrape import BadSample, parse_metrics
from fleetwise.gateway.upstream import not_an_answer

COMPLETION = {"model": "m", "prompt": "hello world", "max_tokens": 5, "stream": True}


@pytest.mark.parametrize(("line", "why"), [
    ('vllm:num_requests_running{model_name="a"} -3', "vllm:num_requests_running is -3.0"),
    ('vllm:num_requests_waiting{model_name="a"} NaN', "vllm:num_requests_waiting is nan"),
    ('vllm:num_requests_waiting{model_name="a"} +Inf', "vllm:num_requests_waiting is inf"),
    ('vllm:kv_cache_usage_perc{model_name="b"} 1.7', "vllm:kv_cache_usage_perc is 1.7, above 1"),
    ('vllm:num_requests_running{model_name="a"} 1e12', "running is 1e+12, above 10,000,000 requests"),
    ('vllm:prefix_cache_hits_total{model_name="a"} 900', "prefix hits / queries is 4.5, above 1"),
])
def test_a_sample_no_engine_can_report_is_rejected_naming_the_metric(line: str, why: str) -> None:
    good = ('vllm:num_requests_running{model_name="a"} 2\nvllm:kv_cache_usage_perc{model_name="a"} 0.5\n'
            'vllm:prefix_cache_queries_total{model_name="a"} 200\n')
    assert parse_metrics(good).running == 2
    two = parse_metrics('vllm:kv_cache_usage_perc{engine="0"} 0.6\nvllm:kv_cache_usage_perc{engine="1"} 0.8\n')
    assert two.kv_usage == pytest.approx(0.7)  # data-parallel engines: a fraction is their mean
    with pytest.raises(BadSample) as err:
        parse_metrics(good + line + "\n")
    assert str(err.value) == why


def test_garbage_metrics_keep_the_last_good_view_and_count_scrape_errors() -> None:
    async def scenario() -> None:
        async with running_fleet(1, routing={"policy": "least-outstanding",
                                             "safe_mode": {"stale_after_s": 0.3, "action": "round_robin"}}) as f:
            b = f.gw.backends.live["b0"]
            r = f.responders[0]
            await f.wait_for(lambda: b.scraped_at_s is not None)
            assert (b.load.running, b.load.kv_usage) == (0, 0.0)
            r.metrics_text = lambda: ('vllm:num_requests_running{model_name="m"} -5\n'  # type: ignore[method-assign]
                                      'vllm:kv_cache_usage_perc{model_name="m"} 3.0\n')
            errors = b.scrape_errors
            await f.wait_for(lambda: b.scrape_errors >= errors + 3)
            assert (b.load.running, b.load.kv_usage) == (0, 0.0)  # the last good view, aging
            assert b.scrape_rejected == "vllm:num_requests_running is -5.0"
            await asyncio.sleep(0.4)
            status, _, _ = await f.post("/v1/completions", COMPLETION)
            assert status == 200
            m = await f.metrics()
            assert m["fleetwise_gateway_safe_mode"] == 1  # the view aged into safe mode, as designed
            assert m['fleetwise_gateway_scrapes_total{outcome="error"}'] >= 3
            async with f.client.get(f.url + "/admin/fleet", headers={"authorization": f"Bearer {ADMIN}"}) as resp:
                doc = await resp.json()
            assert doc["backends"][0]["scrape_rejected"] == "vllm:num_requests_running is -5.0"
            del r.metrics_text  # the class's page again
            await f.wait_for(lambda: b.scrape_rejected is None)
    run(scenario)


def test_answer_bounds_follow_max_tokens_logprobs_and_echo() -> None:
    plain = answer_bounds({}, 100, 16)
    assert plain.event_bytes == ANSWER_BASE_BYTES + 16 * TOKEN_BYTES
    assert plain.body_bytes == plain.event_bytes + 100 * KV_BLOCK_ID_BYTES  # a prefill answer names its blocks
    lp = answer_bounds({"logprobs": 5}, 100, 1000)  # completions: the sampled token and 5 alternatives
    per = TOKEN_BYTES + 6 * LOGPROB_BYTES
    assert lp.event_bytes == ANSWER_BASE_BYTES + STEP_TOKENS * per
    assert lp.body_bytes == ANSWER_BASE_BYTES + 1000 * per + 100 * KV_BLOCK_ID_BYTES
    chat = answer_bounds({"logprobs": True, "top_logprobs": 20}, 100, 10)
    assert chat.body_bytes == ANSWER_BASE_BYTES + 10 * (TOKEN_BYTES + 21 * LOGPROB_BYTES) + 100 * KV_BLOCK_ID_BYTES
    echo = answer_bounds({"echo": True}, 100, 10)
    assert echo.event_bytes == echo.body_bytes - 100 * KV_BLOCK_ID_BYTES == ANSWER_BASE_BYTES + 110 * TOKEN_BYTES


@pytest.mark.parametrize(("where", "stream"), [("first", True), ("body", False), ("error", False), ("error", True)])
def test_an_oversized_answer_before_the_first_byte_fails_over(where: str, stream: bool) -> None:
    async def scenario() -> None:
        async with running_fleet(2, routing={"policy": "round-robin"}) as f:
            f.responders[0].fault = f"oversize:{where}"
            status, doc, headers = (await f.stream("/v1/completions", COMPLETION) if stream else
                                    await f.post("/v1/completions", {**COMPLETION, "stream": False}))
            assert (status, headers["x-fleetwise-backend"]) == (200, "b1")
            text = [e["choices"][0]["text"] for e in doc[:-1]] if stream else [doc["choices"][0]["text"]]
            assert "".join(text) == "t0 t1 t2 t3 t4 "
            counts = {k: v for k, v in (await f.metrics()).items() if "oversized" in k}
            assert counts == {'fleetwise_gateway_upstream_errors_total{backend="b0",kind="oversized"}': 1.0,
                              'fleetwise_gateway_retries_total{cause="oversized"}': 1.0}
    run(scenario)


def test_an_oversized_event_mid_stream_ends_it_with_the_error_event() -> None:
    async def scenario() -> None:
        async with running_fleet(1) as f:
            f.responders[0].fault = "oversize:mid"
            status, events, _ = await f.stream("/v1/completions", COMPLETION)
            assert status == 200 and [e["choices"][0]["text"] for e in events[:2]] == ["t0 ", "t1 "]
            assert events[2]["error"]["type"] == "upstream_error" and "oversized" in events[2]["error"]["message"]
            assert events[3:] == ["[DONE]"]
            assert f.gw.backends.live["b0"].in_flight == 0
    run(scenario)


def test_a_200_that_is_no_completion_fails_over_before_the_first_byte() -> None:
    retried = 'fleetwise_gateway_retries_total{cause="protocol"}'
    faults = 'fleetwise_gateway_upstream_errors_total{backend="b1",kind="protocol"}'

    async def scenario() -> None:
        async with running_fleet(2, routing={"policy": "round-robin"}, breaker={"failures": 1000}) as f:
            before = 0.0
            for fault, stream in (("garbage:body", False), ("garbage:first", True)):
                f.responders[1].fault = fault
                for _ in range(2):  # round-robin: at least one of the two is sent to b1 first
                    if stream:
                        status, events, h = await f.stream("/v1/completions", COMPLETION)
                        assert events[-1] == "[DONE]" and "error" not in events[-2]
                    else:
                        status, doc, h = await f.post("/v1/completions", {**COMPLETION, "stream": False})
                        assert doc["choices"][0]["text"]
                    assert (status, h["x-fleetwise-backend"]) == (200, "b0")
                m = await f.metrics()
                assert m[retried] == m[faults] > before
                before = m[retried]
    run(scenario)


@pytest.mark.parametrize(("answer", "stream", "engine_like"), [
    (b'{"id": "cmpl-1", "choices": []}', False, True),
    (b"<html>502</html>", False, False),
    (b'["a list"]', False, False),
    (b'data: {"id": "cmpl-1"}\n\ndata: {"id": "cmpl-1"}\n\n', True, True),
    (b"data: [DONE]\n\n", True, True),
    (b": keep-alive\nevent: message\n\n", True, True),  # a comment-only event: SSE allows it
    (b"data: <html>\n\n", True, False),
    (b"<html>\n\n", True, False),
])
def test_what_counts_as_an_engines_answer(answer: bytes, stream: bool, engine_like: bool) -> None:
    assert (not_an_answer(answer, stream) is None) == engine_like
