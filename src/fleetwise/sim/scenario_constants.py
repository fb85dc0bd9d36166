"""Names and numbers of the acceptance scenarios, shared by their spec, runner, verdict and rendering."""

from __future__ import annotations

SCHEMA_VERSION = "fleetwise-scenarios/1"
"""`schema` of a scenarios.json document (docs/scenarios.md)."""
BASELINE = "round-robin"
"""The policy every other one is compared with, paired by seed."""
SCENARIO_NAMES = (
    "heterogeneous", "cache-mix", "long-short", "slowdown", "rolling-upgrade", "hot-tenant",
    "stale-control-plane", "pd-fan-out", "pd-degraded-link", "pd-kv-limit", "pd-rolling-upgrade", "pd-cross-vendor",
    "two-regions",
)
"""The built-in scenarios of examples/scenarios, in report order."""
TTFT_RULE_SCENARIOS = ("heterogeneous", "cache-mix", "long-short", "slowdown", "hot-tenant", "pd-fan-out",
                       "pd-degraded-link", "pd-kv-limit", "pd-rolling-upgrade", "pd-cross-vendor", "two-regions")
"""Scenarios where the default policy must beat round-robin on P99 TTFT (CI excluding zero)."""
GOODPUT_TOLERANCE = 0.05
"""The default policy's mean goodput may be at most this fraction below round-robin's."""
METRICS = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "goodput_rps", "slo_attainment")
"""Per-seed figures every run records (and the statistics cover)."""
QUEUE_POINTS = 64
"""Per-replica queue-length series are thinned to at most this many points."""
