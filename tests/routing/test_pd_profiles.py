"""P/D pair selection: a prefill profile, a decode profile and pair scorers, all configurable."""

from __future__ import annotations

import dataclasses

import pytest

from fleetwise.core.views import FleetView, KvLinkView, RouteRequest, WorkerView
from fleetwise.errors import SpecError
from fleetwise.routing import DEFAULT_POLICY, make_policy
from fleetwise.routing.pd_scorers import PAIR_SCORERS
from fleetwise.routing.plugins import SCORERS
from fleetwise.spec.base import validate
from fleetwise.spec.routing import PdParams, RoutingSpec, preset_params
from fleetwise.spec.routing_plugins import ROUTING_PLUGINS

CAP = 100_000
WORKERS = (
    WorkerView("p0", role="prefill", queued_prefill_tokens=3000, queued_requests=2),
    WorkerView("p1", role="prefill", queued_prefill_tokens=1000, queued_requests=1),
    WorkerView("d0", role="decode", running_decode_tokens=200, running_requests=1, kv_usage=0.6, kv_capacity_tokens=CAP),
    WorkerView("d1", role="decode", running_decode_tokens=4000, running_requests=6, kv_usage=0.1, kv_capacity_tokens=CAP),
)
LINKS = (KvLinkView("p1", "d0", 1e11, 1e-5, active_transfers=3), KvLinkView("p1", "d1", 1e11, 1e-5),
         KvLinkView("p0", "d0", 1e11, 1e-5), KvLinkView("p0", "d1", 1e11, 1e-5, active_transfers=1))
REQ = RouteRequest("r", 2000, 100)


def route(params: dict | None = None, policy: str = DEFAULT_POLICY, links=LINKS):
    """One decision of a fresh policy (load bound off, so every pair is scored)."""
    pol = make_policy(RoutingSpec(policy=policy, params={"load_bound": {"enabled": False}, **(params or {})}), seed=0)
    return pol.route(REQ, FleetView(0.0, WORKERS, links))


def test_default_profiles_score_each_side_and_the_handoff():
    """Pair total = prefill score + decode score + 0.25 * handoff, each side a weighted mean of its
    profile's scorers; checked against the numbers worked out from the signals."""
    d = route()
    params = preset_params(DEFAULT_POLICY)
    assert params.pd_profile("prefill") == {"load": 1.0, "prefix": 0.3, "kv": 0.05}
    assert params.pd_profile("decode") == {"load": 1.0, "kv": 0.05, "kv_room": pytest.approx(0.525)}
    # Prefill costs (no decode work and no prefix on a prefill worker): load + own, own = 2000 + 32.
    cost_p = {"p0": 3000 + 2 * 32 + 2032, "p1": 1000 + 32 + 2032}
    sp = {n: (1.0 * (min(cost_p.values()) / c) + 0.05 * 1.0) / 1.35 for n, c in cost_p.items()}
    # Decode costs: 0.5 * running decode + 32 per request, own 0.5 * 100 + 32 (the predicted output is
    # capped by the client's max_tokens, 100); kv_room after 2100 tokens.
    cost_d = {"d0": 0.5 * 200 + 32 + 82, "d1": 0.5 * 4000 + 6 * 32 + 82}
    free = {"d0": 0.4, "d1": 0.9}
    sd = {n: (min(cost_d.values()) / c + 0.05 * free[n] + 0.525 * (free[n] - 2100 / CAP)) / 1.575
          for n, c in cost_d.items()}
    handoff = {"p1->d0": 1 / 4, "p1->d1": 1.0, "p0->d0": 1.0, "p0->d1": 1 / 2}
    want = {k: round(sp[k[:2]] + sd[k[4:]] + 0.25 * h, 6) for k, h in handoff.items()}
    assert d.scores == pytest.approx(want, abs=2e-6)
    best = max(want, key=lambda k: want[k])
    assert f"{d.prefill_worker}->{d.worker}" == best == "p1->d0"
    assert d.kind == "pair" and d.reason.startswith("pair p1->d0: prefill no prefix")


def test_the_default_decode_profile_is_the_former_kv_blend():
    """`kv_room` at decode_kv_weight x the other weights equals the former blend
    `(mean score + decode_kv_weight * headroom) / (1 + decode_kv_weight)`."""
    d = route()
    cost_d = {"d0": 214.0, "d1": 2274.0}
    room = {"d0": 0.4 - 0.021, "d1": 0.9 - 0.021}
    free = {"d0": 0.4, "d1": 0.9}
    former = {n: ((min(cost_d.values()) / c + 0.05 * free[n]) / 1.05 + 0.5 * room[n]) / 1.5 for n, c in cost_d.items()}
    p1 = (1.0 * 1.0 + 0.05) / 1.35
    assert d.scores["p1->d1"] == pytest.approx(p1 + former["d1"] + 0.25, abs=1e-6)
    assert d.scores["p1->d0"] == pytest.approx(p1 + former["d0"] + 0.25 / 4, abs=1e-6)


def test_a_configured_decode_profile_changes_the_decode_pick():
    assert route().worker == "d0"  # the least loaded decode worker wins by default
    d = route({"pd": {"decode": {"scorers": {"kv_room": 1.0}}}})
    assert d.worker == "d1"  # only KV room counts: d1 has 0.879 left, d0 0.379


