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


def _upgrade_with_crash(crash_at: float, restart_after: float | None) -> tuple[dict, list[str]]:
    from fleetwise.sim.runner import simulate_kept
    from fleetwise.spec.faults import ReplicaCrash

    plan = PlanSpec(pools=[{"name": "m", "replicas": 3, "accelerator": "h100-sxm", "model": "llama-3.1-8b"}])
    reqs = [Request(str(i), i * 0.1, 256, 200) for i in range(400)]
    scen = FaultScenario(name="up", faults=[
        RollingUpgrade(pool="m", start_s=1.0, new_model_version="v2", restart_after_s=5.0),
        ReplicaCrash(replica="m-0" if crash_at > 1.0 else "m-1", at_s=crash_at, restart_after_s=restart_after)])
    result, sim = simulate_kept(plan, reqs, faults=scen)
    s = result.summary
    assert s["requests_completed"] + s["requests_failed"] == 400
    return s, [r.model_version or "" for r in sim.fleet.replicas]


def test_a_crash_while_draining_for_an_upgrade_ends_the_drain_and_the_upgrade_goes_on():
    # m-0 crashes while the upgrade drains it: it counts as drained (its requests go to recovery)
    # and the upgrade brings it back upgraded, then takes m-1 and m-2; the crash's own restart,
    # which would bring back the old version, does not happen. The upgrade used to wait for m-0
    # to drain forever: m-1 and m-2 were never upgraded.
    s, versions = _upgrade_with_crash(1.5, 0.5)
    phases = [(f["fault"], f["phase"], f["target"]) for f in s["faults"]]
    assert (1, "crash", "m-0") in phases and (1, "restart_superseded", "m-0") in phases
    assert (1, "restart", "m-0") not in phases
    assert [t for f, p, t in phases if (f, p) == (0, "restart")] == ["m-0", "m-1", "m-2"]
    assert (0, "done", "") in phases and versions == ["v2", "v2", "v2"]
    assert s["requests_retried"] > 0


def test_a_crashed_replica_the_upgrade_takes_comes_back_upgraded_once():
    # m-1 crashed before the upgrade (restart due at 40.5 s): its turn comes while it is down, so it
    # is drained at once and comes back upgraded 5 s later; the crash's late restart is superseded.
    s, versions = _upgrade_with_crash(0.5, 40.0)
    phases = [(round(f["t_s"], 1), f["fault"], f["phase"], f["target"]) for f in s["faults"]]
    assert [(p, t) for _, f, p, t in phases if f == 1] == [("crash", "m-1"), ("restart_superseded", "m-1")]
    assert [t for _, f, p, t in phases if (f, p) == (0, "restart")] == ["m-0", "m-1", "m-2"]
    assert versions == ["v2", "v2", "v2"]
