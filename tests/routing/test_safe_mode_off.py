"""Safe mode `off` routes on a stale view as if it were fresh; `last_known` adds the router's own
in-flight estimates since the view was taken. The two differ exactly where safe mode matters."""

from __future__ import annotations

from fleetwise.core.views import FleetView, RouteRequest, WorkerView
from fleetwise.routing import DEFAULT_POLICY, make_policy
from fleetwise.routing.safe_mode import as_fresh
from fleetwise.spec.routing import RoutingSpec


def _view(now: float) -> FleetView:
    return FleetView(now, (WorkerView("w0", running_requests=0, reported_at_s=0.0),
                           WorkerView("w1", running_requests=3, reported_at_s=0.0)))


def _route(safe_mode: dict, now: float, n: int = 12) -> list[tuple[str, str]]:
    pol = make_policy(RoutingSpec(policy=DEFAULT_POLICY, safe_mode=safe_mode), seed=1)
    out = []
    for i in range(n):
        d = pol.route(RouteRequest(f"r{i}", 1000, 64), _view(now + 0.01 * i))
        assert d.worker is not None
        out.append((d.worker, d.reason))
    return out


def test_off_trusts_the_stale_view_and_last_known_counts_what_it_sent():
    stale = 60.0  # the view is a minute old: far past stale_after_s (5 s)
    off = _route({"enabled": False}, stale)
    known = _route({"action": "last_known"}, stale)
    # off: w0 is idle as the view says, however many requests went there since (only the load
    # bound's share check sends some to w1); last_known: w0 carries what it sent there
    assert all("w0 load 0 " in r for w, r in off if w == "w0")
    assert [w for w, _ in off] == ["w0", "w0", "w1", "w0", "w0", "w1", "w0", "w0", "w1", "w0", "w1", "w0"]
    assert [w for w, _ in known] == ["w0", "w1"] * 6
    assert not any("safe-mode" in r for _, r in off) and all("safe-mode last-known" in r for _, r in known)
    assert known[2][1].endswith("least-cost w0 (cost 2128 tok); w0 load 1064 within bound 2454")
    # on a fresh view the two decide alike (only the label differs when stale)
    assert [w for w, _ in _route({"enabled": False}, 1.0)] == [w for w, _ in _route({"action": "last_known"}, 1.0)]


def test_as_fresh_redates_every_worker_to_now():
    v = as_fresh(_view(42.0))
    assert {w.reported_at_s for w in v.workers} == {42.0} and v.now_s == 42.0
    assert [w.running_requests for w in v.workers] == [0, 3]
