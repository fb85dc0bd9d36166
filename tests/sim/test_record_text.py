"""requests.csv writes a time as `repr(round(v, 9))`; `results._float_text` gets the same text
with one decimal conversion inside FLOAT_TEXT_RANGE and falls back to round() outside it."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwise.sim.results import FLOAT_TEXT_RANGE, _float_text


def _reference(v: float) -> str:
    return "" if v != v else repr(round(v, 9))


def _written(v: float) -> str:
    cell = _float_text(v)
    return cell if isinstance(cell, str) else repr(cell)


@settings(max_examples=3000, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_any_float_gets_the_text_of_its_rounded_value(v: float) -> None:
    assert _written(v) == _reference(v)


@settings(max_examples=3000, deadline=None)
@given(st.floats(min_value=-1e7, max_value=1e7), st.integers(min_value=0, max_value=12))
def test_times_of_a_run_and_their_decimal_ties(v: float, digits: int) -> None:
    for x in (v, round(v, digits), round(v, 9) + 5e-10, round(v, 9) - 5e-10):
        assert _written(x) == _reference(x)


def test_the_range_ends_and_special_values() -> None:
    lo, hi = FLOAT_TEXT_RANGE
    edges = [lo, hi, 2.0**23, 1e-9, 5e-10, 4.9999999e-10, 0.0, -0.0, 0.99999999949, 0.9999999995, 123.0, 1e16]
    for e in list(edges):
        edges += [math.nextafter(e, math.inf), math.nextafter(e, -math.inf), -e]
    for v in edges + [math.inf, -math.inf, math.nan]:
        assert _written(v) == _reference(v), v
    assert _written(np.float64(1.25)) == "1.25" and _written(3.0) == "3.0" and _written(-2.5e-3) == "-0.0025"
