"""A P/D rolling upgrade in matched slices keeps a compatible prefill/decode pair of some version
up throughout: no hand-off is refused, nothing is rejected; upgrading one pool alone is not safe."""

from __future__ import annotations

from fleetwise.core.request import Request
from fleetwise.perf.roofline import PerfModel
from fleetwise.sim.events import EventLoop
from fleetwise.sim.fault_kinds import upgrade_order
from fleetwise.sim.fleet import Fleet
from fleetwise.sim.runner import simulate
from fleetwise.spec.faults import FaultScenario, RollingUpgrade
from fleetwise.spec.plan import PlanSpec


def _plan(p: int, d: int) -> PlanSpec:
    return PlanSpec(kv_link={"gbps": 100}, pools=[
        {"name": "p", "role": "prefill", "replicas": p, "accelerator": "h100-sxm", "model": "llama-3.1-8b"},
        {"name": "d", "role": "decode", "replicas": d, "accelerator": "h100-sxm", "model": "llama-3.1-8b"}])


def _reqs(n: int) -> list[Request]:
    return [Request(str(i), i * 0.05, 512, 32) for i in range(n)]


def test_matched_order_keeps_the_upgraded_fractions_level():
    plan = _plan(3, 4)
    fleet = Fleet(plan, EventLoop(), PerfModel(), lambda *a: None, lambda *a: (0.0, 0.0))
    names = fleet.names
    f = RollingUpgrade(pool="p", matched_with="d", start_s=0, new_model_version="v2")
    assert [names[i] for i in upgrade_order(fleet.replicas, f)] == ["p-0", "d-0", "d-1", "p-1", "d-2", "p-2", "d-3"]
    only = RollingUpgrade(pool="d", start_s=0, new_model_version="v2")
    assert [names[i] for i in upgrade_order(fleet.replicas, only)] == ["d-0", "d-1", "d-2", "d-3"]


def test_matched_slices_upgrade_refuses_and_rejects_nothing():
    scen = FaultScenario(name="up", faults=[RollingUpgrade(pool="p", matched_with="d", start_s=1.0,
                                                           new_model_version="v2", restart_after_s=1.0)])
    s = simulate(_plan(2, 2), _reqs(300), faults=scen).summary
    assert s["requests_completed"] == 300 and s["requests_failed"] == 0 and s["requests_retried"] == 0
    ups = [f["target"] for f in s["faults"] if f["phase"] == "restart"]
    assert ups == ["p-0", "d-0", "p-1", "d-1"]


def test_upgrading_the_decode_pool_alone_strands_the_prefill_pool():
    # Once every decode replica serves v2 no v1 prefill replica can pair: requests are rejected.
    scen = FaultScenario(name="up", faults=[RollingUpgrade(pool="d", start_s=1.0, new_model_version="v2",
                                                           restart_after_s=1.0)])
    s = simulate(_plan(2, 2), _reqs(300), faults=scen).summary
    assert s["requests_failed"] > 0 and set(s["failure_reasons"]) == {"rejected"}
