"""The scrape's name table, built from the engine metric names registry: the same fields and the
same preference as the table the gateway always read, whatever order the engines come in."""

from __future__ import annotations

from fleetwise.gateway.scrape import ALIASES, aliases, parse_metrics
from fleetwise.spec.engine_metrics import METRIC_NAMES, EngineMetrics

BEFORE = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                 "llamacpp:kv_cache_usage_ratio"),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prefix_hit_rate": ("sglang:cache_hit_rate",),
    "ttft_sum": ("vllm:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_sum"),
    "ttft_count": ("vllm:time_to_first_token_seconds_count", "sglang:time_to_first_token_seconds_count"),
    "itl_sum": ("vllm:inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_sum",
                "sglang:inter_token_latency_seconds_sum", "sglang:time_per_output_token_seconds_sum"),
    "itl_count": ("vllm:inter_token_latency_seconds_count", "vllm:time_per_output_token_seconds_count",
                  "sglang:inter_token_latency_seconds_count", "sglang:time_per_output_token_seconds_count"),
    "kv_xfer_sum": ("vllm:nixl_xfer_time_seconds_sum",),
    "kv_xfer_count": ("vllm:nixl_xfer_time_seconds_count",),
    "kv_bytes_sum": ("vllm:nixl_bytes_transferred_sum",),
}
"""The literal table `gateway/scrape.py` held before the registry (commit 763d7c4)."""


def test_the_table_is_the_one_the_gateway_read_before_the_registry():
    assert ALIASES == BEFORE
    assert list(ALIASES) == list(BEFORE)


def test_the_engines_order_in_the_registry_does_not_change_the_table():
    engines = list(METRIC_NAMES.values())
    assert [e.key for e in engines] == ["llamacpp", "sglang", "vllm"]  # module order, not precedence
    assert aliases(reversed(engines)) == aliases(engines) == ALIASES
    assert aliases([engines[1], engines[2], engines[0]]) == ALIASES


def test_on_a_page_with_several_engines_names_the_lowest_precedence_wins():
    page = "llamacpp:requests_processing 9\nsglang:num_running_reqs 4\nvllm:num_requests_running 2\n" \
           "sglang:token_usage 0.5\nllamacpp:kv_cache_usage_ratio 0.75\nvllm:gpu_cache_usage_perc 0.125\n"
    load = parse_metrics(page)
    assert (load.running, load.kv_usage, load.names_seen) == (2, 0.125, 6)
    assert parse_metrics(page + "vllm:kv_cache_usage_perc 0.25\n").kv_usage == 0.25  # newest generation first


def test_a_new_engine_adds_its_names_after_those_of_lower_precedence():
    acme = EngineMetrics(key="acme", engine="Acme", prefix="acme:", precedence=1,
                         live={"running": ("acme:running",), "ttft": ("acme:ttft_seconds", "acme:ttft")},
                         counters={}, histograms={}, replica_label=None, hint="an Acme server's /metrics")
    table = aliases([acme, *METRIC_NAMES.values()])
    assert table["running"] == ("vllm:num_requests_running", "acme:running", "sglang:num_running_reqs",
                                "llamacpp:requests_processing")  # precedence 1: ties go by key, acme < sglang
    assert table["ttft_count"] == ("vllm:time_to_first_token_seconds_count", "acme:ttft_seconds_count",
                                   "acme:ttft_count", "sglang:time_to_first_token_seconds_count")
    assert {f: n for f, n in table.items() if not any(x.startswith("acme:") for x in n)} == \
        {f: n for f, n in ALIASES.items() if f not in ("running", "ttft_sum", "ttft_count")}
