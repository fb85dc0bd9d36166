"""The built-in planning question `fleetwise plan` answers with no argument.

Llama-3.1-70B chat on H100 vs H200 (bf16 or fp8 weights) with the ShareGPT length mix at
10 requests/s (Poisson), p90 TTFT <= 2 s and p90 TPOT <= 50 ms for 90% of requests, surviving one
replica failure, up to 64 GPUs. examples/chat-70b-h100-vs-h200.yaml is the same question as a file.
"""

from __future__ import annotations

from typing import Any

from fleetwise.spec.planning import PlanningSpec, planning_spec_from_dict

DEFAULT_SPEC: dict[str, Any] = {
    "name": "chat-70b-h100-vs-h200",
    "model": "llama-3.1-70b",
    "accelerators": [{"name": "h100-sxm"}, {"name": "h200-sxm"}],
    "workload": {"rate_rps": 10.0, "arrival": {"kind": "poisson"}, "lengths": {"kind": "preset", "name": "sharegpt"}},
    "slo": {"ttft_s": 2.0, "tpot_s": 0.05, "percentile": 90, "attainment": 0.9},
    "weight_dtypes": ["bf16", "fp8"],
    "headroom": {"failures_to_survive": 1, "cold_start_s": 120.0, "upgrade_batch_replicas": 1},
    "search": {"max_gpus": 64, "top_k": 3, "seeds": 3},
}


def default_spec() -> PlanningSpec:
    """The built-in spec, validated."""
    return planning_spec_from_dict(DEFAULT_SPEC, "built-in default spec")
