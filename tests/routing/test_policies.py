"""Policies end to end: presets, filters, bounded prefix affinity, safe mode, P/D pairs,
reasons and the two-driver determinism contract."""

from __future__ import annotations

from collections import Counter

import pytest
import yaml

from fleetwise.core.feedback import Cancelled, Completed, Dispatched, FirstToken, KvStored, WorkerDown
from fleetwise.core.views import FleetView, KvLinkView, RouteRequest, WorkerView
from fleetwise.errors import SpecError
from fleetwise.routing import DEFAULT_POLICY, RoutingPolicy, make_policy, policy_names
from fleetwise.spec.base import validate
from fleetwise.spec.routing import RoutingSpec


def fleet(now=0.0, n=4, age=0.0, **per):
    return FleetView(now, tuple(WorkerView(f"w{i}", reported_at_s=now - age, **per.get(f"w{i}", {})) for i in range(n)))


def req(i, prompt=1600, out=100, hashes=(), **kw):
    return RouteRequest(f"r{i}", prompt, out, block_hashes=tuple(hashes), **kw)


def test_registry_and_protocol():
    assert policy_names()[0] == DEFAULT_POLICY == "fleetwise-default"
    assert {"round-robin", "random", "least-outstanding", "power-of-two", "prefix-affinity", "feedback"} <= set(policy_names())
    for n in policy_names():
        assert isinstance(make_policy(n), RoutingPolicy)
    with pytest.raises(SpecError, match="closest: prefix-affinity"):
        make_policy(RoutingSpec.model_construct(policy="prefix-afinity", params={}))


def test_routing_spec_from_yaml():
    doc = yaml.safe_load("policy: prefix-affinity\nparams: {load_bound: {c: 1.5}}\nsafe_mode: {action: reject}\n")
    spec = validate(RoutingSpec, doc, "plan.yaml: routing")
    assert spec.resolved().load_bound.c == 1.5 and spec.safe_mode.action == "reject"
    with pytest.raises(SpecError, match="load_bound.cc: unknown field"):
        validate(RoutingSpec, {"params": {"load_bound": {"cc": 1}}}, "routing")


def test_round_robin_stable_order_and_reason():
    p = make_policy("round-robin")
    f = FleetView(0.0, (WorkerView("b"), WorkerView("a"), WorkerView("c", healthy=False)))
    ds = [p.route(req(i), f) for i in range(3)]
    assert [d.worker for d in ds] == ["a", "b", "a"]
    assert ds[0].reason == "round-robin a (2 eligible)"


def test_version_filter_during_rolling_upgrade():
    p = make_policy(DEFAULT_POLICY)
    f = fleet(n=3, w0={"model_version": "v2"}, w1={"model_version": "v1"}, w2={"model_version": "v1", "healthy": False})
    assert {p.route(req(i, model_version="v1"), f).worker for i in range(4)} == {"w1"}
    assert p.route(req(9, model_version="v2"), f).worker == "w0"
    d = p.route(req(10, model_version="v3"), f)
    assert d.rejected and d.reason == "rejected: no worker serves model_version 'v3' (have v1, v2)"
    assert p.report()["rejected"] == 1


def test_worker_down_feedback_excludes_until_fresh_view():
    p = make_policy("least-outstanding")
    p.observe(WorkerDown(1.0, "w0"))
    assert "w0" not in {p.route(req(i), fleet(now=1.0, age=0.5)).worker for i in range(6)}
    assert "w0" in {p.route(req(10 + i), fleet(now=2.0)).worker for i in range(6)}  # newer view: healthy


def test_inflight_estimates_prevent_herding_on_a_stale_view():
    p = make_policy("least-outstanding")
    f = fleet(now=1.0, age=0.5, w0={"queued_requests": 2})  # the same lagged view for every request
    picks = Counter(p.route(req(i), f).worker for i in range(30))
    assert picks == {"w0": 6, "w1": 8, "w2": 8, "w3": 8}


@pytest.mark.parametrize("name", ["prefix-affinity", DEFAULT_POLICY])
def test_bounded_load_with_one_prefix_for_every_request(name):
    p = make_policy(name)
    picks = Counter(p.route(req(i, hashes=range(100)), fleet()).worker for i in range(400))  # nothing completes
    assert max(picks.values()) <= 1.25 * 400 / 4 + 1
    assert min(picks.values()) >= 90


