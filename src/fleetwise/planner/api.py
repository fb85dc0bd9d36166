"""The planner's one entry point: `plan(spec, options) -> Search`, one module per phase, in order.

fit -> latency -> goodput -> sizing -> refinement -> checks -> disaggregation -> ranking, each a `run` that
fills the one `Search` state (`state`); `report` renders it. An infeasible request (nothing fits,
the SLO is below the physical minimum, or nothing passes in simulation) comes back with
`search.infeasible` set and its reasons in `search.rejected`, never as an empty answer;
`plan_or_raise` raises `InfeasibleError` instead.
"""

from __future__ import annotations

import time

from fleetwise.errors import InfeasibleError
from fleetwise.planner import checks, disaggregation, fit, goodput, latency, ranking, refinement, sizing
from fleetwise.planner.executor import Executor
from fleetwise.planner.progress import PhaseMeter
from fleetwise.planner.state import PlanOptions, Search
from fleetwise.spec.planning import PlanningSpec


def plan(spec: PlanningSpec, options: PlanOptions | None = None) -> Search:
    """Run every phase; catches InfeasibleError of the early phases into `search.infeasible`."""
    o = options or PlanOptions()
    meter = PhaseMeter(o.progress or (lambda f: None))
    t0 = time.perf_counter()
    search = fit.prepare(spec)
    search.top_k = o.top_k or spec.search.top_k
    try:
        meter.phase("latency")
        latency.run(search)
    except InfeasibleError as err:
        search.infeasible = str(err)
        search.wall_s = time.perf_counter() - t0
        meter.finish()
        return search
    with Executor(o.workers, o.ray_address, on_task=meter.tasks if o.progress else None) as ex:
        meter.phase("goodput")
        goodput.run(search, ex)
        sizing.run(search)
        meter.phase("refinement")
        refinement.run(search, ex)
        checks.run(search, ex)
        meter.phase("disaggregation")
        disaggregation.run(search, ex)
        ranking.run(search)
    search.wall_s = time.perf_counter() - t0
    meter.finish()
    return search


def plan_or_raise(spec: PlanningSpec, options: PlanOptions | None = None) -> Search:
    """`plan`, raising InfeasibleError (with the explanation) when no plan meets the SLO."""
    search = plan(spec, options)
    if search.infeasible:
        raise InfeasibleError(search.infeasible)
    return search
