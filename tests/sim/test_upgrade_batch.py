"""A rolling upgrade takes `batch` replicas out together, and the next batch only once all are back."""

from __future__ import annotations

from fleetwise.core.request import Request
from fleetwise.sim.runner import simulate
from fleetwise.spec.faults import FaultScenario, RollingUpgrade
from fleetwise.spec.plan import PlanSpec


def _phases(batch: int) -> list[tuple[float, str, str]]:
    plan = PlanSpec(pools=[{"name": "m", "replicas": 5, "accelerator": "h100-sxm", "model": "llama-3.1-8b"}])
    reqs = [Request(str(i), i * 0.1, 256, 16) for i in range(300)]
    scen = FaultScenario(name="up", faults=[RollingUpgrade(pool="m", start_s=1.0, new_model_version="v2",
                                                           restart_after_s=5.0, batch=batch)])
    s = simulate(plan, reqs, faults=scen).summary
    assert s["requests_completed"] == 300 and s["requests_failed"] == 0
    return [(round(f["t_s"]), f["phase"], f.get("target", "")) for f in s["faults"] if f["phase"] in ("drain", "restart")]


def test_batch_two_drains_pairs_and_waits_for_both():
    got = _phases(2)
    drains = [(t, r) for t, p, r in got if p == "drain"]
    restarts = [(t, r) for t, p, r in got if p == "restart"]
    assert [r for _, r in drains] == ["m-0", "m-1", "m-2", "m-3", "m-4"]
    assert [r for _, r in restarts] == ["m-0", "m-1", "m-2", "m-3", "m-4"]
    # m-0 and m-1 leave together at 1 s; m-2 and m-3 leave when the later of the first pair is back
    assert drains[0][0] == drains[1][0] == 1
    assert drains[2][0] == drains[3][0] == max(restarts[0][0], restarts[1][0])
    assert drains[4][0] == max(restarts[2][0], restarts[3][0])


def test_batch_one_is_one_at_a_time():
    got = _phases(1)
    order = [(p, r) for _, p, r in got]
    assert order == [(p, f"m-{i}") for i in range(5) for p in ("drain", "restart")]
