"""Event loop: ordering by (time, priority, seq), the explicit tie-break order, dispatch by type."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetwise.sim.events import Event, EventLoop, Priority


@dataclass(slots=True)
class Tagged(Event):
    tag: str


def collect(loop: EventLoop) -> list[tuple[float, str]]:
    seen: list[tuple[float, str]] = []
    loop.on(Tagged, lambda t, ev: seen.append((t, ev.tag)))
    return seen


def test_priority_order_is_the_documented_tie_break():
    assert [p.name for p in sorted(Priority)] == [
        "FAULT", "STEP_END", "TRANSFER_END", "REFRESH", "ROUTE", "ARRIVAL", "KICK", "SAMPLE",
    ]


def test_equal_times_break_ties_by_priority_then_insertion():
    loop = EventLoop()
    seen = collect(loop)
    loop.push(1.0, Priority.KICK, Tagged("kick"))
    loop.push(1.0, Priority.ARRIVAL, Tagged("arrival-a"))
    loop.push(1.0, Priority.STEP_END, Tagged("step"))
    loop.push(1.0, Priority.ARRIVAL, Tagged("arrival-b"))
    loop.push(1.0, Priority.FAULT, Tagged("fault"))
    loop.push(0.5, Priority.SAMPLE, Tagged("earlier"))
    loop.run()
    assert [tag for _, tag in seen] == ["earlier", "fault", "step", "arrival-a", "arrival-b", "kick"]


def test_push_in_the_past_is_clamped_to_now_and_run_stops_at_until():
    loop = EventLoop()
    seen = collect(loop)
    loop.push(2.0, Priority.ARRIVAL, Tagged("a"))
    loop.push(5.0, Priority.ARRIVAL, Tagged("late"))
    loop.run(until_s=3.0)
    assert seen == [(2.0, "a")] and loop.now_s() == 2.0
    loop.push(1.0, Priority.ARRIVAL, Tagged("past"))
    loop.run(until_s=3.0)
    assert seen[-1] == (2.0, "past")
    assert len(loop) == 1


def test_second_handler_for_a_type_is_rejected():
    loop = EventLoop()
    loop.on(Tagged, lambda t, ev: None)
    with pytest.raises(ValueError, match="already registered"):
        loop.on(Tagged, lambda t, ev: None)


@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(list(Priority))), min_size=1, max_size=40))
def test_events_come_out_sorted_by_time_priority_seq(items):
    loop = EventLoop()
    out: list[tuple[float, int, int]] = []
    loop.on(Tagged, lambda t, ev: out.append((t, int(ev.tag.split(":")[0]), int(ev.tag.split(":")[1]))))
    for k, (t, p) in enumerate(items):
        loop.push(float(t), p, Tagged(f"{int(p)}:{k}"))
    loop.run()
    assert out == sorted(out)
    assert loop.processed == len(items)
