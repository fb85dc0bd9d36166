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


def test_matched_slices_in_batches_keep_a_pair_of_each_version():
    # 2 prefill + 2 decode in batches of two: p-0 with d-0, then p-1 with d-1; each version keeps a
    # prefill and a decode replica that can pair, so nothing is refused or failed.
    plan = PlanSpec(kv_link={"gbps": 100}, pools=[
        {"name": "p", "role": "prefill", "replicas": 2, "accelerator": "h100-sxm", "model": "llama-3.1-8b"},
        {"name": "d", "role": "decode", "replicas": 2, "accelerator": "h100-sxm", "model": "llama-3.1-8b"}])
    scen = FaultScenario(name="up", faults=[RollingUpgrade(pool="p", matched_with="d", start_s=1.0,
                                                           new_model_version="v2", restart_after_s=1.0, batch=2)])
    s = simulate(plan, [Request(str(i), i * 0.05, 512, 32) for i in range(300)], faults=scen).summary
    assert s["requests_completed"] == 300 and s["requests_failed"] == 0 and s["requests_retried"] == 0
    drains = [(round(f["t_s"], 3), f["target"]) for f in s["faults"] if f["phase"] == "drain"]
    assert [r for _, r in drains] == ["p-0", "d-0", "p-1", "d-1"]
    assert drains[0][0] == drains[1][0] == 1.0 and drains[2][0] == drains[3][0] > 2.0


def test_two_upgrades_of_one_pool_each_bring_back_what_they_took_out():
    # A replica going down was credited to the pool's first rolling upgrade, whichever drained it: the
    # second upgrade's replica came back under the first's count (KeyError when that one had none out).
    plan = PlanSpec(pools=[{"name": "m", "replicas": 3, "accelerator": "h100-sxm", "model": "llama-3.1-8b"}])
    scen = FaultScenario(name="up", faults=[
        RollingUpgrade(pool="m", start_s=20.0, new_model_version="v3", restart_after_s=2.0),
        RollingUpgrade(pool="m", start_s=1.0, new_model_version="v2", restart_after_s=2.0)])
    s = simulate(plan, [Request(str(i), i * 0.1, 256, 16) for i in range(400)], faults=scen).summary
    assert s["requests_completed"] == 400 and s["requests_failed"] == 0
    back = [(f["fault"], f["target"]) for f in s["faults"] if f["phase"] == "restart"]
    assert back == [(1, "m-0"), (1, "m-1"), (1, "m-2"), (0, "m-0"), (0, "m-1"), (0, "m-2")]
