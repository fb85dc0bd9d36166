"""One fault vocabulary: every kind of `spec.faults` has a simulated and a live effect (or a
refusal that says why), and the same fault file runs in the simulator and on emulated replicas."""

from __future__ import annotations

import json
import math

import pytest
from emu_helpers import TOKEN, run, serve

from fleetwise.cli.fault_replay import live_fault_actions
from fleetwise.core.request import Request
from fleetwise.emulator.faults import REGISTRY
from fleetwise.emulator.faults.replay import LIVE, live_actions
from fleetwise.errors import SpecError
from fleetwise.sim.fault_api import FAULT_KINDS
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.base import validate
from fleetwise.spec.faults import FAULT_MODELS, CannotModel, FaultScenario
from fleetwise.spec.plan import PlanSpec

AUTH = {"Authorization": f"Bearer {TOKEN}"}
PLAN = {"name": "two", "pools": [{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b", "replicas": 2}]}
FAULTS = {"faults": [{"kind": "slowdown", "replica": "m-1", "start_s": 2, "end_s": 6, "factor": 3},
                     {"kind": "hang", "replica": "m-0", "start_s": 4, "end_s": 7},
                     {"kind": "fail_requests", "replica": "m-1", "start_s": 10, "end_s": 12},
                     {"kind": "crash", "replica": "m-0", "at_s": 14, "restart_after_s": 2}]}


def test_every_kind_has_a_simulated_and_a_live_effect_or_a_refusal_naming_why():
    assert set(FAULT_MODELS) == set(FAULT_KINDS) == set(LIVE)
    for model in FAULT_MODELS:
        sim, live = FAULT_KINDS[model], LIVE[model]
        for side in (sim, live):
            assert not isinstance(side, CannotModel) or len(side.why) > 20, model
        assert not (isinstance(sim, CannotModel) and isinstance(live, CannotModel)), f"{model} runs nowhere"
    # each admin kind of the emulator is the live effect of one spec kind, its body the spec's effect fields
    for name, kind in REGISTRY.items():
        assert kind.spec.model_fields["kind"].default == name
        assert set(kind.params.model_fields) == {"kind", "duration_s", *kind.spec.EFFECT_FIELDS}


def test_the_same_fault_file_runs_in_the_simulator(tmp_path):
    path = tmp_path / "faults.json"
    path.write_text(json.dumps(FAULTS), encoding="utf-8")
    plan = validate(PlanSpec, PLAN, "plan")
    reqs = [Request(str(i), i * 0.1, 1024, 64) for i in range(200)]
    res = simulate(plan, reqs, FaultScenario.load(path), SimOptions(seed=3))
    s, rec = res.summary, res.records
    assert (s["requests_completed"], s["requests_failed"]) == (200, 0)
    assert [(f["t_s"], f["kind"], f["phase"], f["target"]) for f in s["faults"]] == [
        (2.0, "slowdown", "start", "m-1"), (4.0, "hang", "start", "m-0"), (6.0, "slowdown", "end", "m-1"),
        (7.0, "hang", "end", "m-0"), (10.0, "fail_requests", "start", "m-1"), (12.0, "fail_requests", "end", "m-1"),
        (14.0, "crash", "crash", "m-0"), (16.0, "crash", "restart", "m-0")]
    # hang: the router still sends m-0 requests (its health passes), which start only when it ends
    hung = [i for i, r in enumerate(rec.requests) if 4 < r.arrival_s < 7 and rec.worker[i] == 0]
    assert hung and min(rec.first_token_s[i] for i in hung) > 7.0
    # fail_requests: what m-1 refuses is prefilled again on m-0
    assert s["failure_domains"]["reprefills"]["by_reason"] == {"replica_refused": 19}
    assert {rec.worker[i] for i, r in enumerate(rec.requests) if 10 < r.arrival_s < 12} == {0}
    assert s["failure_domains"]["migrations"]["by_reason"] == {"replica_crashed": 3}


def test_the_same_fault_file_runs_on_live_replicas(tmp_path):
    path = tmp_path / "faults.json"
    path.write_text(json.dumps(FAULTS), encoding="utf-8")
    acts = live_fault_actions(str(path), validate(PlanSpec, PLAN, "plan"))
    assert [(a.at_s, a.replica, a.body) for a in acts] == [
        (2, "m-1", {"kind": "slowdown", "factor": 3.0, "duration_s": 4}),
        (4, "m-0", {"kind": "hang", "duration_s": 3}),
        (10, "m-1", {"kind": "fail_requests", "status": 503, "duration_s": 2}),
        (14, "m-0", {"kind": "crash"}),
        (16, "m-0", None)]

    async def go() -> None:  # every body is one an emulated replica's admin API takes and acts on
        crashes: list[int] = []
        async with serve(crashes=crashes) as (app, c):
            for a in acts:
                if a.body is not None:
                    assert (await c.post("/admin/faults", json=a.body, headers=AUTH)).status_code == 200, a
            f = app.state.replica.faults
            assert (f.slowdown, f.hung, f.fail_status, crashes) == (3.0, True, 503, [1])
            assert set(f.active) == {"slowdown", "hang", "fail_requests", "crash"}
    run(go())


def test_each_side_refuses_what_it_cannot_model_by_name_and_reason():
    plan = validate(PlanSpec, PLAN, "plan")
    drop = FaultScenario(faults=[{"kind": "drop_streams", "replica": "m-0", "start_s": 1, "end_s": 2}])
    with pytest.raises(SpecError, match=r"faults.0 \(drop_streams\): the simulator cannot model it: the simulator "
                                        r"has no client connections"):
        simulate(plan, [Request("0", 0.0, 16, 4)], drop, SimOptions())
    assert [(a.replica, a.body) for a in live_actions(drop, plan, "f")] == [
        ("m-0", {"kind": "drop_streams", "after_tokens": 1, "duration_s": 1})]
    stale = FaultScenario(faults=[{"kind": "stale_view", "start_s": 1, "end_s": 2}])
    with pytest.raises(SpecError, match=r"f.yaml: faults.0 \(stale_view\): a live fleet cannot replay it: the "
                                        r"router's view is the gateway's"):
        live_actions(stale, plan, "f.yaml")


def test_overlapping_refusals_nest_in_the_simulator():
    plan = validate(PlanSpec, {**PLAN, "failure_domains": {"max_reprefills": 0}}, "plan")
    reqs = [Request(str(i), 1.0 + i * 0.5, 256, 4) for i in range(8)]  # arrivals 1.0 .. 4.5
    scen = FaultScenario(faults=[{"kind": "fail_requests", "start_s": 0.5, "end_s": 2.2},
                                 {"kind": "fail_requests", "start_s": 0.5, "end_s": 3.2}])
    s = simulate(plan, reqs, scen, SimOptions(seed=1)).summary
    # every replica refuses until 3.2 (the later end): arrivals 1.0..3.0 fail, 3.5.. complete
    assert (s["requests_failed"], s["requests_completed"], s["failure_reasons"]) == (5, 3, {"replica_refused": 5})
    assert not math.isnan(s["e2e_s"]["p50"])


def test_a_degraded_kv_link_slows_a_live_port_as_it_slows_the_simulators():
    from fleetwise.emulator.kv_link import KvPort
    from fleetwise.engine.clock import ORDER_ARRIVAL
    from fleetwise.sim.events import EventLoop
    from fleetwise.sim.network import KvNetwork

    bw, lat, nbytes = 4e9, 2e-5, 8e8  # alone: 0.2 s; at half bandwidth from 0.1 s: 0.3 s
    loop = EventLoop()
    port = KvPort(loop, bw, lat)
    got: list[float] = []
    loop.call_at(0.0, ORDER_ARRIVAL, lambda t, _: port.start(t, "p0", bw, nbytes, lambda e, s, sh: got.append(e)))
    loop.call_at(0.1, ORDER_ARRIVAL, lambda t, _: port.set_factor(t, 0.5))
    loop.run()
    ref = EventLoop()
    want: list[float] = []
    net = KvNetwork(ref, lat, lambda now, tag, rec: want.append(now))
    src, dst = net.add_port("p0", bw), net.add_port("d", bw)
    ref.call_at(0.0, ORDER_ARRIVAL, lambda t, _: net.start(t, 0, src, dst, nbytes))
    ref.call_at(0.1, ORDER_ARRIVAL, lambda t, _: net.set_factor(t, [dst], 0.5))
    ref.run()
    assert got == want and got[0] == pytest.approx(0.3 + lat)


def test_kv_link_faults_replay_live_unless_the_link_is_down():
    pd = validate(PlanSpec, {"pools": [
        {"name": "p", "role": "prefill", "accelerator": "h100-sxm", "model": "llama-3.1-8b"},
        {"name": "d", "role": "decode", "accelerator": "h100-sxm", "model": "llama-3.1-8b"}]}, "pd")
    slow = FaultScenario(faults=[{"kind": "kv_link", "replica": "d-0", "start_s": 1, "end_s": 3,
                                  "bandwidth_factor": 0.25}])
    acts = live_actions(slow, pd, "f")
    assert [(a.at_s, a.replica, a.body) for a in acts] == [
        (1, "d-0", {"kind": "kv_link", "bandwidth_factor": 0.25, "duration_s": 2})]
    down = FaultScenario(faults=[{"kind": "kv_link", "start_s": 1, "end_s": 3, "bandwidth_factor": 0}])
    with pytest.raises(SpecError, match=r"f: faults.0 \(kv_link\): a live fleet cannot replay it: bandwidth_factor=0"):
        live_actions(down, pd, "f")

    async def go() -> None:
        async with serve() as (app, c):
            port = app.state.replica.kv_port
            assert (await c.post("/admin/faults", json=acts[0].body, headers=AUTH)).status_code == 200
            assert port.factor == 0.25
            r = await c.post("/admin/faults", json={"kind": "kv_link", "bandwidth_factor": 0}, headers=AUTH)
            assert r.status_code == 400 and "link down" in r.text
            await c.post("/admin/faults", json={"kind": "clear"}, headers=AUTH)
            assert port.factor == 1.0
    run(go())
