"""Headroom is simulated, not only added: each term runs against the sized plan, a miss adds capacity."""

from __future__ import annotations

import math

import pytest

from fleetwise.planner.fit import Layout, prepare
from fleetwise.planner.refinement import Refined, check_headroom
from fleetwise.planner.report import to_json
from fleetwise.planner.simulate import FleetShape, PoolShape
from fleetwise.planner.workload import build_mix, burst_factor


def test_every_term_is_simulated_against_the_sized_plan(small_search) -> None:
    lines = [s for s in to_json(small_search)["plans"][0]["explanation"] if s.startswith("headroom checked")]
    assert [ln.split(": ")[1] for ln in lines] == [
        "1 mixed replica(s) down for the whole run",
        "a rolling upgrade of the mixed pool (one replica out at a time, 120 s each)",
        "a mixed replica joining cold (empty cache) after 120 s of loading",
    ]
    assert all("-> holds" in ln and "added" not in ln for ln in lines)


def test_a_missed_failure_check_adds_a_replica(spec_factory) -> None:
    # Two replicas carry 14 req/s of 2048/128-token requests; one alone cannot (TTFT p90 3.4 s).
    # Sized with no failure spare, the failure check misses and adds one replica, then holds.
    spec = spec_factory(workload={"rate_rps": 14.0, "prompt_tokens": {"kind": "fixed", "tokens": 2048},
                                  "output_tokens": {"kind": "fixed", "tokens": 128}},
                        headroom={"failures_to_survive": 1, "upgrade_batch_replicas": 0, "cold_start_s": 0})
    ctx = prepare(spec).ctx
    full = FleetShape((PoolShape("mixed", Layout("h100-sxm", "bf16", 1), 2),))
    out = Refined("two", full, full)
    check_headroom(ctx, out)
    (check,) = out.headroom
    assert check.term == "1 mixed replica(s) down for the whole run"
    assert (check.added, check.verdict.passed, out.full.pool("mixed").replicas) == (1, True, 3)
    assert "missed first, so 1 mixed replica(s) were added" in check.line(90, 1.0, 0.05)


def test_derived_burst_factor_is_the_p99_window_count_over_the_mean(spec_factory) -> None:
    spec = spec_factory(workload={"rate_rps": 10.0})
    mix = build_mix(spec.workload, 1000, seed=0)
    # 100 s of Poisson arrivals at 10/s is under two 60 s windows: the counting-noise bound
    # 1 + z99 * cv / sqrt(rate * window) applies.
    cv = mix.stats.interarrival_cv
    assert burst_factor(mix, 10.0, 60.0) == pytest.approx(1 + 2.326 * cv / math.sqrt(600))
    # Over 1 s windows there are enough: p99 of the per-window counts over their mean.
    import numpy as np

    t = np.cumsum(mix.unit_gaps) / 10.0
    counts = np.bincount((t // 1.0).astype(np.int64))[:-1]
    assert burst_factor(mix, 10.0, 1.0) == pytest.approx(float(np.percentile(counts, 99) / counts.mean()))
    assert 1.5 < burst_factor(mix, 10.0, 1.0) < 2.2
