"""A run passes only when the fleet keeps up with its arrivals, however loose the TTFT target."""

from __future__ import annotations

from fleetwise.planner.early import backlog_growth
from fleetwise.planner.fit import prepare
from fleetwise.planner.layout import Layout
from fleetwise.planner.simulate import FleetShape, PoolShape, _memo, passes, run_fleet


def test_backlog_growth_counts_requests_left_waiting():
    arrivals = [float(i) for i in range(100)]  # one a second
    assert backlog_growth(arrivals, [a + 0.5 for a in arrivals]) == 1 / 50  # the last one in flight
    assert backlog_growth(arrivals, [2 * a for a in arrivals]) == 25 / 50  # served at half the rate
    assert backlog_growth(arrivals, [float("nan")] * 100) == 50 / 50


def test_an_overloaded_replica_fails_with_every_ttft_under_a_loose_target(spec_factory):
    # 16k-token prompts: one H100 TP1 replica prefills about 1.8 per second. Offered 2 or 4 per
    # second for a minute, every TTFT is still under the 300 s target (attainment 100%), but the
    # backlog grows by 1/8 and 58/104 of the later arrivals: the run fails, and the bisection's
    # early-stopped run (`passes`) says the same. At 1 req/s it keeps up.
    spec = spec_factory(workload={"rate_rps": 4.0, "prompt_tokens": {"kind": "fixed", "tokens": 16384},
                                  "output_tokens": {"kind": "fixed", "tokens": 16}}, slo={"ttft_s": 300.0, "tpot_s": 1.0})
    mix, prices = prepare(spec).ctx.mix, {"h100-sxm": 3.0}
    fleet = FleetShape((PoolShape("mixed", Layout("h100-sxm", "bf16", 1), 1),))
    got = []
    for rate in (1.0, 2.0, 4.0):
        _memo.clear()
        early = passes(spec, mix, fleet, prices, rate, seed=0)
        _memo.clear()
        v = run_fleet(spec, mix, fleet, prices, rate, seed=0)
        assert v.attainment == 1.0 and v.ttft["p99"] < 100.0
        got.append((rate, v.backlog_growth, v.passed, early))
    _memo.clear()
    assert got == [(1.0, 1 / 88, True, True), (2.0, 1 / 8, False, False), (4.0, 58 / 104, False, False)]
