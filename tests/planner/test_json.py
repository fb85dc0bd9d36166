"""The plan document keeps its documented keys (docs/planner.md)."""

from __future__ import annotations

import json

from fleetwise.planner.report import SCHEMA, to_json

PLAN_KEYS = {"rank", "kind", "pools", "gpus", "cost_per_hour", "cost_per_1m_tokens", "predicted", "routing_policy",
             "engine", "headroom", "explanation"}
POOL_KEYS = {"role", "accelerator", "replicas", "tp", "pp", "ep", "weight_dtype", "kv_dtype", "gpus",
             "serving_replicas"}
PREDICTED_KEYS = {"ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "goodput_rps", "slo_attainment",
                  "slo_attainment_ci95", "seeds", "kv_transfer_p99_s"}


def test_top_level_keys(small_search):
    doc = to_json(small_search)
    assert set(doc) == {"schema", "name", "model", "workload", "slo", "plans", "disaggregation", "rejected",
                        "infeasible", "search"}
    assert doc["schema"] == SCHEMA
    assert doc["infeasible"] is None
    json.dumps(doc)  # serialisable as is


def test_plan_pool_and_predicted_keys(small_search):
    for p in to_json(small_search)["plans"]:
        assert set(p) == PLAN_KEYS
        assert all(set(q) == POOL_KEYS for q in p["pools"])
        assert set(p["predicted"]) == PREDICTED_KEYS
        lo, hi = p["predicted"]["slo_attainment_ci95"]
        assert 0.0 <= lo <= p["predicted"]["slo_attainment"] <= hi <= 1.0


def test_rejected_entries_name_candidate_and_reason(small_search):
    rejected = to_json(small_search)["rejected"]
    assert rejected, "a larger-TP layout is outranked, so something is always rejected here"
    assert all(set(r) == {"candidate", "reason"} and r["reason"] for r in rejected)
