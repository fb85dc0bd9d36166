"""vLLM's metric names (V1 engine, vllm/v1/metrics/loggers.py, vLLM 0.10-0.11; `fleetwise emulate`
serves the same).

Live names, newest first: v0.10 renamed `gpu_cache_usage_perc` to `kv_cache_usage_perc` and
`gpu_prefix_cache_*` to `prefix_cache_*`; V0's `time_per_output_token_seconds` is V1's
`inter_token_latency_seconds`. The KV transfer histograms are its NIXL connector's
(`NixlPromMetrics`), observed on the decode side. Counters grow every step (tokens of running
requests included); the per-request histograms are observed when a request finishes, so the fit
takes lengths from `request_prompt_tokens` and `request_generation_tokens` where a page has them.
Data-parallel engines behind one server label their series `engine`.
"""

from fleetwise.spec.engine_metrics import EngineMetrics, register

_COUNTERS = {"requests": "vllm:request_success", "prompt_tokens": "vllm:prompt_tokens",
             "generation_tokens": "vllm:generation_tokens", "prefix_hits": "vllm:prefix_cache_hits",
             "prefix_queries": "vllm:prefix_cache_queries"}
_HISTOGRAMS = {"prefill": "vllm:request_prefill_time_seconds", "decode": "vllm:request_decode_time_seconds",
               "queue": "vllm:request_queue_time_seconds", "ttft": "vllm:time_to_first_token_seconds",
               "tpot": "vllm:request_time_per_output_token_seconds", "itl": "vllm:inter_token_latency_seconds",
               "e2e": "vllm:e2e_request_latency_seconds", "prompt": "vllm:request_prompt_tokens",
               "output": "vllm:request_generation_tokens"}

VLLM = register(EngineMetrics(
    key="vllm", engine="vLLM", prefix="vllm:", precedence=0,
    live={"running": ("vllm:num_requests_running",), "waiting": ("vllm:num_requests_waiting",),
          "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
          "prefix_queries": (_COUNTERS["prefix_queries"], "vllm:gpu_prefix_cache_queries"),
          "prefix_hits": (_COUNTERS["prefix_hits"], "vllm:gpu_prefix_cache_hits"),
          "ttft": (_HISTOGRAMS["ttft"],), "itl": (_HISTOGRAMS["itl"], "vllm:time_per_output_token_seconds"),
          "kv_xfer": ("vllm:nixl_xfer_time_seconds",), "kv_bytes": ("vllm:nixl_bytes_transferred",)},
    counters=_COUNTERS, histograms=_HISTOGRAMS,
    unread={"preemptions": "vllm:num_preemptions", "max_tokens": "vllm:request_params_max_tokens",
            "step_tokens": "vllm:iteration_tokens_total", "running_time": "vllm:request_inference_time_seconds",
            "kv_failed": "vllm:nixl_num_failed_transfers"},
    replica_label="engine", hint="a vLLM or `fleetwise emulate` replica's /metrics"))
"""vLLM's entry."""
