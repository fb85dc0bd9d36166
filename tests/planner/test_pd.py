"""Disaggregated planning: a small model must get a PD plan, sized from honest stage goodputs."""

from __future__ import annotations

from typing import Any

import pytest

from fleetwise.planner.api import plan
from fleetwise.planner.pipeline import PlanOptions, Search
from fleetwise.planner.report import to_json
from fleetwise.spec.planning import planning_spec_from_dict

PD_SPEC: dict[str, Any] = {
    "name": "pd-8b", "model": "llama-3.1-8b", "accelerators": [{"name": "h200-sxm"}],
    "workload": {"rate_rps": 3, "prompt_tokens": {"kind": "uniform", "min_tokens": 1000, "max_tokens": 6000},
                 "output_tokens": {"kind": "uniform", "min_tokens": 50, "max_tokens": 250}},
    "slo": {"ttft_s": 0.5, "tpot_s": 0.03, "percentile": 90, "attainment": 0.9},
    "weight_dtypes": ["bf16"],
    "headroom": {"failures_to_survive": 0, "upgrade_batch_replicas": 0, "burst_factor": 1.0},
    "search": {"max_gpus": 3, "top_k": 3, "refine_top": 2, "seeds": 1, "sample_requests": 200,
               "disaggregation": "only", "bisect_steps": 3},
}


@pytest.fixture(scope="module")
def pd_search() -> Search:
    return plan(planning_spec_from_dict(PD_SPEC), PlanOptions(workers=1))


def test_pd_only_small_model_produces_a_plan(pd_search: Search) -> None:
    doc = to_json(pd_search)
    assert doc["infeasible"] is None
    best = doc["plans"][0]
    assert best["kind"] == "disaggregated"
    assert [(p["role"], p["tp"], p["replicas"]) for p in best["pools"]] == [("prefill", 1, 1), ("decode", 1, 1)]
    assert best["pd_ratio"] == "1:1"
    assert best["predicted"]["slo_attainment"] >= 0.9
    assert best["cost_per_hour"] == pytest.approx(2 * 3.80)


def test_decode_goodput_is_bounded_by_its_admission_queue(pd_search: Search) -> None:
    # Judged on TPOT alone, one decode replica "sustained" ~60x its analytical capacity: its
    # running batch stayed fast while its admission queue grew. TTFT now counts that queue.
    for (role, lay), g in pd_search.goodput.items():
        if role == "decode":
            mu = pd_search.estimates[lay].mu_decode_rps
            assert 0 < g <= 2.0 * mu, (lay.label, g, mu)


def test_goodput_is_rate_times_attainment(pd_search: Search) -> None:
    for p in to_json(pd_search)["plans"]:
        pr = p["predicted"]
        assert pr["goodput_rps"] == pytest.approx(3.0 * pr["slo_attainment"], rel=0.03)