@pytest.mark.parametrize("same_prefix", [False, True], ids=["distinct", "one-prefix"])
def test_sequential_single_requests_spread(same_prefix):
    p = make_policy(DEFAULT_POLICY)
    picks, hits = [], 0
    for i in range(40):
        hashes = range(50) if same_prefix else range(1000 * i, 1000 * i + 50)
        d = p.route(req(i, hashes=hashes), fleet(now=float(i)))
        hits += d.reason.startswith("prefix")
        p.observe(FirstToken(i + 0.1, f"r{i}", d.worker, 0.05))
        p.observe(Completed(i + 0.5, f"r{i}", d.worker, 100, 0.01, 0.5))
        picks.append(d.worker)
    counts = Counter(picks)
    assert len(counts) == 4 and max(counts.values()) - min(counts.values()) <= (3 if same_prefix else 0)
    assert hits == (36 if same_prefix else 0)  # one miss per worker, then every request hits


def test_prefix_affinity_prefers_the_cache_within_the_bound():
    p = make_policy(DEFAULT_POLICY)
    p.observe(KvStored(0.0, "w2", tuple(range(6))))
    big: dict[str, dict[str, int]] = {f"w{i}": {} for i in range(4)}
    big["w2"] = {"queued_prefill_tokens": 400, "running_decode_tokens": 0, "queued_requests": 1}
    d = p.route(req(1, prompt=8000, hashes=range(8), hash_block_tokens=1000), fleet(**big))
    # cost w2 = 432 queued + 2000 uncached + 50 decode + 32 = 2514 vs 8082 elsewhere
    assert d.worker == "w2"
    assert d.reason == "prefix 6/8 blocks on w2; w2 load 432 within bound 2217"  # 1.25 * 108 + 2082
    assert d.scores["w2.prefix"] == 0.75
    big["w2"] = {"queued_prefill_tokens": 40000, "running_decode_tokens": 0, "queued_requests": 30}
    d = p.route(req(2, prompt=8000, hashes=range(8), hash_block_tokens=1000), fleet(**big))
    assert d.worker != "w2" and "over bound: w2" in d.reason


def test_safe_mode_enter_act_leave():
    spec = lambda a: RoutingSpec(policy=DEFAULT_POLICY, safe_mode={"stale_after_s": 5.0, "action": a})  # noqa: E731
    rej = make_policy(spec("reject"))
    assert not rej.route(req(0), fleet(now=10.0, age=1.0)).safe_mode
    d = rej.route(req(1), fleet(now=20.0, age=7.0))
    assert d.rejected and d.safe_mode
    assert d.reason == "safe-mode reject: fleet view stale (view age 7.0s > stale_after 5s); shedding load"
    assert not rej.route(req(2), fleet(now=23.0, age=0.0)).rejected  # fresh views: leaves safe mode
    rep = rej.report()["safe_mode"]
    assert rep["entries"] == 1 and rep["time_s"] == 3.0 and rep["action"] == "reject" and not rep["active"]
    assert rep["periods"] == [[20.0, 23.0]]  # entered at the stale view, left at the fresh one
    rr = make_policy(spec("round_robin"))
    stale = fleet(now=20.0, age=9.0, w0={"queued_requests": 50})
    ds = [rr.route(req(i), stale) for i in range(4)]
    assert [d.worker for d in ds] == ["w0", "w1", "w2", "w3"]  # ignores the untrusted load
    assert ds[0].reason == "safe-mode round-robin w0 (view age 9.0s > stale_after 5s)"
    lk = make_policy(spec("last_known"))
    d = lk.route(req(0), stale)
    assert d.safe_mode and d.worker != "w0" and d.reason.startswith("safe-mode last-known (view age 9.0s")


def test_pd_pair_selection_link_and_kv_headroom():
    ws = (
        WorkerView("p0", role="prefill", queued_prefill_tokens=8000, running_decode_tokens=0, queued_requests=4),
        WorkerView("p1", role="prefill"),
        WorkerView("d0", role="decode", kv_usage=0.97, kv_capacity_tokens=100000),
        WorkerView("d1", role="decode", kv_usage=0.2, kv_capacity_tokens=100000),
        WorkerView("d2", role="decode", kv_usage=0.1, kv_capacity_tokens=100000),
    )
    links = (KvLinkView("p1", "d2", 1e11, 1e-5, healthy=False), KvLinkView("p1", "d1", 1e11, 1e-5, active_transfers=1))
    d = make_policy(DEFAULT_POLICY).route(req(0), FleetView(0.0, ws, links))
    assert (d.prefill_worker, d.worker) == ("p1", "d1")  # d0 lacks KV room, p1->d2 link is down
    assert d.reason.startswith("pair p1->d1: prefill no prefix") and "p1->d2" not in d.scores
    d = make_policy("round-robin").route(req(0), FleetView(0.0, ws, links))
    assert (d.prefill_worker, d.worker) == ("p0", "d1") and d.reason == "round-robin pair p0->d1"  # d0: no KV room
    d = make_policy(DEFAULT_POLICY).route(req(0), FleetView(0.0, ws, tuple(KvLinkView(a, b, 1, 1, healthy=False) for a in ("p0", "p1") for b in ("d0", "d1", "d2"))))
    # Every link down: the pair is chosen as if links were healthy (soft, a link may be back by
    # the end of the prefill), and the reason says so.
    assert (d.prefill_worker, d.worker) == ("p1", "d2") and d.reason.endswith("; no healthy KV link, sent anyway")


