"""Replica arithmetic and the goodput bisection, by hand."""

from __future__ import annotations

import pytest

from fleetwise.planner.simulate import bisect_rate
from fleetwise.planner.sizing import size_pool
from fleetwise.spec.planning import HeadroomSpec

CASES = [
    # goodput, rate, burst, headroom kwargs, (serving, failures, upgrade)
    (2.0, 0.2, 1.0, {}, (1, 1, 0)),
    (2.0, 5.0, 1.0, {}, (3, 1, 0)),
    (2.0, 5.0, 1.2, {}, (3, 1, 0)),
    (2.0, 6.0, 1.2, {}, (4, 1, 0)),
    (2.0, 4.0, 1.0, {"failures_to_survive": 0, "upgrade_batch_replicas": 2}, (2, 0, 2)),
    (2.0, 4.0, 1.0, {"failures_to_survive": 1, "upgrade_batch_replicas": 1, "failures_during_upgrade": True},
     (2, 1, 1)),
    (2.0, 4.0, 1.0, {"rate_growth_per_min": 0.5, "cold_start_s": 60.0}, (3, 1, 0)),
]


@pytest.mark.parametrize("g,rate,burst,kw,want", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_size_pool_terms(g, rate, burst, kw, want):
    s = size_pool("mixed", g, rate, burst, HeadroomSpec(**kw))
    assert (s.serving, s.failures, s.upgrade) == want
    assert s.total == sum(want)


def test_size_pool_explains_every_term():
    s = size_pool("decode", 4.0, 10.0, 1.1, HeadroomSpec())
    text = s.explain(HeadroomSpec())
    assert text.startswith("decode replicas: 10 req/s x burst 1.10 / effective goodput 4.00 req/s per replica = 2.75")
    assert text.endswith("-> 3 serving + 1 for 1 failure(s) + 0 for upgrade batch beyond the failure spares "
                         "(1 at a time) = 4")


def test_bisect_finds_the_threshold():
    found = bisect_rate(lambda r: r <= 3.3, guess_rps=1.0, steps=12)
    assert 3.2 < found <= 3.3


def test_bisect_returns_zero_when_nothing_passes():
    assert bisect_rate(lambda r: False, guess_rps=1.0, steps=5) == 0.0


def test_bisect_stops_at_the_floor():
    calls = []

    def never(rate):
        calls.append(rate)
        return False

    assert bisect_rate(never, guess_rps=8.0, steps=20, floor_rps=0.5) == 0.0
    assert calls == [8.0, 2.0, 0.5]


def test_the_ramp_term_counts_the_weights_load_time_from_the_catalog():
    from fleetwise.planner.sizing import size_pool
    from fleetwise.spec.planning import HeadroomSpec

    h = HeadroomSpec(rate_growth_per_min=0.5, cold_start_s=60.0, failures_to_survive=0, upgrade_batch_replicas=0)
    s = size_pool("decode", 4.0, 10.0, 1.0, h, load_s=30.0)
    # load 2.5 replicas x 50%/min growth over a 90 s cold start (60 s start + 30 s reading weights)
    assert s.ramp_replicas == pytest.approx(2.5 * 0.5 * 90 / 60)
    assert s.serving == 5
    assert "over 90 s = 60 s start + 30.0 s reading the weights" in s.explain(h)


@pytest.mark.parametrize("meets_below", [None, 0.3])
def test_a_replica_missing_at_its_floor_is_tried_once_at_a_tenth_and_the_rejection_says_what_helps(
        spec_factory, monkeypatch, meets_below) -> None:
    """One replica that misses at the floor rate is run once more at a tenth of it: missing there
    too means its latency misses, so more GPUs cannot help; meeting there means they can."""
    from fleetwise.planner import goodput
    from fleetwise.planner.fit import prepare
    from fleetwise.planner.layout import Layout
    from fleetwise.planner.simulate import FleetShape, PoolShape

    rates: list[float] = []

    def passes(spec, mix, fleet, prices, rate, seed, check="both"):  # type: ignore[no-untyped-def]
        rates.append(rate)
        return meets_below is not None and rate <= meets_below

    monkeypatch.setattr(goodput, "passes", passes)
    ctx = prepare(spec_factory()).ctx
    task = goodput.MeasureTask("mixed|x", "mixed", FleetShape((PoolShape("mixed", Layout("h100-sxm", "bf16", 1), 1),)),
                               4.0, floor_rps=2.0)
    res = goodput.measure_goodput(ctx, task)
    assert res.goodput_rps == 0.0 and rates == [4.0, 2.0, 0.2] and res.runs == 3  # the guess, the floor, a tenth
    assert res.low_passed is (meets_below is not None)
    text = goodput._missed_text(res, 2.0)
    assert text.startswith("in simulation one mixed replica missed the SLO even at 2 req/s, the least each replica "
                           "must carry for the target x burst within the GPU limit (3 runs)")
    if meets_below is None:
        assert text.endswith(", and at 0.2 req/s too: its latency misses the SLO, not its capacity, so more GPUs "
                             "cannot help; relax the SLO or pick a faster layout (more TP, a faster card)")
    else:
        assert text.endswith("; it met the SLO at 0.2 req/s: raise search.max_gpus, relax the SLO, or pick a "
                             "faster layout")
