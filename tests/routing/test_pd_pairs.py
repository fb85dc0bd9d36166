"""P/D pair selection by the default policy: degraded links, the load bound among the workers a
request can still reach, and KV headroom net of hand-offs the view cannot show yet."""

from __future__ import annotations

from fleetwise.core.feedback import Completed, FirstToken
from fleetwise.core.views import FleetView, KvLinkView, RouteRequest, WorkerView
from fleetwise.routing import DEFAULT_POLICY, make_policy
from fleetwise.spec.routing import RoutingSpec

BW = 12.5e9
"""Bytes/s of a healthy 100 Gb/s KV port."""


def workers(**decode_kw):
    ws = [WorkerView("p0", role="prefill"), WorkerView("p1", role="prefill")]
    for i in range(3):
        ws.append(WorkerView(f"d{i}", role="decode", kv_capacity_tokens=100_000, **decode_kw.get(f"d{i}", {})))
    return tuple(ws)


def links(**factor):
    return tuple(KvLinkView(p, d, BW * factor.get(d, 1.0), 2e-5) for p in ("p0", "p1") for d in ("d0", "d1", "d2"))


def req(i, prompt=2000):
    return RouteRequest(f"r{i}", prompt, None)


def test_a_degraded_link_is_skipped_while_others_are_left():
    pol = make_policy(DEFAULT_POLICY, seed=3)
    view = FleetView(0.0, workers(), links(d0=0.05))
    chosen = [pol.route(req(i), view).worker for i in range(40)]
    assert "d0" not in chosen
    assert set(chosen) == {"d1", "d2"}  # the share bound spreads work over the two left, not onto d0
    # every decode link degraded alike: nothing better is left, all stay eligible
    pol = make_policy(DEFAULT_POLICY, seed=3)
    view = FleetView(0.0, workers(), links(d0=0.05, d1=0.05, d2=0.05))
    assert {pol.route(req(i), view).worker for i in range(40)} == {"d0", "d1", "d2"}
    # round-robin ignores bandwidth (only a link that is down is skipped)
    rr = make_policy("round-robin")
    assert [rr.route(req(i), FleetView(0.0, workers(), links(d0=0.05))).worker for i in range(3)] == ["d0", "d1", "d2"]


def test_link_score_is_the_bandwidth_share_a_new_transfer_gets():
    pol = make_policy(RoutingSpec(params={"pd": {"degraded_link_fraction": 0.0}}), seed=1)
    view = FleetView(0.0, workers(), links(d0=0.5))
    d = pol.route(req(0), view)
    # same loads everywhere: pairs differ only by the link term, link_weight * (bw / best) / (1 + active)
    assert d.scores["p0->d1"] - d.scores["p0->d0"] == round(0.25 * (1.0 - 0.5), 6)
    assert d.worker in ("d1", "d2")


def test_headroom_counts_hand_offs_the_view_cannot_show_yet():
    # Every decode worker is 70% full; d0 holds 20k tokens (6k free), d1 and d2 200k (60k free).
    # Requests of 2000 prompt + 256 expected output tokens, routed on one unchanged view (their
    # prefills take a while: the view cannot show their KV yet).
    small, big = {"kv_usage": 0.7, "kv_capacity_tokens": 20_000}, {"kv_usage": 0.7, "kv_capacity_tokens": 200_000}
    ws = tuple(w if w.role == "prefill" else WorkerView(w.name, role="decode", **(small if w.name == "d0" else big))
               for w in workers())
    view = FleetView(0.0, ws, links())
    pol = make_policy(DEFAULT_POLICY, seed=2)
    sent = [pol.route(req(i), view) for i in range(12)]
    # d0 after k hand-offs: 0.3 - 2256 (k + 1) / 20000 >= kv_reserve 0.05 holds for k = 0, 1 only
    assert [d.worker for d in sent].count("d0") == 2
    assert pol.incoming.tokens("d0") == 2 * 2256 and len(pol.incoming) == 12
    first = next(d for d in sent if d.worker == "d0")
    assert "decode kv headroom 0.19" in first.reason  # 0.3 - 2256 / 20000
    # a first token means the KV landed (the view shows it from now on); an end forgets it too
    rid = f"r{sent.index(first)}"
    pol.observe(FirstToken(1.0, rid, "d0", 0.5))
    pol.observe(Completed(2.0, "r11", sent[11].worker, 10, 0.01, 1.0))
    assert pol.incoming.tokens("d0") == 2256 - (2256 if sent[11].worker == "d0" else 0)
    assert len(pol.incoming) == 10
    # round-robin reads the view only: without the view changing it keeps d0 in its rotation
    rr = make_policy("round-robin")
    assert [rr.route(req(i), view).worker for i in range(6)].count("d0") == 2


def test_every_preset_pairs_only_replicas_of_compatible_kv_formats():
    from fleetwise.spec.routing import PRESETS

    ws = (WorkerView("p0", role="prefill", model_version="v1"), WorkerView("p1", role="prefill", model_version="v2"),
          WorkerView("d0", role="decode", model_version="v1", kv_capacity_tokens=100_000),
          WorkerView("d1", role="decode", model_version="v2", kv_capacity_tokens=100_000),
          WorkerView("d2", role="decode", model_version="v2", kv_capacity_tokens=100_000))
    version = {w.name: w.model_version for w in ws}
    for name in PRESETS:
        pol = make_policy(name, seed=5)
        seen = set()
        for i in range(30):
            d = pol.route(req(i), FleetView(0.0, ws, links()))
            assert d.prefill_worker is not None and d.worker is not None, (name, d.reason)
            assert version[d.prefill_worker] == version[d.worker], (name, d.prefill_worker, d.worker)
            seen.add((d.prefill_worker, d.worker))
        assert {p for p, _ in seen} == {"p0", "p1"}, name  # both versions keep serving
    # no compatible pair at all: a one-line rejection naming the pair and the field
    lone = (ws[0], ws[3])
    d = make_policy(DEFAULT_POLICY).route(req(0), FleetView(0.0, lone))
    assert d.rejected and "model_version 'v1' -> 'v2'" in d.reason and "p0->d1" in d.reason
