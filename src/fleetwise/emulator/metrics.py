"""Prometheus metrics with vLLM's names, plus `fleetwise:` extras; all times in modelled seconds.

Owns the metric objects of one emulated replica (one `CollectorRegistry` each, so several
replicas can live in one process). The names are the registry's vLLM entry
(`fleetwise.spec.engine_metrics.vllm`: the newest generation of each live name, the calibration
counters and histograms, and the names no reader reads), so the gateway and calibration read what
it writes; label names (`model_name`, `engine`), help strings and histogram buckets follow vLLM
v1's Prometheus logger (`vllm/v1/metrics/loggers.py`, vLLM 0.10-0.11): counters are exposed with
the `_total` suffix, as prometheus_client and vLLM both do.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from fleetwise.spec.engine_metrics import METRIC_NAMES, TIME_SCALE_METRIC

# vLLM exposes no `_created` series; neither do we (a process-wide prometheus_client setting).
disable_created_metrics()

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
"""vLLM's `vllm:time_to_first_token_seconds` buckets."""
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
"""vLLM's `vllm:inter_token_latency_seconds` (and time-per-output-token) buckets."""
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                           60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
"""vLLM's e2e / queue / prefill / decode / inference time buckets."""
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
"""vLLM's `vllm:iteration_tokens_total` buckets."""
NIXL_XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
"""vLLM's `vllm:nixl_xfer_time_seconds` buckets (its NIXL connector's `NixlPromMetrics`)."""
NIXL_BYTES_BUCKETS = tuple(float(2 ** k) for k in range(20, 41, 2))
"""`vllm:nixl_bytes_transferred` buckets: 1 MiB to 1 TiB by powers of 4 (fleetwise's choice)."""
OVERRUN_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
"""Deadline overrun buckets (fleetwise's own): 0.1 ms to 5 s of modelled time."""


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to `max_value` (vLLM's token-count histogram buckets)."""
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10 ** exp
            if v > max_value:
                return tuple(out)
            out.append(float(v))
        exp += 1


VLLM = METRIC_NAMES["vllm"]
"""The names this replica exports: vLLM's entry in the engine metric names registry."""

LABEL_NAMES = ("model_name", "engine")
"""Labels of every replica metric, as vLLM labels its own (`engine` is "0": one engine core)."""


class ReplicaMetrics:
    """Every metric one emulated replica exports; `render()` is the /metrics body."""

    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)  # process_*, as vLLM's default registry has: a restart shows
        self._labels = (model_name, "0")
        self._engine_metrics()
        self._request_metrics(build_1_2_5_buckets(max_model_len))
        self._kv_connector_metrics()
        self._fleetwise_metrics()

    # One labelled child per metric: the replica's `model_name` and `engine` labels.
    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, LABEL_NAMES, registry=self.registry).labels(*self._labels)

    def _counter(self, name: str, doc: str) -> Counter:
        return Counter(name, doc, LABEL_NAMES, registry=self.registry).labels(*self._labels)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, doc, LABEL_NAMES, registry=self.registry, buckets=buckets).labels(*self._labels)

    def _engine_metrics(self) -> None:
        """vLLM's engine gauges and counters: batch, queue, KV cache, prefix cache, tokens, finishes."""
        g, c, n, live = self._gauge, self._counter, VLLM.counters, VLLM.newest
        self.running = g(live("running"), "Number of requests in model execution batches.")
        self.waiting = g(live("waiting"), "Number of requests waiting to be processed.")
        self.kv_usage = g(live("kv_usage"), "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = c(n["prefix_queries"], "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = c(n["prefix_hits"], "Prefix cache hits, in terms of number of cached tokens.")
        self.preemptions = c(VLLM.unread["preemptions"], "Cumulative number of preemption from the engine.")
        self.prompt_tokens = c(n["prompt_tokens"], "Number of prefill tokens processed.")
        self.generation_tokens = c(n["generation_tokens"], "Number of generation tokens processed.")
        success = Counter(n["requests"], "Count of successfully processed requests.",
                          (*LABEL_NAMES, "finished_reason"), registry=self.registry)
        self.success = {reason: success.labels(*self._labels, reason) for reason in ("stop", "length", "abort")}

    def _request_metrics(self, tok_buckets: tuple[float, ...]) -> None:
        """vLLM's per-request histograms: token counts (buckets `tok_buckets`) and phase latencies."""
        h, lat, n, other = self._histogram, REQUEST_LATENCY_BUCKETS, VLLM.histograms, VLLM.unread
        self.req_prompt_tokens = h(n["prompt"], "Number of prefill tokens processed.", tok_buckets)
        self.req_generation_tokens = h(n["output"], "Number of generation tokens processed.", tok_buckets)
        self.req_max_tokens = h(other["max_tokens"], "Histogram of the max_tokens request parameter.",
                                tok_buckets)
        self.iteration_tokens = h(other["step_tokens"], "Histogram of number of tokens per engine_step.",
                                  ITERATION_TOKENS_BUCKETS)
        self.ttft = h(n["ttft"], "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = h(n["itl"], "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = h(n["tpot"], "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = h(n["e2e"], "Histogram of e2e request latency in seconds.", lat)
        self.queue = h(n["queue"], "Histogram of time spent in WAITING phase for request.", lat)
        self.prefill_time = h(n["prefill"], "Histogram of time spent in PREFILL phase for request.", lat)
        self.decode_time = h(n["decode"], "Histogram of time spent in DECODE phase for request.", lat)
        self.inference_time = h(other["running_time"], "Histogram of time spent in RUNNING phase for request.",
                                lat)

    def _kv_connector_metrics(self) -> None:
        """vLLM's NIXL KV-connector metrics, observed on the decode side as vLLM does (the pull's
        transfer time, in modelled seconds, and its bytes); the gateway's KV-link view reads them."""
        h, live = self._histogram, VLLM.newest
        self.nixl_xfer_time = h(live("kv_xfer"), "Histogram of transfer duration for NIXL KV Cache transfers.",
                                NIXL_XFER_BUCKETS)
        self.nixl_bytes = h(live("kv_bytes"), "Histogram of bytes transferred per NIXL KV Cache transfers.",
                            NIXL_BYTES_BUCKETS)
        self.nixl_failed = self._counter(VLLM.unread["kv_failed"], "Number of failed NIXL KV Cache transfers.")

    def _fleetwise_metrics(self) -> None:
        """fleetwise's own: step deadline overruns, engine busy time, KV hand-offs, time scale, refusals."""
        g, c, h = self._gauge, self._counter, self._histogram
        self.overrun = h("fleetwise:step_deadline_overrun_seconds",
                         "How late the event loop woke for a step deadline (modelled seconds).", OVERRUN_BUCKETS)
        self.overrun_max = g("fleetwise:step_deadline_overrun_max_seconds",
                             "Largest step deadline overrun so far (modelled seconds).")
        self.steps = c("fleetwise:engine_steps", "Engine steps completed.")
        self.busy = c("fleetwise:engine_busy_seconds", "Modelled seconds the engine spent in steps.")
        self.kv_transfer = h("fleetwise:kv_transfer_seconds",
                             "Modelled KV transfer time of disaggregated hand-offs (decode side).", TTFT_BUCKETS)
        self.kv_leases = g("fleetwise:kv_leases", "Prefilled KV held for a decode replica to pull.")
        self.kv_orphaned = c("fleetwise:kv_orphaned_byte_seconds",
                             "KV bytes x modelled seconds held under leases no decode replica pulled "
                             "(freed by expiry or by an explicit release).")
        self.time_scale = g(TIME_SCALE_METRIC, "Modelled seconds per wall second.")
        self.rejected = Counter("fleetwise:requests_rejected", "Requests refused with a 4xx/5xx status.",
                                (*LABEL_NAMES, "status"), registry=self.registry)

    def reject(self, status: int) -> None:
        """Count one refused request."""
        self.rejected.labels(*self._labels, str(status)).inc()

    def render(self) -> bytes:
        """Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
