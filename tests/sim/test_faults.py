"""Each fault kind changes the run the way docs/simulator.md says, and no request is lost."""

from __future__ import annotations

import pytest

from fleetwise.core.request import Request
from fleetwise.core.views import RoutingDecision
from fleetwise.errors import SpecError
from fleetwise.sim import runner
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.faults import FaultScenario, check_faults_apply
from fleetwise.spec.plan import PlanSpec


def make_requests(n: int = 200, gap_s: float = 0.1, prompt: int = 1024, out: int = 64) -> list[Request]:
    return [Request(str(i), i * gap_s, prompt, out) for i in range(n)]


def mixed_plan(replicas: int = 2, **kw) -> PlanSpec:
    return PlanSpec(pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": replicas}],
                    **kw)


def pd_plan(**kw) -> PlanSpec:
    pools = [{"name": "p", "role": "prefill", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 2},
             {"name": "d", "role": "decode", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 2}]
    return PlanSpec(pools=pools, **kw)


NO_RECOVERY = {"max_reprefills": 0, "on_decode_failure": "fail"}


def run(plan, faults, reqs=None):
    reqs = reqs or make_requests()
    res = simulate(plan, reqs, FaultScenario(faults=faults) if faults is not None else None, SimOptions(seed=3))
    s = res.summary
    assert s["requests_completed"] + s["requests_failed"] == len(reqs), "a request was lost"
    return res, s


def test_crash_fails_in_flight_requests_and_the_replica_restarts():
    res, s = run(mixed_plan(failure_domains=NO_RECOVERY),
                 [{"kind": "crash", "replica": "m-0", "at_s": 5.0, "restart_after_s": 3.0}])
    assert s["failure_reasons"] == {"replica_crashed": s["requests_failed"]} and s["requests_failed"] >= 1
    phases = [(f["phase"], f["t_s"]) for f in s["faults"]]
    assert phases == [("crash", 5.0), ("restart", 8.0)]
    rec = res.records
    after = [i for i, r in enumerate(rec.requests) if 8.5 < r.arrival_s < 15]
    assert any(rec.worker[i] == 0 for i in after), "restarted replica takes traffic again"
    down = [i for i, r in enumerate(rec.requests) if 5.0 < r.arrival_s < 8.0]
    assert all(rec.worker[i] == 1 for i in down)


def test_crash_with_recovery_reroutes_in_flight_requests():
    _, s = run(mixed_plan(), [{"kind": "crash", "replica": "m-0", "at_s": 5.0}])
    assert s["requests_failed"] == 0 and s["requests_retried"] >= 1


def test_slowdown_multiplies_step_time_of_one_replica_during_the_interval():
    reqs = make_requests(20, gap_s=1.0, out=16)  # one request at a time
    base, _ = run(mixed_plan(replicas=1), None, reqs)
    slow, _ = run(mixed_plan(replicas=1), [{"kind": "slowdown", "replica": "m-0", "start_s": 5, "end_s": 10,
                                           "factor": 3.0}], reqs)
    def tpot(r, i):
        rec = r.records
        return (rec.finish_s[i] - rec.first_token_s[i]) / (rec.requests[i].output_tokens - 1)

    def ttft(r, i):
        return r.records.first_token_s[i] - r.records.requests[i].arrival_s

    for i in (6, 7):  # inside the interval
        assert tpot(slow, i) == pytest.approx(3 * tpot(base, i), rel=1e-6)
        assert ttft(slow, i) == pytest.approx(3 * ttft(base, i), rel=1e-6)
    assert tpot(slow, 15) == pytest.approx(tpot(base, 15), rel=1e-9)