def drive(policy):
    out = []
    for i in range(60):
        now = 0.1 * i
        f = fleet(now=now, age=0.05 * (i % 3), w1={"queued_prefill_tokens": 100 * (i % 7)})
        d = policy.route(req(i, prompt=200 + 37 * (i % 5), hashes=range(i % 4, i % 4 + 6)), f)
        out.append((d.worker, d.reason, tuple(sorted(d.scores.items()))))
        policy.observe(Dispatched(now, f"r{i}", d.worker, 200))
        if i >= 2:
            policy.observe(FirstToken(now, f"r{i - 2}", out[i - 2][0], 0.02 * (1 + i % 3)))
            policy.observe(Completed(now, f"r{i - 2}", out[i - 2][0], 50, 0.01, 0.5))
    return out, policy.report()


@pytest.mark.parametrize("name", policy_names())
def test_same_inputs_same_decisions(name):
    assert drive(make_policy(name, seed=7)) == drive(make_policy(name, seed=7))


def test_a_cancelled_dispatch_releases_its_reservation():
    """Route, then confirm: a decision whose dispatch never happens is reported `Cancelled` and
    no longer weighs on its worker; a confirmed one does until it completes."""
    policy = make_policy("least-outstanding", seed=1)
    views = FleetView(0.0, (WorkerView("a"), WorkerView("b")))
    first = policy.route(RouteRequest("r1", 100, 10), views)
    assert len(policy.inflight) == 1
    policy.observe(Cancelled(0.1, "r1", first.worker or "", "client gone"))
    assert len(policy.inflight) == 0
    # with nothing reserved the tie is broken LRU again, away from the cancelled pick
    second = policy.route(RouteRequest("r2", 100, 10), FleetView(0.2, views.workers))
    assert second.worker != first.worker
    policy.observe(Dispatched(0.2, "r2", second.worker or "", 100))
    assert len(policy.inflight) == 1
    third = policy.route(RouteRequest("r3", 100, 10), FleetView(0.3, views.workers))
    assert third.worker == first.worker  # the confirmed r2 weighs on its worker
    policy.observe(Completed(0.5, "r2", second.worker or "", 10, 0.01, 0.3))
    policy.observe(Cancelled(0.5, "r3", third.worker or "", "connect error"))
    assert len(policy.inflight) == 0


def test_views_without_token_backlogs_fall_back_to_the_policys_in_flight_ledger():
    """A real vLLM /metrics gives request counts but no token backlogs: the load scorer then
    counts the tokens of every request the policy dispatched there and has not seen finish."""
    blind = (WorkerView("a", queued_prefill_tokens=None, running_decode_tokens=None),
             WorkerView("b", queued_prefill_tokens=None, running_decode_tokens=None))
    policy = make_policy("feedback", seed=1)
    big = policy.route(RouteRequest("big", 8000, 10), FleetView(0.0, blind))
    policy.observe(Dispatched(0.0, "big", big.worker or "", 8000))
    # a later view (taken after the dispatch) still shows no backlog: only the ledger knows
    later = tuple(WorkerView(w.name, queued_prefill_tokens=None, running_decode_tokens=None, queued_requests=1
                             if w.name == big.worker else 0, reported_at_s=1.0) for w in blind)
    small = policy.route(RouteRequest("small", 100, 10), FleetView(1.0, later))
    assert small.worker != big.worker and small.kind == "least-cost"
    cost = policy.params.cost
    assert small.scores[f"{big.worker}.load"] < 1.0  # 8000 prompt tokens + decode still counted
    policy.observe(Completed(2.0, "big", big.worker or "", 10, 0.01, 2.0))
    policy.observe(Cancelled(2.0, "small", small.worker or "", "client gone"))
    again = policy.route(RouteRequest("again", 100, 10), FleetView(3.0, blind))
    assert again.scores["a"] == again.scores["b"] == 1.0  # nothing outstanding: both cheapest
    assert cost.per_request_tokens > 0
