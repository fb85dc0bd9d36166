"""What a backend sends that no engine should: garbage /metrics samples, oversized events and
bodies, error events mid-stream. Each is a backend fault, never a view or a buffer taken as is."""

from __future__ import annotations

import asyncio

import pytest
from gw_harness import ADMIN, run, running_fleet

from fleetwise.gateway.scrape import BadSample, parse_metrics

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
