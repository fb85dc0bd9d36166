"""llama.cpp's server's metric names (tools/server/server.cpp, served with `--metrics`).

fleetwise reads only its live load signals: calibration has no names for this engine (no
counters or histograms here), so `calibrate --from-metrics` does not recognise its pages.
"""

from fleetwise.spec.engine_metrics import EngineMetrics, register

LLAMACPP = register(EngineMetrics(
    key="llamacpp", engine="llama.cpp", prefix="llamacpp:", precedence=2,
    live={"running": ("llamacpp:requests_processing",), "waiting": ("llamacpp:requests_deferred",),
          "kv_usage": ("llamacpp:kv_cache_usage_ratio",)},
    counters={}, histograms={},
    replica_label=None, hint="a llama.cpp server started with --metrics, its /metrics"))
"""llama.cpp's entry."""
