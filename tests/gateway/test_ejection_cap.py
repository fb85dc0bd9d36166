"""Circuit breakers never hold out more than `breaker.max_ejection_percent` of a role's backends
(Envoy's outlier-detection cap), and never all of them: the backends that failed last stay routable."""

from __future__ import annotations

import pytest
from gw_harness import run, running_fleet

from fleetwise.gateway.backends import Backends
from fleetwise.gateway.config import BackendSpec, BreakerSpec


def _fleet(n: int, percent: float, role: str = "mixed") -> Backends:
    bs = Backends(BreakerSpec(failures=1, max_ejection_percent=percent), recent=1)
    for i in range(n):
        bs.upsert(BackendSpec(url=f"http://10.0.0.{i + 1}:8000", name=f"b{i}", role=role))  # type: ignore[arg-type]
    bs.upsert(BackendSpec(url="http://10.0.1.1:8000", name="other", role="prefill" if role == "mixed" else "mixed"))
    return bs


@pytest.mark.parametrize(("n", "percent", "opened"), [
    (4, 50.0, 2), (5, 50.0, 2), (4, 10.0, 1), (20, 10.0, 2), (4, 100.0, 3), (1, 50.0, 0), (1, 100.0, 0),
    (4, 0.0, 0), (2, 50.0, 1),
])
def test_breakers_open_up_to_the_share_at_least_one_never_all(n: int, percent: float, opened: int) -> None:
    bs = _fleet(n, percent)
    for b in [bs.live[f"b{i}"] for i in range(n)]:
        b.breaker.fault(1.0, bs.may_eject(b))
    states = [bs.live[f"b{i}"].breaker.state(1.0) for i in range(n)]
    assert states == ["open"] * opened + ["closed"] * (n - opened)  # the first to fail go, the last stay
    assert [bs.live[f"b{i}"].breaker.held for i in range(n)] == [False] * opened + [True] * (n - opened)
    # /admin/fleet tells a held breaker from a closed one that is fine
    assert [bs.live[f"b{i}"].admin(1.0)["breaker_held"] for i in range(n)] == [False] * opened + [True] * (n - opened)
    assert bs.capped_roles() == (["mixed"] if opened < n else [])
    assert bs.routable_roles(1.0)["mixed"] == n - opened


def test_a_held_breaker_opens_once_an_ejected_backend_recovers() -> None:
    bs = _fleet(2, 50.0)
    b0, b1 = bs.live["b0"], bs.live["b1"]
    for b in (b0, b1):
        b.breaker.fault(1.0, bs.may_eject(b))
    assert (b0.breaker.state(1.0), b1.breaker.state(1.0), b1.breaker.held) == ("open", "closed", True)
    b0.breaker.success()  # its half-open probe passed
    b1.breaker.fault(7.0, bs.may_eject(b1))
    assert (b0.breaker.state(7.0), b1.breaker.state(7.0), b1.breaker.held) == ("closed", "open", False)
    assert bs.capped_roles() == []


def test_all_backends_failing_leave_half_the_role_routable_and_admin_shows_the_cap() -> None:
    async def scenario() -> None:
        async with running_fleet(4, routing={"policy": "round-robin"}, retries={"max_retries": 0},
                                 breaker={"failures": 1, "open_s": 60}) as f:
            for r in f.responders:
                r.fault = "fail"
            for _ in range(8):
                status, doc, _ = await f.post("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2})
                assert status == 502 and doc["error"]["code"] == "upstream_failed"  # routed, never "no backend"
            now = f.gw.now()
            states = sorted(b.breaker.state(now) for b in f.gw.backends.live.values())
            assert states == ["closed", "closed", "open", "open"]
            doc = f.gw.fleet_document()
            assert doc["ejection"] == {"max_ejection_percent": 50.0, "capped": ["mixed"]}
            for r in f.responders:
                r.fault = ""
            status, _, headers = await f.post("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2})
            assert status == 200
            assert f.gw.backends.live[headers["x-fleetwise-backend"]].breaker.state(now) == "closed"
    run(scenario)
