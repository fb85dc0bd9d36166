"""SGLang's metric names (python/sglang/srt/metrics/collector.py; served with `--enable-metrics`).

Live names, newest first (`time_per_output_token_seconds` is the older name of
`inter_token_latency_seconds`); SGLang exports its prefix cache's hit rate as a gauge
(`cache_hit_rate`), not hits and queries. The tokenizer's counters and
`e2e_request_latency_seconds` are observed when a request finishes; there are no prefill or decode
time histograms, so the fit reads prefill as time to first token less the scheduler's queueing
time, and decode as end-to-end less time to first token (its inter-token histogram's count is not
the tokens it sums). Per-request token histograms exist only with `--collect-tokens-histogram`.
With `--dp-size` the schedulers label their series `dp_rank` while the tokenizer's request
metrics add up every rank.
"""

from fleetwise.spec.engine_metrics import EngineMetrics, register

_HISTOGRAMS = {"queue": "sglang:queue_time_seconds", "ttft": "sglang:time_to_first_token_seconds",
               "e2e": "sglang:e2e_request_latency_seconds", "itl": "sglang:inter_token_latency_seconds",
               "prompt": "sglang:prompt_tokens_histogram", "output": "sglang:generation_tokens_histogram"}

SGLANG = register(EngineMetrics(
    key="sglang", engine="SGLang", prefix="sglang:", precedence=1,
    live={"running": ("sglang:num_running_reqs",), "waiting": ("sglang:num_queue_reqs",),
          "kv_usage": ("sglang:token_usage",), "prefix_hit_rate": ("sglang:cache_hit_rate",),
          "ttft": (_HISTOGRAMS["ttft"],), "itl": (_HISTOGRAMS["itl"], "sglang:time_per_output_token_seconds")},
    counters={"requests": "sglang:num_requests", "prompt_tokens": "sglang:prompt_tokens",
              "generation_tokens": "sglang:generation_tokens", "prefix_hits": "sglang:cached_tokens"},
    histograms=_HISTOGRAMS,
    replica_label=None, shared_rank_label="dp_rank", hint="an SGLang server started with --enable-metrics, its /metrics"))
"""SGLang's entry."""
