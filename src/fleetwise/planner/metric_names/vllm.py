"""vLLM's metric names (V1 engine, vllm/v1/metrics/loggers.py; `fleetwise emulate` serves the same).

Counters grow every step (tokens of running requests included); the per-request histograms are
observed when a request finishes, so the fit takes lengths from `request_prompt_tokens` and
`request_generation_tokens` where a page has them. Data-parallel engines behind one server label
their series `engine`.
"""

from fleetwise.planner.metric_names import EngineMetrics, register

VLLM = register(EngineMetrics(
    key="vllm", engine="vLLM", prefix="vllm:",
    counters={"requests": "vllm:request_success", "prompt_tokens": "vllm:prompt_tokens",
              "generation_tokens": "vllm:generation_tokens", "prefix_hits": "vllm:prefix_cache_hits",
              "prefix_queries": "vllm:prefix_cache_queries"},
    histograms={"prefill": "vllm:request_prefill_time_seconds", "decode": "vllm:request_decode_time_seconds",
                "queue": "vllm:request_queue_time_seconds", "ttft": "vllm:time_to_first_token_seconds",
                "tpot": "vllm:request_time_per_output_token_seconds", "itl": "vllm:inter_token_latency_seconds",
                "e2e": "vllm:e2e_request_latency_seconds", "prompt": "vllm:request_prompt_tokens",
                "output": "vllm:request_generation_tokens"},
    replica_label="engine", hint="a vLLM or `fleetwise emulate` replica's /metrics"))
