"""Routing cost per decision of a composed policy, on a replay of a busy simulation.

Run:  python3 benchmarks/routing_speed.py [--requests 20000] [--policy fleetwise-default]
                                          [--loads busy,long,pd] [--out benchmarks/results/routing_speed.json]

A seeded simulation of a busy load of `benchmarks/sim_speed.py` (Llama-3.1-8B on H200 SXM, 64
replicas, 10 req/s per replica, router view refreshed every 0.25 s or `--view-delay`; `busy`: Azure-like outputs,
median 120 tokens, about 20 running requests per replica; `long`: outputs uniform in 600-2,000
tokens, every replica at its 256 running decodes with a queue behind; `pd`: the busy load on
the same 64 replicas disaggregated, `PD_POOLS` prefill and decode, every prefill->decode pair
scored per request) records every call its
policy gets: `route(request, view)` and `observe(feedback)`, in order. The stream is then
replayed through a fresh policy of the same preset and seed, which must return the same
decisions (worker, scores, reason, kind) and winning scores (`routing.base.winning_scores`, what
the simulator records) as the recording; the CPU seconds (`process_time`) of `route` plus
`winning_scores`, and of `observe`, are divided by the decisions. Replaying isolates the policy
from the engine, so the figure is the routing cost a simulation or a gateway pays per request.
`compiled` says whether `fleetwise.routing` ran compiled (mypyc) or as Python. The recording is
frozen out of the garbage collector's sight (`gc.freeze`) before the replay, so it does not pay
for traversing it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

from sim_speed import BUSY, BUSY_REPLICAS, LONG, make_requests

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
LOADS = {"busy": BUSY, "long": LONG, "pd": BUSY}
"""The loads of `sim_speed.py` a replay can be recorded on (`pd`: on the disaggregated fleet)."""
PD_POOLS = (16, 48)
"""Prefill and decode replicas of the `pd` load (the busy fleet's 64, a quarter of them prefilling)."""


def fleet(load: str) -> PlanSpec:
    """The busy fleet of `load`: 64 colocated replicas, or `PD_POOLS` for `pd`."""
    card = LOADS[load].accelerator
    if load != "pd":
        return PlanSpec(name="routing-speed", pools=[{"name": "m", "accelerator": card, "model": "llama-3.1-8b",
                                                      "replicas": BUSY_REPLICAS}])
    return PlanSpec(name="routing-speed-pd", pools=[
        {"name": side, "role": side, "accelerator": card, "model": "llama-3.1-8b", "replicas": n}
        for side, n in zip(("prefill", "decode"), PD_POOLS, strict=True)])


def policy(preset: str, seed: int) -> ComposedPolicy:
    spec = RoutingSpec(policy=preset)
    return ComposedPolicy(spec.policy, spec.resolved(), spec.safe_mode, seed=seed)


class Recorder:
    """Drives `inner` (which may be compiled: its methods cannot be replaced) and keeps every
    call it gets, with the decisions it returns."""

    def __init__(self, inner: ComposedPolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self.wants_kv_events = inner.wants_kv_events
        self.calls: list[Call] = []

    def route(self, req: RouteRequest, fleet: FleetView) -> RoutingDecision:
        d = self.inner.route(req, fleet)
        self.calls.append((req, fleet, d))
        return d

    def observe(self, fb: Feedback) -> None:
        self.calls.append(fb)
        self.inner.observe(fb)

    def report(self) -> dict[str, Any]:
        return self.inner.report()


def record(n: int, preset: str, seed: int, load: str = "busy", delay_s: float = VIEW_DELAY_S) -> list[Call]:
    """Every route and observe call of a seeded busy simulation of `load` (a `LOADS` name), in order."""
    rec = Recorder(policy(preset, seed))
    lengths = LOADS[load]
    simulate(fleet(load), make_requests(n, lengths.rate_per_replica * BUSY_REPLICAS, seed, lengths),
             options=SimOptions(seed=seed, feedback_delay_s=delay_s, policy=rec))  # type: ignore[arg-type]
    return rec.calls


def replay(calls: list[Call], preset: str, seed: int) -> dict[str, Any]:
    """CPU microseconds per decision of routing (with `winning_scores`) and of feedback, and
    how many decisions differ from the recording."""
    p = policy(preset, seed)
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


def running_per_replica(calls: list[Call]) -> float:
    """Mean running requests per replica over the views the decisions were taken on."""
    views = [c[1] for c in calls if isinstance(c, tuple)]
    return round(sum(w.running_requests for v in views for w in v.workers) / max(1, sum(len(v.workers) for v in views)), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--policy", default="fleetwise-default")
    ap.add_argument("--loads", default="busy,long,pd", help=f"comma-separated, of {', '.join(LOADS)}")
    ap.add_argument("--view-delay", type=float, default=VIEW_DELAY_S,
                    help="router view refresh period in s (0: the exact mode, a new view per decision)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/routing_speed.json")
    a = ap.parse_args()
    loads = [x for x in a.loads.split(",") if x]
    for x in loads:
        if x not in LOADS:
            ap.error(f"--loads: unknown load {x!r}; use {', '.join(LOADS)}")
    out: dict[str, Any] = {
        "benchmark": "routing_speed",
        "workload": f"sim_speed.py loads, {a.requests} requests, {BUSY_REPLICAS} replicas, view every {a.view_delay} s",
        "policy": a.policy,
        "compiled": not kernels.__file__.endswith(".py"),
    }
    load0 = os.getloadavg()[0]
    for x in loads:
        calls = record(a.requests, a.policy, a.seed, x, a.view_delay)
        gc.collect()
        gc.freeze()  # the recording is no garbage: full collections during the replay skip it
        out[x] = {**replay(calls, a.policy, a.seed), "running_per_replica": running_per_replica(calls)}
        del calls
        gc.unfreeze()
        gc.collect()
    out["loadavg_1m_before"] = round(load0, 2)
    out["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