def test_kv_link_degradation_slows_transfers_and_failure_fails_or_reprefills():
    reqs = make_requests(100)
    _, base = run(pd_plan(kv_link={"gbps": 50}), None, reqs)
    _, slow = run(pd_plan(kv_link={"gbps": 50}), [{"kind": "kv_link", "start_s": 0, "end_s": 100,
                                                   "bandwidth_factor": 0.25}], reqs)
    assert slow["kv_transfer"]["p50_s"] == pytest.approx(4 * base["kv_transfer"]["p50_s"], rel=0.05)
    down = [{"kind": "kv_link", "start_s": 2.0, "end_s": 3.0, "bandwidth_factor": 0.0}]
    _, failed = run(pd_plan(kv_link={"gbps": 50}, failure_domains=NO_RECOVERY), down, reqs)
    # Every link down: with no healthy pair the router still sends (a link may be back by the
    # end of the prefill); here none is, and without re-prefill those transfers fail.
    assert failed["failure_reasons"] == {"kv_transfer_failed": failed["requests_failed"]}
    assert 8 <= failed["requests_failed"] <= 11
    # One decode port fails in the middle of a transfer to it: that request is prefilled again
    # and routed to the other decode replica, whose link is up.
    plan = pd_plan(kv_link={"gbps": 50})
    res, _ = run(plan, None, reqs)
    rec, d1 = res.records, res.replica_names.index("d-1")
    k = next(i for i in range(40, 100) if rec.worker[i] == d1)
    mid = (rec.kv_start_s[k] + rec.kv_end_s[k]) / 2
    res, re = run(plan, [{"kind": "kv_link", "replica": "d-1", "start_s": mid, "end_s": mid + 0.01,
                          "bandwidth_factor": 0.0}], reqs)
    assert re["requests_failed"] == 0 and re["requests_retried"] == 1
    assert res.records.retries[k] == 1 and res.records.worker[k] != d1


class SpyPolicy:
    """Round-robin that records when each view it was shown had been taken."""

    name = "spy"

    def __init__(self) -> None:
        self.seen: list[tuple[float, float]] = []
        self.k = 0

    def route(self, req, fleet):
        self.seen.append((fleet.now_s, max(w.reported_at_s for w in fleet.workers)))
        self.k += 1
        return RoutingDecision(worker=fleet.workers[self.k % len(fleet.workers)].name, reason="spy")

    def observe(self, fb):
        pass

    def report(self):
        return {}


@pytest.mark.parametrize("delay_s", [0.0, 0.25], ids=["exact", "delayed"])
def test_stale_view_freezes_the_router_view(monkeypatch, delay_s):
    spy = SpyPolicy()
    monkeypatch.setattr(runner, "make_policy", lambda spec, seed=0: spy)
    reqs = make_requests(40)
    res = simulate(mixed_plan(), reqs, FaultScenario(faults=[{"kind": "stale_view", "start_s": 1.0, "end_s": 2.0}]),
                   SimOptions(seed=3, feedback_delay_s=delay_s))
    assert [(f["phase"], f["t_s"]) for f in res.summary["faults"]] == [("start", 1.0), ("end", 2.0)]
    frozen = [seen for now, seen in spy.seen if 1.0 <= now < 2.0]
    assert frozen and all(seen < 1.0 for seen in frozen), "views taken before the stall, none during it"
    fresh = [now - seen for now, seen in spy.seen if now >= 2.0 + delay_s]
    assert max(fresh) <= delay_s + 1e-9


@pytest.mark.parametrize("delay_s", [0.0, 0.25], ids=["exact", "delayed"])
@pytest.mark.parametrize("plan", [mixed_plan, pd_plan], ids=["mixed", "pd"])
def test_stale_view_from_before_the_first_request_keeps_the_fleet_it_started_with(plan, delay_s):
    reqs = [Request(str(i), 0.5 + i * 0.1, 1024, 64) for i in range(40)]
    res = simulate(plan(), reqs, FaultScenario(faults=[{"kind": "stale_view", "start_s": 0.0, "end_s": 100.0}]),
                   SimOptions(seed=3, feedback_delay_s=delay_s))
    s = res.summary
    assert (s["requests_completed"], s["requests_failed"]) == (40, 0), s["failure_reasons"]
    assert "" not in s["router"]["slowness"]


