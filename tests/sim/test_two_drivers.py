"""The two-driver contract (ARCHITECTURE property 1, issue 4): the same policy, given the same
sequence of fleet views and feedback, makes identical decisions whether the simulator drives it
or a harness standing in for the gateway does.

The simulator drives a recording proxy; a fresh policy of the same preset and seed is then
driven by a plain loop replaying the recorded calls in order. Every decision (worker, prefill
worker, scores, reason, safe-mode flag) and the final report must match.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from fleetwise.core.feedback import Feedback
from fleetwise.core.views import FleetView, RouteRequest, RoutingDecision
from fleetwise.routing import make_policy, policy_names
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.sim.scenarios import default_scenario_dir, load_scenario
from fleetwise.spec.plan import PlanSpec


@dataclass
class Recorder:
    """Wraps a policy; logs every call in order."""

    inner: Any
    calls: list[tuple[str, Any, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.inner.name)

    def route(self, req: RouteRequest, fleet: FleetView) -> RoutingDecision:
        d = self.inner.route(req, fleet)
        self.calls.append(("route", (req, fleet), d))
        return d

    def observe(self, fb: Feedback) -> None:
        self.calls.append(("observe", fb, None))
        self.inner.observe(fb)

    def report(self) -> dict[str, Any]:
        return dict(self.inner.report())


def gateway_harness(policy: Any, calls: list[tuple[str, Any, Any]]) -> list[RoutingDecision]:
    """What a gateway does: build views and feedback from its own sources and call the policy."""
    out = []
    for kind, arg, _ in calls:
        if kind == "route":
            out.append(policy.route(*arg))
        else:
            policy.observe(arg)
    return out


SCENARIOS = ("slowdown", "stale-control-plane", "rolling-upgrade")


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("preset", policy_names())
def test_simulator_and_harness_make_identical_decisions(scenario: str, preset: str) -> None:
    sc = load_scenario(default_scenario_dir() / f"{scenario}.yaml", small=True)
    reqs = sc.requests(3)[:300]
    plan: PlanSpec = sc.spec.plan.model_copy(update={"routing": preset})
    rec = Recorder(make_policy(preset, seed=3))
    opts = SimOptions(seed=3, slo=sc.spec.slo, feedback_delay_s=sc.spec.feedback_delay_s, policy=rec)
    res = simulate(plan, reqs, sc.spec.faults, opts)
    sim_decisions = [d for kind, _, d in rec.calls if kind == "route"]
    assert len(sim_decisions) >= len(reqs) > 0
    assert any(kind == "observe" for kind, _, _ in rec.calls)
    twin = make_policy(preset, seed=3)
    assert gateway_harness(twin, rec.calls) == sim_decisions
    assert twin.report() == rec.report() == res.summary["router"]
