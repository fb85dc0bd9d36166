"""Fleets the deploy tests render: colocated, prefill/decode, and a multi-node MoE replica."""

from __future__ import annotations

import pytest

from fleetwise.spec.base import validate
from fleetwise.spec.plan import PlanSpec

COLOCATED = {"name": "chat", "routing": "fleetwise-default", "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
             "pools": [{"name": "mixed", "replicas": 3, "spare_replicas": 1, "accelerator": "h100-sxm",
                        "model": "llama-3.1-8b", "step_time_factor": 1.3}]}
PD = {"name": "pd-70b", "routing": "fleetwise-default", "kv_link": {"gbps": 400},
      "pools": [{"name": "prefill", "role": "prefill", "replicas": 3, "spare_replicas": 1, "accelerator": "h200-sxm",
                 "model": "llama-3.1-70b", "parallelism": {"tp": 4}, "weight_dtype": "fp8"},
                {"name": "decode", "role": "decode", "replicas": 2, "spare_replicas": 1, "accelerator": "h200-sxm",
                 "model": "llama-3.1-70b", "parallelism": {"tp": 4}, "weight_dtype": "fp8", "kv_dtype": "fp8"}]}
MULTINODE = {"name": "moe", "routing": "round-robin",
             "pools": [{"name": "big", "replicas": 2, "accelerator": "h200-sxm", "model": "qwen3-30b-a3b",
                        "parallelism": {"tp": 8, "pp": 2, "ep": 16},
                        "engine": {"enable_prefix_caching": False, "max_num_seqs": 128}}]}
FLEETS = {"colocated": COLOCATED, "pd": PD, "multinode": MULTINODE}


@pytest.fixture(params=sorted(FLEETS))
def fleet(request) -> PlanSpec:
    plan = validate(PlanSpec, FLEETS[request.param], request.param)
    plan.check(request.param)
    return plan