def test_rolling_upgrade_drains_one_replica_at_a_time_and_changes_the_version():
    res, s = run(mixed_plan(), [{"kind": "rolling_upgrade", "pool": "m", "start_s": 3.0,
                                 "new_model_version": "v2", "restart_after_s": 1.0}])
    phases = [(f["phase"], f["target"]) for f in s["faults"]]
    assert phases == [("drain", "m-0"), ("down", "m-0"), ("restart", "m-0"), ("drain", "m-1"), ("down", "m-1"),
                      ("restart", "m-1"), ("done", "")]
    assert s["requests_failed"] == 0
    t = {(f["phase"], f["target"]): f["t_s"] for f in s["faults"]}
    rec = res.records
    during = [i for i, r in enumerate(rec.requests) if t[("drain", "m-0")] < r.arrival_s < t[("restart", "m-0")]]
    assert during and all(rec.worker[i] == 1 for i in during), "a draining replica receives nothing new"


def test_fault_naming_an_unknown_replica_is_a_spec_error():
    with pytest.raises(SpecError, match="m-7"):
        run(mixed_plan(), [{"kind": "crash", "replica": "m-7", "at_s": 1.0}])


def test_a_crash_of_a_replica_already_down_is_refused():
    """A second crash while the first keeps the replica down would do nothing (the runner drops it
    silently); after the restart, or on another replica, it is a fault like any other."""
    first = {"kind": "crash", "replica": "m-0", "at_s": 5.0, "restart_after_s": 30.0}
    with pytest.raises(SpecError) as err:
        check_faults_apply(FaultScenario(faults=[first, {"kind": "crash", "replica": "m-0", "at_s": 6.0}]), mixed_plan())
    assert str(err.value) == ("faults: faults.1 (crash): replica m-0 is already down at 6 s (faults.0 crashed it at "
                              "5 s, back at 35 s), so this crash would change nothing; move it after 35 s or remove it")
    never = first | {"restart_after_s": None}
    with pytest.raises(SpecError, match=r"faults.1 crashed it at 5 s, never back\), so this crash would change "
                                        r"nothing; remove it$"):
        check_faults_apply(FaultScenario(faults=[{"kind": "crash", "replica": "m-0", "at_s": 50.0}, never]),
                           mixed_plan())
    at_restart = FaultScenario(faults=[first, {"kind": "crash", "replica": "m-0", "at_s": 35.0}])
    with pytest.raises(SpecError, match="already down at 35 s"):  # the crash comes before the restart event
        check_faults_apply(at_restart, mixed_plan())
    later = FaultScenario(faults=[first, {"kind": "crash", "replica": "m-0", "at_s": 36.0},
                                  {"kind": "crash", "replica": "m-1", "at_s": 6.0}])
    check_faults_apply(later, mixed_plan())
    _, s = run(mixed_plan(), later.model_dump()["faults"])
    assert [(f["fault"], f["phase"]) for f in s["faults"] if f["phase"] == "crash"] == [(0, "crash"), (2, "crash"),
                                                                                          (1, "crash")]


def test_fault_file_validation():
    with pytest.raises(Exception, match="end_s"):
        FaultScenario(faults=[{"kind": "slowdown", "replica": "m-0", "start_s": 5, "end_s": 4, "factor": 2}])


def test_every_fault_kind_of_the_spec_is_registered_and_faults_never_import_the_runner():
    import ast
    import typing
    from pathlib import Path

    from fleetwise.sim import faults as faults_module
    from fleetwise.sim.fault_api import FAULT_KINDS
    from fleetwise.spec.faults import FaultScenario

    union = typing.get_args(FaultScenario.model_fields["faults"].annotation)[0]
    models = set(typing.get_args(typing.get_args(union)[0]) or typing.get_args(union))
    assert models and models <= set(FAULT_KINDS)
    src = Path(faults_module.__file__).parent
    for name in ("faults.py", "fault_kinds.py", "fault_api.py"):
        tree = ast.parse((src / name).read_text(encoding="utf-8"))
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "fleetwise.sim.runner" not in mods, name