def test_the_handoff_weight_decides_between_links():
    # By default p1->d0 wins despite its link's 3 transfers; a heavy handoff weight moves the
    # pick to p0->d0, over an idle link.
    assert (route().prefill_worker, route().worker) == ("p1", "d0")
    d = route({"pd": {"pair_scorers": {"handoff": 5.0}}})
    assert (d.prefill_worker, d.worker) == ("p0", "d0")
    d = route({"pd": {"pair_scorers": {"handoff": 0.0}}})
    assert d.scores["p1->d0"] - d.scores["p1->d1"] == pytest.approx(
        route().scores["p1->d0"] - route().scores["p1->d1"] - 0.25 * (1 / 4 - 1), abs=2e-6)


def test_a_prefill_profile_weight_of_zero_leaves_the_prefill_pick_to_the_pair():
    d = route({"pd": {"prefill": {"weight": 0.0}, "pair_scorers": {"handoff": 1.0}}})
    # without the prefill side's score, p0->d0 (idle link) beats p1->d0 (3 transfers)
    assert (d.prefill_worker, d.worker) == ("p0", "d0")


def test_the_former_flat_weights_read_as_profiles():
    old = PdParams.model_validate({"prefill_weight": 2.0, "decode_weight": 0.5, "link_weight": 1.0})
    new = PdParams.model_validate({"prefill": {"weight": 2.0}, "decode": {"weight": 0.5},
                                   "pair_scorers": {"handoff": 1.0}})
    assert old == new


@pytest.mark.parametrize("params,msg", [
    ({"pd": {"pair_scorers": {"handof": 1.0}}}, "unknown pair_scorer 'handof'; closest: handoff"),
    ({"pd": {"decode": {"scorers": {"kvroom": 1.0}}}}, "unknown scorer 'kvroom'; closest: kv_room"),
    ({"pd": {"decode": {"scorers": {"kv": -1.0}}}}, "scorer 'kv': weight -1.0 is negative"),
    ({"pd": {"decode": {"filters": ["healty"]}}}, "unknown filter 'healty'; closest: healthy"),
    ({"pd": {"prefill": {"picker": "roundrobin"}}}, "unknown picker 'roundrobin'; closest: round_robin"),
])
def test_bad_profile_names_and_weights_name_the_field(params, msg):
    with pytest.raises(SpecError, match=msg):
        validate(RoutingSpec, {"policy": DEFAULT_POLICY, "params": params}, "routing")


def test_profile_and_pair_plugins_are_registered_once():
    assert ROUTING_PLUGINS.names("pair_scorer") == ("handoff",)
    assert set(PAIR_SCORERS) == {"handoff"} and "kv_room" in SCORERS
    assert ROUTING_PLUGINS.missing() == []


def test_each_side_defaults_to_the_policy_filters_and_picker():
    params = preset_params(DEFAULT_POLICY)
    assert params.pd_filters("prefill") is None and params.pd_filters("decode") is None
    assert params.pd_picker("prefill") == params.pd_picker("decode") == "max"
    rr = preset_params("round-robin", {"pd": {"decode": {"picker": "max", "filters": ["role", "healthy"]}}})
    assert rr.pd_picker("prefill") == "round_robin" and rr.pd_picker("decode") == "max"
    assert rr.pd_filters("decode") == ("healthy",)  # the side is one role already


def test_a_decode_side_filter_list_decides_which_decode_workers_compete():
    """d0 (the best decode pair without the filter) is unhealthy: the policy's filters drop it; a
    decode profile with no filters keeps it; one naming `healthy` drops it again."""
    ws = tuple(dataclasses.replace(w, healthy=False) if w.name == "d0" else w for w in WORKERS)

    def pick(params: dict | None) -> str:
        pol = make_policy(RoutingSpec(params={"load_bound": {"enabled": False}, **(params or {})}), seed=0)
        d = pol.route(REQ, FleetView(0.0, ws, LINKS))
        return f"{d.prefill_worker}->{d.worker}"

    assert pick(None) == "p1->d1"
    assert pick({"pd": {"decode": {"filters": []}}}) == "p1->d0"
    assert pick({"pd": {"decode": {"filters": ["healthy"]}}}) == "p1->d1"


def test_a_side_with_no_worker_left_is_rejected_with_its_filter_reason():
    """The policy's filters (role only) keep every worker; the prefill side's `healthy` keeps none."""
    ws = tuple(dataclasses.replace(w, healthy=False) if w.role == "prefill" else w for w in WORKERS)
    pol = make_policy(RoutingSpec(params={"filters": ["role"], "pd": {"prefill": {"filters": ["healthy"]}}}), seed=0)
    d = pol.route(REQ, FleetView(0.0, ws, LINKS))
    assert d.worker is None and d.prefill_worker is None and d.kind == "rejected"
    assert d.reason == "rejected: prefill side: no healthy worker"
    assert make_policy(RoutingSpec(params={"filters": ["role"]}), seed=0).route(
        REQ, FleetView(0.0, ws, LINKS)).prefill_worker == "p1"


def test_a_decode_side_round_robin_picker_cycles_while_the_prefill_side_scores():
    """Prefill by its profile's max (p1 is cheaper, then p0 once p1 holds the first request),
    decode round-robin in name order whatever the scores."""
    pol = make_policy(RoutingSpec(params={"load_bound": {"enabled": False},
                                          "pd": {"decode": {"picker": "round_robin"}}}), seed=0)
    got = [pol.route(RouteRequest(f"r{i}", 2000, 100), FleetView(0.0, WORKERS, LINKS)) for i in range(3)]
    assert [f"{d.prefill_worker}->{d.worker}" for d in got] == ["p1->d0", "p0->d1", "p1->d0"]
    assert all(d.kind == "round-robin" and d.scores == {} for d in got)
    assert got[0].reason == "max/round-robin pair p1->d0"
