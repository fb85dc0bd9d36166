"""Why each request went where it went: the decision kind and the winning scores in the records."""

from __future__ import annotations

import csv

from fleetwise.core.request import Request
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.plan import PlanSpec


def plan(routing: str) -> PlanSpec:
    return PlanSpec(name="why", routing=routing,
                    pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 3}])


def reqs(n: int = 30) -> list[Request]:
    return [Request(str(i), i * 0.05, 500 + 100 * (i % 5), 20) for i in range(n)]


def test_default_policy_records_kind_and_the_winners_scores(tmp_path):
    res = simulate(plan("fleetwise-default"), reqs(), options=SimOptions(seed=0))
    rec = res.records
    assert set(rec.decision) <= {"least-cost", "prefix", "tie"} and "least-cost" in rec.decision
    for scores in rec.decision_scores:
        assert scores is not None and set(scores) == {"total", "load", "prefix", "kv"}
        # total = load + 0.3 prefix + 0.05 kv (the preset's weights), rounded to 6 places
        assert abs(scores["total"] - (scores["load"] + 0.3 * scores["prefix"] + 0.05 * scores["kv"])) < 1e-5
    res.write(tmp_path)
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert rows[0]["decision"] == rec.decision[0]
    assert rows[0]["decision_scores"].startswith("total=") and ";load=" in rows[0]["decision_scores"]


def test_round_robin_and_rejections_are_recorded_too():
    res = simulate(plan("round-robin"), reqs(6), options=SimOptions(seed=0))
    assert res.records.decision == ["round-robin"] * 6
    assert all(s == {"total": 0} for s in res.records.decision_scores)
    pinned = [Request("0", 0.0, 100, 5, model_version="v9")]
    res = simulate(plan("fleetwise-default"), pinned, options=SimOptions(seed=0))
    assert res.records.decision == ["rejected"] and res.records.decision_scores == [None]
