"""One core, two drivers: a policy driven by the simulator and by the asyncio clock, over the same
`EngineDriver`, makes the same decisions.

The live side here is the smallest colocated driver a server would be: `EngineDriver`s built by
`fleetwise.engine.pools` on an `AsyncioClock`, arrivals routed on the drivers' views, the
engines' outputs and KV events reported to the policy as the simulator reports them (exact
mode: every arrival routed on a fresh view). No HTTP.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np

from fleetwise.core.feedback import Completed, Dispatched, Feedback, FirstToken, KvEvicted, KvStored
from fleetwise.core.request import Request
from fleetwise.core.views import FleetView, RouteRequest, RoutingDecision
from fleetwise.engine.driver import EngineDriver
from fleetwise.engine.pools import build_pool
from fleetwise.engine.records import StepOutput
from fleetwise.live import AsyncioClock
from fleetwise.perf.roofline import PerfModel
from fleetwise.routing.registry import make_policy
from fleetwise.sim.events import Priority
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.plan import PlanSpec

ORDER_ARRIVAL = int(Priority.ARRIVAL)
TIME_SCALE = 0.2
"""Wall seconds per virtual second on the asyncio side (the run spans about 4 virtual seconds)."""
WALL_TIMEOUT_S = 60.0
"""Bound on the asyncio run (it takes about one second)."""


class Recorder:
    """Wraps a policy; records every decision and every feedback event it hears."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.name = policy.name
        self.wants_kv_events = policy.wants_kv_events
        self.decisions: list[tuple[str, str | None, str, dict[str, float]]] = []
        self.heard: list[Feedback] = []

    def route(self, req: RouteRequest, fleet: FleetView) -> RoutingDecision:
        d = self.policy.route(req, fleet)
        self.decisions.append((req.request_id, d.worker, d.reason, d.scores))
        return d

    def observe(self, fb: Feedback) -> None:
        self.heard.append(fb)
        self.policy.observe(fb)

    def report(self) -> dict[str, Any]:
        return self.policy.report()


def plan() -> PlanSpec:
    return PlanSpec(name="contract", routing="fleetwise-default", pools=[
        {"name": "m", "role": "mixed", "replicas": 3, "accelerator": "h100-sxm", "model": "llama-3.1-8b",
         "engine": {"max_num_seqs": 64}, "gpu_memory_utilization": 0.3},
    ])


def requests(n: int = 60, seed: int = 11) -> list[Request]:
    """Poisson arrivals (15/s) of prompts that share a few system prefixes (chained hash ids)."""
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    for i in range(n):
        t += float(rng.exponential(1 / 15))
        family = int(rng.integers(4))
        blocks = int(rng.integers(2, 8))
        hashes = tuple(family * 1000 + j for j in range(blocks))
        prompt = blocks * 512 - int(rng.integers(0, 300))
        out.append(Request(str(i), t, prompt, int(rng.integers(5, 120)), hashes, 512))
    return out


def run_live(p: PlanSpec, reqs: list[Request], policy: Recorder) -> None:
    """The colocated request path of the simulator's exact mode, on the asyncio clock."""

    async def main() -> None:
        clock = AsyncioClock(time_scale=TIME_SCALE)
        build = build_pool(p.pools[0], PerfModel(), "plan: pools.0")
        first_token: dict[str, float] = {}
        by_id = {r.request_id: r for r in reqs}
        nxt = [0]

        def horizon(d: EngineDriver, now_s: float) -> tuple[float, float]:
            return (reqs[nxt[0]].arrival_s if nxt[0] < len(reqs) else math.inf) - now_s, math.inf

        def on_output(d: EngineDriver, now_s: float, start_s: float, out: StepOutput) -> None:
            for rid, off in out.first_tokens:
                t = start_s + off
                first_token[rid] = t
                policy.observe(FirstToken(t, rid, d.name, t - by_id[rid].arrival_s))
            for rid in out.finished:
                n = by_id[rid].output_tokens
                tpot = (now_s - first_token[rid]) / (n - 1) if n > 1 else 0.0
                policy.observe(Completed(now_s, rid, d.name, n, tpot, now_s - by_id[rid].arrival_s))
            events = out.kv_events or []
            start = 0
            for k in range(1, len(events) + 1):
                if k == len(events) or events[k][0] != events[start][0]:
                    hashes = tuple(h for _, h in events[start:k])
                    kind = KvStored if events[start][0] else KvEvicted
                    policy.observe(kind(now_s, d.name, hashes))
                    start = k

        drivers = []
        for j in range(p.pools[0].replicas):
            d = EngineDriver(build.engine(f"m-{j}"), clock, on_output, horizon, build.perf, pool_name="m",
                             accelerator=build.deployment.accelerator.name, kv_capacity_tokens=build.kv_capacity_tokens)
            d.engine.enable_kv_events()
            drivers.append(d)
        by_name = {d.name: d for d in drivers}

        def arrive(now_s: float, r: Request) -> None:
            nxt[0] += 1
            view = FleetView(now_s, tuple(d.view(now_s) for d in drivers))
            rr = RouteRequest(r.request_id, r.prompt_tokens, r.max_tokens, r.block_hashes, r.tenant,
                              r.model_version, r.region, r.arrival_s, r.hash_block_tokens)
            dec = policy.route(rr, view)
            assert dec.worker is not None
            policy.observe(Dispatched(now_s, rr.request_id, dec.worker, r.prompt_tokens, r.block_hashes, None))
            d = by_name[dec.worker]
            d.engine.add_request(r)
            d.cut(now_s)
            d.kick(now_s)

        for r in reqs:
            clock.call_at(r.arrival_s, ORDER_ARRIVAL, arrive, r)
        await clock.run_until_idle(WALL_TIMEOUT_S)
        assert all(not d.engine.has_work for d in drivers)

    asyncio.run(main())


def test_one_policy_decides_the_same_from_the_simulator_and_from_the_asyncio_clock():
    p, reqs = plan(), requests()
    sim_policy = Recorder(make_policy(p.routing, seed=3))
    result = simulate(p, reqs, options=SimOptions(seed=3, policy=sim_policy))
    assert result.summary["requests_completed"] == len(reqs)
    live_policy = Recorder(make_policy(p.routing, seed=3))
    run_live(p, reqs, live_policy)

    assert len(sim_policy.decisions) == len(reqs)
    assert live_policy.decisions == sim_policy.decisions
    assert [type(fb).__name__ for fb in live_policy.heard] == [type(fb).__name__ for fb in sim_policy.heard]
    assert live_policy.heard == sim_policy.heard
    # The run exercised what makes decisions differ: several workers, KV events, prefix scores.
    assert len({w for _, w, _, _ in sim_policy.decisions}) == 3
    assert any(isinstance(fb, KvStored) for fb in sim_policy.heard)
    assert any(r.startswith("prefix") for _, _, r, _ in sim_policy.decisions)
