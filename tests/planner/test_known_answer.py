"""A spec whose answer is known by hand: a model that fits one card at low traffic needs one
replica to serve plus one for the failure headroom, on the smallest layout (TP=1)."""

from __future__ import annotations

from fleetwise.planner.report import to_json


def test_one_replica_plus_failure_spare(small_search):
    doc = to_json(small_search)
    best = doc["plans"][0]
    assert best["pools"][0] | {} == best["pools"][0]
    assert [(p["role"], p["accelerator"], p["replicas"], p["tp"], p["pp"], p["ep"]) for p in best["pools"]] == [
        ("mixed", "h100-sxm", 2, 1, 1, 1)
    ]
    assert best["pools"][0]["serving_replicas"] == 1
    assert best["gpus"] == 2
    assert best["cost_per_hour"] == 6.0
    assert best["headroom"]["mixed"]["serving"] == 1
    assert best["headroom"]["mixed"]["failures"] == 1
    assert best["headroom"]["mixed"]["upgrade"] == 0


def test_cost_per_1m_tokens_follows_the_target_rate(small_search):
    best = to_json(small_search)["plans"][0]
    tokens_per_hour_m = 0.2 * 64 * 3600 / 1e6
    assert best["cost_per_1m_tokens"] == round(6.0 / tokens_per_hour_m, 4)


def test_plans_are_ranked_by_cost(small_search):
    costs = [p["cost_per_hour"] for p in to_json(small_search)["plans"]]
    assert costs == sorted(costs)
    assert len(costs) == 2


def test_explanation_shows_each_step_with_numbers(small_search):
    steps = to_json(small_search)["plans"][0]["explanation"]
    assert steps[0].startswith("priced by: the default, uncalibrated perf factors")
    assert steps[1].startswith("fit: llama-3.1-8b")
    assert steps[2].startswith("latency floor:")
    assert steps[3].startswith("effective goodput:")
    assert "1 serving + 1 for 1 failure(s) + 0 for upgrade" in steps[4]
    assert any(s.startswith("simulated over 2 seeds") for s in steps)
    assert steps[-1].startswith("cost: 2 GPUs -> $6.00/h")
