"""Shared factories for planner tests: small specs whose answers are known by hand."""

from __future__ import annotations

from typing import Any

import pytest

from fleetwise.planner.api import plan
from fleetwise.planner.state import PlanOptions, Search
from fleetwise.spec.planning import PlanningSpec, planning_spec_from_dict


def make_spec(**over: Any) -> PlanningSpec:
    """Llama-3.1-8B (fits one H100) at 0.2 req/s, fixed 256/64 lengths, colocated only, one failure spare."""
    doc: dict[str, Any] = {
        "name": "small",
        "model": "llama-3.1-8b",
        "accelerators": [{"name": "h100-sxm", "price_per_hour_usd": 3.0}],
        "workload": {"rate_rps": 0.2, "prompt_tokens": {"kind": "fixed", "tokens": 256},
                     "output_tokens": {"kind": "fixed", "tokens": 64}},
        "slo": {"ttft_s": 1.0, "tpot_s": 0.05, "percentile": 90, "attainment": 0.9},
        "weight_dtypes": ["bf16"],
        "headroom": {"failures_to_survive": 1, "upgrade_batch_replicas": 1, "burst_factor": 1.0},
        "search": {"max_gpus": 8, "top_k": 2, "refine_top": 2, "seeds": 2, "sample_requests": 200,
                   "disaggregation": "off", "bisect_steps": 4},
    }
    for k, v in over.items():
        doc[k] = {**doc[k], **v} if isinstance(v, dict) and isinstance(doc.get(k), dict) else v
    return planning_spec_from_dict(doc)


@pytest.fixture(scope="session")
def small_search() -> Search:
    return plan(make_spec(), PlanOptions(workers=1))


@pytest.fixture()
def spec_factory():
    """`make_spec` as a fixture (test modules cannot import conftest under importlib mode)."""
    return make_spec
