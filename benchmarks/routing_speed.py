"""Routing cost per decision: the default policy's fast path against its reference, on a replay.

Run:  python3 benchmarks/routing_speed.py [--requests 20000] [--policy fleetwise-default]
                                          [--out benchmarks/results/routing_speed.json]

A seeded simulation of the busy load of `benchmarks/sim_speed.py` (Llama-3.1-8B on H200 SXM, 64
replicas, 10 req/s per replica, router view refreshed every 0.25 s) records every call its
policy gets: `route(request, view)` and `observe(feedback)`, in order. The stream is then
replayed through fresh policies of the same preset and seed, the fast path (`ComposedPolicy`)
and the per-candidate reference (`reference=True`): each must return the same decisions
(worker, scores, reason, kind) and winning scores (`routing.base.winning_scores`, what the
simulator records) as the recording, and the CPU seconds (`process_time`) of `route` plus
`winning_scores`, and of `observe`, are divided by the decisions. Replaying isolates the policy
from the engine, so the figure is the routing cost a simulation or a gateway pays per request.
`kernels` says whether `fleetwise.routing.kernels` ran compiled (mypyc) or as Python. The
recording is frozen out of the garbage collector's sight (`gc.freeze`) before the replays, so
they do not pay for traversing it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

from sim_speed import BUSY, BUSY_REPLICAS, make_requests

from fleetwise.core.feedback import Feedback
from fleetwise.core.views import FleetView, RouteRequest, RoutingDecision
from fleetwise.routing import kernels
from fleetwise.routing.base import winning_scores
from fleetwise.routing.plugins import SCORERS
from fleetwise.routing.policy import ComposedPolicy
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.plan import PlanSpec
from fleetwise.spec.routing import RoutingSpec

VIEW_DELAY_S = 0.25
"""Router view refresh period (sim_speed's default `--feedback-delay`)."""
SCORER_NAMES = tuple(SCORERS)
"""The scorers whose winning scores the simulator records (`Simulation.scorer_names`)."""

Call = tuple[RouteRequest, FleetView, RoutingDecision] | Feedback


def policy(preset: str, seed: int, reference: bool) -> ComposedPolicy:
    spec = RoutingSpec(policy=preset)
    return ComposedPolicy(spec.policy, spec.resolved(), spec.safe_mode, seed=seed, reference=reference)


def record(n: int, preset: str, seed: int) -> list[Call]:
    """Every route and observe call of a seeded busy simulation, in order."""
    p = policy(preset, seed, False)
    calls: list[Call] = []
    route, observe = p.route, p.observe

    def routed(req: RouteRequest, fleet: FleetView) -> RoutingDecision:
        d = route(req, fleet)
        calls.append((req, fleet, d))
        return d

    def observed(fb: Feedback) -> None:
        calls.append(fb)
        observe(fb)

    p.route, p.observe = routed, observed  # type: ignore[method-assign]
    plan = PlanSpec(name="routing-speed", pools=[{"name": "m", "accelerator": BUSY.accelerator,
                                                  "model": "llama-3.1-8b", "replicas": BUSY_REPLICAS}])
    simulate(plan, make_requests(n, BUSY.rate_per_replica * BUSY_REPLICAS, seed, BUSY),
             options=SimOptions(seed=seed, feedback_delay_s=VIEW_DELAY_S, policy=p))
    return calls


def replay(calls: list[Call], preset: str, seed: int, reference: bool) -> dict[str, Any]:
    """CPU microseconds per decision of routing (with `winning_scores`) and of feedback, and
    how many decisions differ from the recording."""
    p = policy(preset, seed, reference)
    route, observe, clock = p.route, p.observe, time.process_time
    route_s = observe_s = 0.0
    decisions = differ = 0
    for call in calls:
        if isinstance(call, tuple):
            req, fleet, want = call
            t = clock()
            d = route(req, fleet)
            row = winning_scores(d, SCORER_NAMES)
            route_s += clock() - t
            decisions += 1
            differ += d != want or row != winning_scores(want, SCORER_NAMES)
        else:
            t = clock()
            observe(call)
            observe_s += clock() - t
    return {"route_us": round(route_s / decisions * 1e6, 1), "observe_us": round(observe_s / decisions * 1e6, 1),
            "decisions": decisions, "decisions_differing": differ}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--policy", default="fleetwise-default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/routing_speed.json")
    a = ap.parse_args()
    calls = record(a.requests, a.policy, a.seed)
    gc.collect()
    gc.freeze()  # the recording is no garbage: full collections during the replays skip it
    load0 = os.getloadavg()[0]
    out = {
        "benchmark": "routing_speed",
        "workload": f"busy load of sim_speed.py, {a.requests} requests, {BUSY_REPLICAS} replicas, view every "
                    f"{VIEW_DELAY_S} s",
        "policy": a.policy,
        "kernels": "compiled" if not kernels.__file__.endswith(".py") else "python",
        "fast": replay(calls, a.policy, a.seed, False),
        "reference": replay(calls, a.policy, a.seed, True),
        "loadavg_1m_before": round(load0, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
