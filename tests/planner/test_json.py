"""The plan document keeps its documented keys (docs/planner.md)."""

from __future__ import annotations

import json

from fleetwise.planner.report import SCHEMA, to_json

PLAN_KEYS = {"rank", "kind", "pools", "gpus", "cost_per_hour", "cost_per_1m_tokens", "predicted", "routing_policy",
             "engine", "headroom", "headroom_checks", "decision_flips", "explanation"}
CHECK_KEYS = {"term", "role", "requests", "span_s", "attainment", "ttft_p90_s", "tpot_p90_s", "holds", "added"}
POOL_KEYS = {"role", "accelerator", "replicas", "tp", "pp", "ep", "weight_dtype", "kv_dtype", "gpus",
             "serving_replicas"}
PREDICTED_KEYS = {"ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "goodput_rps", "slo_attainment",
                  "slo_attainment_ci95", "seeds", "kv_transfer_p99_s"}


def test_top_level_keys(small_search):
    doc = to_json(small_search)
    assert set(doc) == {"schema", "name", "model", "workload", "slo", "prices", "calibration", "plans",
                        "disaggregation", "rejected", "candidates", "pd_sweep", "infeasible", "fleet", "search"}
    assert doc["schema"] == SCHEMA
    assert doc["infeasible"] is None
    json.dumps(doc)  # serialisable as is


def test_plan_pool_and_predicted_keys(small_search):
    for p in to_json(small_search)["plans"]:
        assert set(p) == PLAN_KEYS
        assert all(set(q) == POOL_KEYS for q in p["pools"])
        assert set(p["predicted"]) == PREDICTED_KEYS
        assert [set(h) for h in p["headroom_checks"]] == [CHECK_KEYS] * 3  # a failure, an upgrade, a cold join
        lo, hi = p["predicted"]["slo_attainment_ci95"]
        assert 0.0 <= lo <= p["predicted"]["slo_attainment"] <= hi <= 1.0


def test_rejected_entries_name_candidate_and_reason(small_search):
    rejected = to_json(small_search)["rejected"]
    assert rejected, "a larger-TP layout is outranked, so something is always rejected here"
    assert all(set(r) == {"candidate", "reason"} and r["reason"] for r in rejected)


def test_every_candidate_is_recorded_with_cost_goodput_and_verdict(small_search):
    from fleetwise.planner.candidates import VERDICTS

    doc = to_json(small_search)
    cands = doc["candidates"]
    by_key = {c["candidate"]: c for c in cands}
    # Every sized fleet is there, plus the colocated layouts the goodput phase left unsimulated.
    assert {c.key for c in small_search.sized} <= set(by_key)
    assert [c["cost_per_hour"] for c in cands] == sorted(c["cost_per_hour"] for c in cands)
    rejected = {r["candidate"]: r["reason"] for r in doc["rejected"]}
    for c in cands:
        assert c["verdict"] in VERDICTS and c["cost_per_hour"] > 0 and c["goodput_rps"] > 0
        if c["reason"] is not None and c["verdict"] != "ranked":
            assert rejected[c["candidate"]] == c["reason"]
    for p in doc["plans"]:  # a reported plan is its candidate, ranked, with its simulated goodput
        c = next(c for c in cands if c["rank"] == p["rank"])
        assert c["verdict"] == "ranked" and c["reason"] is None and c["goodput_source"] == "simulated"
        assert (c["cost_per_hour"], c["gpus"], c["goodput_rps"]) == (p["cost_per_hour"], p["gpus"],
                                                                       round(p["predicted"]["goodput_rps"], 4))
    assert doc["pd_sweep"] == []  # disaggregation is off in this spec


def test_the_verdict_is_one_of_the_documented_values_with_one_serving_replica(small_search):
    # 0.2 req/s: one serving replica, too few to split at equal cost; the verdict is still
    # `colocate` (docs/planner.md: "colocate|disaggregate"), not a third spelling.
    dg = to_json(small_search)["disaggregation"]
    assert dg["verdict"] == "colocate"
    assert dg["reason"] == ("the colocated plan has 1 serving replica(s): too few to split into prefill and "
                            "decode pools at equal cost")
