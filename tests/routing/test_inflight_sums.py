"""`InFlight.outstanding` (O(1) per-worker sums) against `outstanding_walk` (the reference walk)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwise.routing.state import CHANGE_LOG_MAX, InFlight, Pending

WORKERS = ("a", "b", "c")
op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 30), st.sampled_from(WORKERS),
              st.sampled_from((None, *WORKERS)), st.integers(0, 9000), st.integers(0, 2000)),
    st.tuples(st.just("first_token"), st.integers(0, 30)),
    st.tuples(st.just("pop"), st.integers(0, 30)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=60), st.sampled_from((0.5, 0.3, 1.0, 0.0, 0.125, 2.0)))
def test_sums_equal_the_walk_after_every_change(ops, weight):
    f = InFlight()
    mark = 0
    for t, o in enumerate(ops):
        before = {w: f.outstanding_walk(w, weight) for w in WORKERS}
        rid = f"r{o[1]}"
        if o[0] == "add":
            f.add(Pending(rid, o[2], o[3], float(t), o[4], o[5], 0.0))
        elif o[0] == "first_token":
            f.prefill_done(rid)
        else:
            f.pop(rid)
        for w in WORKERS:
            assert f.outstanding(w, weight) == f.outstanding_walk(w, weight)
        changed, mark = f.changes_since(mark)
        assert changed is not None
        assert {w for w in WORKERS if f.outstanding_walk(w, weight) != before[w]} <= set(changed)


def test_the_change_log_is_bounded_and_says_when_it_no_longer_reaches_back():
    f = InFlight()
    for i in range(CHANGE_LOG_MAX + 10):
        f.add(Pending(f"r{i}", "a", None, float(i), 10, 1, 0.0))
    changed, end = f.changes_since(0)
    assert changed is None and end == CHANGE_LOG_MAX + 10
    f.pop("r3")
    assert f.changes_since(end) == (["a"], end + 1)


def test_a_weight_without_an_exact_sum_walks():
    f = InFlight()
    for i in range(3):
        f.add(Pending(f"r{i}", "a", None, 0.0, 1000 + i, 333, 0.0))
    n, tokens = f.outstanding("a", 0.3)
    walk = 0.0
    for i in reversed(range(3)):  # the walk's order, newest first
        walk += 0.3 * 333
        walk += 1000 + i
    assert (n, tokens) == (3, walk) == f.outstanding_walk("a", 0.3)
    assert f.outstanding("a", 0.5) == (3, 3003 + 1.5 * 333)
    assert f.outstanding("zz", 0.5) == (0, 0.0)