def test_overlapping_hangs_nest_and_a_restart_ends_them():
    reqs = [Request("0", 0.5, 512, 1000)]

    def e2e(faults):
        return run(mixed_plan(replicas=1), faults, reqs)[1]["e2e_s"]["p50"]

    def hang(a, b):
        return {"kind": "hang", "replica": "m-0", "start_s": a, "end_s": b}

    alone = e2e([hang(1.0, 6.0)])
    assert e2e([hang(1.0, 3.0), hang(2.0, 6.0)]) == alone  # stalled from 1 s until the last one ends
    assert e2e([hang(1.0, 6.0), hang(2.0, 3.0)]) == alone
    crash = {"kind": "crash", "replica": "m-0", "at_s": 2.0, "restart_after_s": 1.0}
    assert e2e([hang(1.0, 6.0), hang(1.5, 8.0), crash]) == e2e([crash])  # the restart ends both


def test_overlapping_kv_link_faults_compose_until_each_ends():
    plan = pd_plan(failure_domains=NO_RECOVERY)

    def link(a, b, factor, replica=None):
        return {"kind": "kv_link", "replica": replica, "start_s": a, "end_s": b, "bandwidth_factor": factor}

    _, down = run(plan, [link(2.0, 10.0, 0.0)])
    assert down["failure_reasons"] == {"kv_transfer_failed": down["requests_failed"]} and down["requests_failed"] > 50
    for inner in (link(3.0, 5.0, 0.5), link(3.0, 5.0, 0.5, "p-0"), link(3.0, 5.0, 0.0, "d-1")):
        _, s = run(plan, [link(2.0, 10.0, 0.0), inner])
        assert s["failure_reasons"] == down["failure_reasons"], inner  # still down from 5 to 10 s


def test_overlapping_stale_views_keep_the_view_frozen_until_the_last_one_ends(monkeypatch):
    spy = SpyPolicy()
    monkeypatch.setattr(runner, "make_policy", lambda spec, seed=0: spy)
    faults = [{"kind": "stale_view", "start_s": 1.0, "end_s": 3.0}, {"kind": "stale_view", "start_s": 1.5, "end_s": 2.0}]
    simulate(mixed_plan(), make_requests(40), FaultScenario(faults=faults), SimOptions(seed=3))
    frozen = [seen for now, seen in spy.seen if 1.0 <= now < 3.0]
    assert frozen and all(seen < 1.0 for seen in frozen), "views taken before the first stall, none until the last ends"


def test_a_recovery_after_the_last_arrival_routes_on_a_refreshed_view_in_delayed_mode():
    # m-0 dies after the last arrival and stays down. In the exact mode its two requests migrate to
    # m-1; the delayed mode must do the same (before: no tick came after the last arrival, the router
    # never heard of the crash, sent one migration back to m-0 and failed it, `replica_unavailable`).
    plan = PlanSpec(pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 2}])
    reqs = [Request(str(i), 0.1 * i, 1000, 400) for i in range(4)]
    crash = FaultScenario(faults=[{"kind": "crash", "replica": "m-0", "at_s": 1.0, "restart_after_s": None}])
    exact = simulate(plan, reqs, crash, SimOptions(feedback_delay_s=0.0))
    delayed = simulate(plan, reqs, crash, SimOptions(feedback_delay_s=0.05))
    assert delayed.summary["failure_domains"]["requests"] == {"completed": 4, "reprefilled": 0, "migrated": 2,
                                                              "failed": 0}
    for col in ("worker", "tokens", "retries"):
        assert list(getattr(delayed.records, col)) == list(getattr(exact.records, col)) == \
            {"worker": [1] * 4, "tokens": [400] * 4, "retries": [1, 0, 1, 0]}[col]
    assert list(delayed.records.finish_s) == pytest.approx(list(exact.records.finish_s), rel=1e-12)
