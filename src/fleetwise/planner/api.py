"""The planner's one entry point: `plan(spec, options) -> Search`, phases in order.

`fleetwise.planner.report` renders the result (JSON and a readable report). An infeasible
request (nothing fits, the SLO is below the physical minimum, or nothing passes in simulation)
comes back with `search.infeasible` set and its reasons in `search.rejected`, never as an empty
answer; `plan_or_raise` raises `InfeasibleError` instead.
"""

from __future__ import annotations

import time

from fleetwise.errors import InfeasibleError
from fleetwise.planner import assemble
from fleetwise.planner.executor import Executor
from fleetwise.planner.pipeline import PlanOptions, Search, _estimate, _measure, _prepare
from fleetwise.spec.planning import PlanningSpec


def plan(spec: PlanningSpec, options: PlanOptions | None = None) -> Search:
    """Run every phase; catches InfeasibleError of the early phases into `search.infeasible`."""
    o = options or PlanOptions()
    t0 = time.perf_counter()
    search, ctx, enum = _prepare(spec)
    search.top_k = o.top_k or spec.search.top_k
    try:
        _estimate(search, enum)
    except InfeasibleError as err:
        search.infeasible = str(err)
        search.wall_s = time.perf_counter() - t0
        return search
    with Executor(o.workers, o.ray_address) as ex:
        lists = _measure(search, ctx, ex)
        assemble.size_candidates(search, lists)
        chosen = assemble.refine(search, ctx, ex)
        assemble.compare(search, ctx, ex, chosen)
        assemble.rank(search, chosen)
    search.wall_s = time.perf_counter() - t0
    return search


def plan_or_raise(spec: PlanningSpec, options: PlanOptions | None = None) -> Search:
    """`plan`, raising InfeasibleError (with the explanation) when no plan meets the SLO."""
    search = plan(spec, options)
    if search.infeasible:
        raise InfeasibleError(search.infeasible)
    return search
