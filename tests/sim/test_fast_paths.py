"""The simulator's hot paths against their readable references: same decisions, same results.

The composed policy routes over per-view columns kept up to date from its in-flight ledger's
changes and O(1) ledger sums; the tests' `ReferencePolicy` (tests/routing/reference_policy.py)
decides each scored colocated request one candidate at a time and walks the ledger. Seeded
runs with either give equal summaries, equal reports and equal decisions (worker, scores,
reason, kind), on small scenarios, a busy colocated fleet and a P/D fleet with faults.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fleetwise.core.request import Request
from fleetwise.core.views import FleetView, RouteRequest, RoutingDecision
from fleetwise.routing.policy import ComposedPolicy
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.sim.scenarios import default_scenario_dir, load_scenario
from fleetwise.spec.base import validate
from fleetwise.spec.faults import FaultScenario
from fleetwise.spec.plan import PlanSpec
from fleetwise.spec.routing import RoutingSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "routing"))
from reference_policy import ReferencePolicy  # noqa: E402  (tests/routing: the readable reference)

SCORED = ("fleetwise-default", "prefix-affinity", "feedback", "least-outstanding", "power-of-two")


def policy(preset: str, seed: int, reference: bool = False) -> ComposedPolicy | ReferencePolicy:
    spec = RoutingSpec(policy=preset)
    p = ComposedPolicy(spec.policy, spec.resolved(), spec.safe_mode, seed=seed)
    return ReferencePolicy(p) if reference else p


class Logged:
    """A policy that records every decision of the policy it wraps (which may be compiled, and
    then cannot have its methods replaced), and otherwise is that policy."""

    def __init__(self, inner: ComposedPolicy | ReferencePolicy) -> None:
        self.inner = inner
        self.log: list[RoutingDecision] = []

    def route(self, req: RouteRequest, fleet: FleetView) -> RoutingDecision:
        d = self.inner.route(req, fleet)
        self.log.append(d)
        return d

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def run(plan: PlanSpec, reqs: list[Request], faults: FaultScenario | None, preset: str, seed: int, delay_s: float,
        reference: bool) -> tuple[dict[str, Any], list[RoutingDecision], dict[str, Any]]:
    """(summary without its wall time, every decision, the policy's report) of one seeded run."""
    p = policy(preset, seed, reference)
    logged = Logged(p)
    res = simulate(plan.model_copy(update={"routing": preset}), reqs, faults,
                   SimOptions(seed=seed, feedback_delay_s=delay_s, policy=logged))  # type: ignore[arg-type]
    log = logged.log
    res.summary.pop("sim_wall_s")
    return res.summary, log, p.report()


@pytest.mark.parametrize("scenario", ["cache-mix", "slowdown", "heterogeneous"])
@pytest.mark.parametrize("preset", SCORED)
def test_fast_policy_decides_as_its_reference(scenario: str, preset: str) -> None:
    sc = load_scenario(default_scenario_dir() / f"{scenario}.yaml", small=True)
    reqs = sc.requests(5)[:400]
    fast, ref = (run(sc.spec.plan, reqs, sc.spec.faults, preset, 5, sc.spec.feedback_delay_s, reference)
                 for reference in (False, True))
    assert fast == ref
    assert len({d.worker for d in fast[1]}) > 1


def busy_requests(n: int, rate_rps: float, seed: int) -> list[Request]:
    """Poisson arrivals, log-normal prompts (median 900) and outputs (median 120), as the busy row
    of benchmarks/sim_speed.py."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate_rps, n))
    ins = np.clip(rng.lognormal(np.log(900), 0.8, n), 16, 8000).astype(int)
    outs = np.clip(rng.lognormal(np.log(120), 0.9, n), 2, 1000).astype(int)
    return [Request(str(i), float(t[i]), int(ins[i]), int(outs[i])) for i in range(n)]


@pytest.mark.parametrize("preset", ["fleetwise-default", "round-robin"])
@pytest.mark.parametrize("delay_s", [0.0, 0.25], ids=["exact", "fast"])
def test_busy_run_equals_its_reference(preset: str, delay_s: float) -> None:
    """Replicas kept busy (views without token backlogs: the ledger's sums stand in)."""
    reqs = busy_requests(1500, 160.0, 7)
    plan = PlanSpec(name="busy", pools=[{"name": "m", "accelerator": "h200-sxm", "model": "llama-3.1-8b",
                                         "replicas": 16}])
    fast, ref = (run(plan, reqs, None, preset, 7, delay_s, reference) for reference in (False, True))
    assert fast == ref
    assert fast[0]["requests_completed"] == len(reqs)


def test_pd_fleet_with_faults_decides_as_its_reference() -> None:
    plan = validate(PlanSpec, yaml.safe_load(open("examples/plans/pd-70b.yaml")), "pd-70b.yaml")
    faults = validate(FaultScenario, yaml.safe_load(open("examples/plans/pd-70b.faults.yaml")), "faults")
    reqs = busy_requests(300, 6.0, 2)
    fast, ref = (run(plan, reqs, faults, "fleetwise-default", 2, 0.05, reference) for reference in (False, True))
    assert fast == ref
    assert any(d.prefill_worker for d in fast[1])
