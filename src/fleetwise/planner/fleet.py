"""The fleet document of a ranked plan: what `plan --json` carries as `fleet` and `--fleet-out` writes.

Owns turning a refined candidate into the one fleet schema (`fleetwise.spec.plan.PlanSpec`) every
command that runs a fleet reads: its full pools (serving replicas plus the N+k spares, which
become each pool's `spare_replicas`), engine settings, KV link, the routing policy the planner
simulated, failure-domain decisions, perf profile and the SLO it was sized for.
"""

from __future__ import annotations

from typing import Any

from fleetwise.planner.simulate import to_plan_spec
from fleetwise.planner.state import Candidate, Search
from fleetwise.spec.plan import PlanSpec


def fleet_of(search: Search, c: Candidate) -> PlanSpec:
    """The fleet document of candidate `c` (its full fleet, spares marked per pool)."""
    assert c.refined is not None
    full = c.refined.full
    plan = to_plan_spec(search.spec, full, search.ctx.prices)
    pools = []
    for pool, shape in zip(plan.pools, full.pools, strict=True):
        spare = max(0, pool.replicas - c.refined.serving.pool(shape.role).replicas)
        pools.append(pool.model_copy(update={"spare_replicas": min(spare, pool.replicas - 1)}))
    return plan.model_copy(update={"pools": pools, "slo": search.spec.slo,
                                   "name": f"{search.spec.name}-{c.kind}"})


def fleet_json(search: Search) -> dict[str, Any] | None:
    """The chosen (first-ranked) plan's fleet document, or None when the search found none."""
    if search.infeasible or not search.ranked:
        return None
    return fleet_of(search, search.ranked[0]).document()
