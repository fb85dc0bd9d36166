"""Event loop: ordering by (time, priority, seq), the explicit tie-break order, dispatch by type."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
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



CHILDREN = st.lists(st.lists(st.tuples(st.sampled_from([0.0, 0.25, 1.0, 3.0]), st.sampled_from(list(Priority))),
                             max_size=3), min_size=1, max_size=30)
"""Per dispatched event (in dispatch order), the (delay, priority) of the events its handler schedules."""
SEEDS = st.lists(st.tuples(st.sampled_from([0.0, 1.0, 2.0]), st.sampled_from(list(Priority))), min_size=1, max_size=8)


def heapq_order(seeds, children) -> list[tuple[float, int, int]]:
    """The reference: the same handlers replayed on heapq over (time, priority, seq)."""
    ref: list[tuple[float, int, int]] = []
    for k, (t, p) in enumerate(seeds, 1):
        heapq.heappush(ref, (t, int(p), k))
    seq, out = len(seeds), []
    while ref:
        item = heapq.heappop(ref)
        out.append(item)
        for delay, prio in children[len(out) - 1] if len(out) <= len(children) else []:
            seq += 1
            heapq.heappush(ref, (item[0] + delay, int(prio), seq))
    return out


@settings(max_examples=200, derandomize=True, deadline=None)
@given(SEEDS, CHILDREN, st.booleans())
def test_events_scheduled_while_dispatching_pop_in_heapq_order(seeds, children, use_call_at):
    """Handlers that schedule more events (some due before everything queued, which the loop keeps
    out of its heap) see the order a plain heapq over (time, priority, seq) gives."""
    loop = EventLoop()
    got: list[tuple[float, int, int]] = []
    seq = [0]

    def schedule(t: float, p: Priority) -> None:
        seq[0] += 1
        if use_call_at:
            loop.call_at(t, int(p), handler, (int(p), seq[0]))
        else:
            loop.push(t, p, Tagged(f"{int(p)}:{seq[0]}"))

    def handler(t: float, ev: object) -> None:
        p, k = ev if isinstance(ev, tuple) else map(int, ev.tag.split(":"))  # type: ignore[attr-defined]
        got.append((t, p, k))
        for delay, prio in children[len(got) - 1] if len(got) <= len(children) else []:
            schedule(t + delay, prio)

    loop.on(Tagged, handler)
    for t, p in seeds:
        schedule(t, p)
    loop.run()
    assert got == heapq_order(seeds, children)
    assert loop.processed == len(got) and len(loop) == 0 and loop.peek_time() == float("inf")
