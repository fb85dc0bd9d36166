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
