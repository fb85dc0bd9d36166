"""Metrics pages as operators have them, read by `calibrate --from-metrics`: vLLM V1 and SGLang
names (one registered mapping per engine), data-parallel engines on one page, requests still
running at a scrape, an idle replica, a dump with only some metrics, unknown metrics and engines."""

from __future__ import annotations

import pytest

from fleetwise.errors import SpecError
from fleetwise.planner.measured import service_rates
from fleetwise.planner.metrics_page import parse_page
from fleetwise.spec.engine_metrics import METRIC_NAMES

MODEL = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'


def histo(name: str, count: float, total: float, labels: str = MODEL) -> list[str]:
    """A histogram's lines (one +Inf bucket), with `labels`."""
    sep = "," if labels else ""
    return [f"# TYPE {name} histogram", f'{name}_bucket{{{labels}{sep}le="+Inf"}} {count}',
            f"{name}_count{{{labels}}} {count}", f"{name}_sum{{{labels}}} {total}"]


def counter(name: str, value: float, labels: str = MODEL) -> list[str]:
    return [f"# TYPE {name} counter", f"{name}_total{{{labels}}} {value}"]


def sglang_page(req=50, ttft_n=50, ttft_sum=10.0, queue_sum=7.5, e2e_sum=110.0, extra=()) -> str:
    """An SGLang server's page: 50 finished requests of 2000 prompt and 201 output tokens, 0.2 s
    TTFT of which 0.15 s queued, 2.2 s end to end; scheduler metrics carry rank labels."""
    ranks = f'{MODEL},engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
    return "\n".join([
        *counter("sglang:prompt_tokens", 2000 * req), *counter("sglang:generation_tokens", 201 * req),
        *counter("sglang:num_requests", req), *counter("sglang:cached_tokens", 0),
        *histo("sglang:time_to_first_token_seconds", ttft_n, ttft_sum),
        *histo("sglang:e2e_request_latency_seconds", req, e2e_sum),
        *histo("sglang:inter_token_latency_seconds", 9000, 80.0),
        *histo("sglang:queue_time_seconds", req, queue_sum, ranks),
        "# TYPE sglang:num_running_reqs gauge", f"sglang:num_running_reqs{{{ranks}}} 3",
        "# TYPE sglang:token_usage gauge", f"sglang:token_usage{{{ranks}}} 0.28", *extra, ""])


def test_an_sglang_page_gives_prefill_as_ttft_less_queueing_and_decode_as_e2e_less_ttft():
    (m,) = parse_page(sglang_page(), "sg.prom")
    assert m.names is METRIC_NAMES["sglang"]
    m.span_s = 10.0
    r = service_rates([m])
    assert (r.requests, r.prompt_tokens, r.output_tokens, r.rate_rps) == (50, 2000, 201, 5.0)
    assert r.prefill_s == pytest.approx(0.2 - 0.15)
    assert r.decode_s_per_token == pytest.approx((2.2 - 0.2) / 200)


def test_an_sglang_page_without_queue_time_names_it():
    page = sglang_page().replace("sglang:queue_time_seconds", "sglang:other_seconds")
    with pytest.raises(SpecError, match=r"sg.prom: no sglang:queue_time_seconds \(with "
                                        r"sglang:time_to_first_token_seconds: the prefill time\); a mixed pool's "
                                        r"fit needs it: scrape or save the whole /metrics page"):
        service_rates(parse_page(page, "sg.prom"))


def vllm_page(engines=("0",), req=40, prompt_counter=20480 + 5 * 512, gen_counter=2560 + 5 * 30, hist=True) -> str:
    """A vLLM V1 page per engine: 40 finished requests of 512 prompt and 64 output tokens, while 5
    more are running (their tokens already in the counters, not in the per-request histograms)."""
    lines = []
    for e in engines:
        lab = f'engine="{e}",{MODEL}'
        lines += [*counter("vllm:request_success", req, lab + ',finished_reason="length"'),
                  *counter("vllm:prompt_tokens", prompt_counter, lab),
                  *counter("vllm:generation_tokens", gen_counter, lab),
                  *histo("vllm:request_prefill_time_seconds", req, 0.6, lab),
                  *histo("vllm:request_decode_time_seconds", req, 25.2, lab),
                  *histo("vllm:time_to_first_token_seconds", req + 5, 1.0, lab),
                  "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} 5"]
        if hist:
            lines += [*histo("vllm:request_prompt_tokens", req, 512 * req, lab),
                      *histo("vllm:request_generation_tokens", req, 64 * req, lab)]
    return "\n".join([*lines, "# TYPE vllm:cache_config_info gauge", 'vllm:cache_config_info{block_size="16"} 1',
                      "# TYPE process_cpu_seconds counter", "process_cpu_seconds_total 12.5", ""])


def test_lengths_come_from_the_finished_requests_not_the_counters_of_running_ones():
    (m,) = parse_page(vllm_page(), "v.prom")
    r = service_rates([m])
    assert (r.requests, r.prompt_tokens, r.output_tokens) == (40, 512, 64)
    assert r.decode_s_per_token == pytest.approx(25.2 / 40 / 63)


def test_without_the_per_request_histograms_the_counters_give_the_lengths():
    (m,) = parse_page(vllm_page(prompt_counter=20480, gen_counter=2560, hist=False), "v.prom")
    r = service_rates([m])
    assert (r.requests, r.prompt_tokens, r.output_tokens) == (40, 512, 64)


