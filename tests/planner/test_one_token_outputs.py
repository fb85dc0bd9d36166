"""A workload whose outputs are all one token (classification, scoring): TPOT is undefined there
(the simulator's summary gives null), so it meets any TPOT target and the plan is made."""

from __future__ import annotations

from fleetwise.planner.api import plan
from fleetwise.planner.state import PlanOptions


def test_a_plan_of_one_token_outputs_meets_the_tpot_target(spec_factory) -> None:
    spec = spec_factory(workload={"output_tokens": {"kind": "fixed", "tokens": 1}},
                        headroom={"failures_to_survive": 0, "upgrade_batch_replicas": 0})
    search = plan(spec, PlanOptions(workers=1))
    best = min((c for c in search.refined if c.refined is not None and c.refined.passed),
               key=lambda c: c.cost_per_hour)
    assert best.refined is not None
    assert all(s.passed and s.tpot == {"p50": 0.0, "p90": 0.0, "p99": 0.0} for s in best.refined.seeds)
