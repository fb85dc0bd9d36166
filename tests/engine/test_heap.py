"""`engine.heap` pops what `heapq` pops over the same `(key, tie)` tuples, in the same order,
pushes and pops interleaved: the event loop's order is heapq's, unchanged."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwise.engine.heap import Keyed, before, pop, push

OPS = st.lists(st.one_of(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.5, -1.0]), st.integers(0, 3)),
                         st.none()), max_size=200)
"""A push of (key, priority) or a pop (None); keys and priorities repeat so ties are common."""


@settings(max_examples=200, derandomize=True, deadline=None)
@given(OPS)
def test_pops_follow_heapq_over_the_same_keys(ops: list[tuple[float, int] | None]) -> None:
    ours: list[Keyed] = []
    ref: list[tuple[float, int]] = []
    for seq, op in enumerate(ops):
        if op is None:
            if ref:
                e = pop(ours)
                assert (e.key, e.tie) == heapq.heappop(ref)
            continue
        tie = op[1] << 32 | seq  # unique, as every user's tie is
        push(ours, Keyed(op[0], tie))
        heapq.heappush(ref, (op[0], tie))
    while ref:
        e = pop(ours)
        assert (e.key, e.tie) == heapq.heappop(ref)
    assert not ours


def test_before_orders_by_key_then_tie() -> None:
    assert before(Keyed(1.0, 9), Keyed(2.0, 0))
    assert before(Keyed(1.0, 0), Keyed(1.0, 1))
    assert not before(Keyed(1.0, 1), Keyed(1.0, 1))
    assert not before(Keyed(2.0, 0), Keyed(1.0, 9))
