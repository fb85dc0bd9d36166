"""Decisions re-made at the ends of the step-time band (`fleetwise.perf.flips`)."""

from __future__ import annotations

import pytest

from fleetwise.perf.flips import Flip, band_scales, decide_at_band_ends
from fleetwise.perf.uncertainty import Band


def test_band_scales_are_the_ends_over_the_prediction():
    assert band_scales(Band(0.08, 0.1, 0.125, 5)) == pytest.approx((0.8, 1.25))
    assert band_scales(Band(0.1, 0.1, 0.1, 0)) == (1.0, 1.0)


def test_a_threshold_inside_the_band_flips_and_one_outside_does_not():
    bands = {"decode": Band(0.045, 0.05, 0.06, 5)}

    def rule(target: float):
        return lambda s: "meets" if 0.05 * s("decode") <= target else "misses"

    inside = decide_at_band_ends("fit", rule(0.055), bands)
    assert (inside.chosen, inside.fast, inside.slow, inside.flips) == ("meets", "meets", "misses", True)
    assert "could flip" in inside.text()
    outside = decide_at_band_ends("fit", rule(0.07), bands)
    assert not outside.flips and outside.text() == "fit: meets at both ends of the band"
    assert outside.as_dict() == {"decision": "fit", "chosen": "meets", "at_fast_end": "meets",
                                 "at_slow_end": "meets", "flips": False, "basis": ""}


def test_each_key_is_scaled_by_its_own_band():
    """A choice between two options flips when their bands cross: option a is predicted cheaper, but its
    slow end is dearer than b's slow end; keys without a band keep their prediction."""
    bands = {"a": Band(9.0, 10.0, 13.0, 5), "b": Band(10.5, 11.0, 11.5, 5)}
    cost = {"a": 10.0, "b": 11.0, "c": 12.5}
    f = decide_at_band_ends("TP", lambda s: min(cost, key=lambda k: cost[k] * s(k)), bands)
    assert f == Flip("TP", "a", "a", "b")
    assert decide_at_band_ends("x", lambda s: str(s("c")), bands).slow == "1.0"


def test_pd_ratio_and_cost_at_the_band_ends():
    """A split plan's serving replicas scale with each pool's band (goodput inversely proportional to step
    time): P:D 3:2 as sized, 3:2 at the fast end, 4:3 at the slow end; the cost follows the replicas."""
    from types import SimpleNamespace

    from fleetwise.planner.flips import _cost, _serving
    from fleetwise.planner.layout import Layout
    from fleetwise.planner.results import Sizing
    from fleetwise.planner.simulate import FleetShape, PoolShape
    from fleetwise.planner.state import Candidate

    p, d = Layout("h200-sxm", "bf16", 2), Layout("h200-sxm", "bf16", 1)
    sizing = {"prefill": Sizing("prefill", 1.0, 2.6, 1.0, 2.6, 0.0, 3, 1, 0),
              "decode": Sizing("decode", 1.0, 1.7, 1.0, 1.7, 0.0, 2, 0, 0)}
    c = Candidate("pd", "disaggregated", FleetShape((PoolShape("prefill", p, 3), PoolShape("decode", d, 2))),
                  sizing, [])
    bands = {("prefill", p): Band(0.09, 0.1, 0.12, 5), ("decode", d): Band(0.018, 0.02, 0.0244, 5)}

    def ratio(s):
        n = _serving(c, s)
        return f"P:D {n['prefill']}:{n['decode']}"

    assert decide_at_band_ends("P:D", ratio, bands) == Flip("P:D", "P:D 3:2", "P:D 3:2", "P:D 4:3")
    search = SimpleNamespace(hw=SimpleNamespace(price=lambda acc: 3.0))
    # (3 serving + 1 spare) x 2 GPUs + 2 x 1 GPU at $3 per GPU-hour; at the slow end (4 + 1) x 2 + 3 x 1
    assert _cost(search, c, lambda k: 1.0) == pytest.approx(30.0)
    slow = {k: band_scales(b)[1] for k, b in bands.items()}
    assert _cost(search, c, lambda k: slow[k]) == pytest.approx(39.0)