def test_data_parallel_engines_on_one_page_are_replicas_each():
    ms = parse_page(vllm_page(engines=("0", "1")), "http://h:8000/metrics")
    assert [m.source for m in ms] == ["http://h:8000/metrics engine=0", "http://h:8000/metrics engine=1"]
    for m in ms:
        m.span_s = 10.0
    r = service_rates(ms)
    assert (r.requests, r.prompt_tokens) == (80, 512)
    assert r.rate_rps == 4.5  # 45 first tokens per engine in 10 s: the rate is of requests started


def test_a_restart_of_one_data_parallel_engine_names_it():
    before = parse_page(vllm_page(engines=("0", "1"), req=400), "a.prom")
    with pytest.raises(SpecError, match=r"b.prom engine=1: vllm:request_success_total fell from 400 to 40 between "
                                        r"the two scrapes \(the replica restarted\?\)"):
        after = parse_page(vllm_page(engines=("0",), req=500) + vllm_page(engines=("1",)), "b.prom")
        [a.minus(b, 60.0) for a, b in zip(after, before, strict=True)]


@pytest.mark.parametrize(("drop", "message"), [
    (("vllm:prompt_tokens", "vllm:request_prompt_tokens"),
     r"v.prom: no vllm:request_prompt_tokens or vllm:prompt_tokens_total \(the prompt length\); a mixed pool's fit "
     r"needs it"),
    (("vllm:generation_tokens", "vllm:request_generation_tokens"),
     r"v.prom: no vllm:request_generation_tokens or vllm:generation_tokens_total \(the output length\)"),
    (("vllm:request_decode_time_seconds",), r"v.prom: no vllm:request_decode_time_seconds \(the decode time\)"),
])
def test_a_dump_with_only_some_metrics_names_the_missing_one(drop, message):
    page = "\n".join(line for line in vllm_page().splitlines() if not any(d + "_" in line or line.endswith(d + " counter")
                                                                          or d + " histogram" in line for d in drop))
    with pytest.raises(SpecError, match=message):
        service_rates(parse_page(page, "v.prom"))


def test_an_idle_replica_counts_no_requests_and_a_busy_one_without_the_counter_is_refused():
    idle = "\n".join(["# TYPE sglang:num_running_reqs gauge", f"sglang:num_running_reqs{{{MODEL}}} 0", ""])
    (m,) = parse_page(idle, "idle.prom")
    assert (m.names, m.counter("requests")) == (METRIC_NAMES["sglang"], 0.0)
    busy = "\n".join(line for line in sglang_page().splitlines() if "num_requests" not in line)
    with pytest.raises(SpecError, match=r"busy.prom: no sglang:num_requests_total while "
                                        r"sglang:time_to_first_token_seconds counted 50; scrape or save the whole"):
        parse_page(busy, "busy.prom")


def test_a_page_of_no_known_engine_lists_the_known_ones():
    with pytest.raises(SpecError, match=r"x.prom: no request metrics of a known engine \(SGLang: sglang:num_requests_total;"
                                        r" vLLM: vllm:request_success_total\)"):
        parse_page("# TYPE tgi_request_count counter\ntgi_request_count_total 5\n", "x.prom")


def test_a_restart_whose_counters_outgrew_the_first_scrape_is_caught_by_the_process_start_time():
    """A replica that restarted early in the span and then served more than it had before: no
    counter fell, but the process start time (vLLM's and `fleetwise emulate`'s pages have it) moved."""
    start = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {}\n"
    (before,) = parse_page(vllm_page(req=40) + start.format(1.7e9), "a.prom")
    (after,) = parse_page(vllm_page(req=90) + start.format(1.7e9), "b.prom")
    assert after.minus(before, 60.0).counter("requests") == 50
    (restarted,) = parse_page(vllm_page(req=90) + start.format(1.7e9 + 30), "b.prom")
    with pytest.raises(SpecError, match=r"b.prom: process_start_time_seconds moved from 1700000000 to 1700000030 "
                                        r"between the two scrapes \(the replica restarted\); measure again over a "
                                        r"span without a restart"):
        restarted.minus(before, 60.0)


def test_sglang_data_parallel_ranks_count_as_replicas_with_an_equal_share():
    """SGLang's schedulers label their series `dp_rank` while its tokenizer's request metrics add
    up every rank: a page of two DP ranks is two replicas, each half the requests, same means."""
    ranks = f'{MODEL},engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
    extra = [f'sglang:num_running_reqs{{{ranks},dp_rank="{r}"}} 3' for r in ("0", "1")]
    page = sglang_page(extra=extra).replace("# TYPE sglang:num_running_reqs gauge\n"
                                            f"sglang:num_running_reqs{{{ranks}}} 3\n", "# TYPE sglang:num_running_reqs gauge\n")
    ms = parse_page(page, "sg.prom")
    assert [(m.source, m.counter("requests")) for m in ms] == [("sg.prom dp_rank=0", 25), ("sg.prom dp_rank=1", 25)]
    for m in ms:
        m.span_s = 10.0
    r = service_rates(ms)
    assert (r.requests, r.rate_rps, r.prompt_tokens, r.output_tokens) == (50, 2.5, 2000, 201)
    assert r.prefill_s == pytest.approx(0.05)


def test_an_idle_sglang_replica_pools_with_a_busy_one_and_halves_the_rate():
    """An SGLang replica that has served nothing has no request series yet: it adds no requests
    and its span, not a missing metric."""
    idle = "\n".join(["# TYPE sglang:num_running_reqs gauge", f"sglang:num_running_reqs{{{MODEL}}} 0", ""])
    ms = [*parse_page(sglang_page(), "busy.prom"), *parse_page(idle, "idle.prom")]
    for m in ms:
        m.span_s = 10.0
    r = service_rates(ms)
    assert (r.requests, r.rate_rps, r.prompt_tokens, r.output_tokens) == (50, 2.5, 2000, 201)
