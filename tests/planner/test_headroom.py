"""Headroom is simulated, not only added: each term runs against the sized plan, a miss adds capacity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleetwise.planner.fit import prepare
from fleetwise.planner.layout import Layout
from fleetwise.planner.refinement import check_headroom, headroom_runs
from fleetwise.planner.report import to_json
from fleetwise.planner.results import Refined
from fleetwise.planner.simulate import FleetShape, PoolShape, burst_requests, requests_over
from fleetwise.planner.workload import LengthMix, build_mix, burst_factor
from fleetwise.spec.catalog import get_model


def _two_replicas_checked(spec_factory, headroom: dict) -> Refined:
    """Two H100 replicas (they carry 14 req/s of 2048/128-token requests; one alone cannot) with
    their headroom checked under `headroom`."""
    spec = spec_factory(workload={"rate_rps": 14.0, "prompt_tokens": {"kind": "fixed", "tokens": 2048},
                                  "output_tokens": {"kind": "fixed", "tokens": 128}}, headroom=headroom)
    full = FleetShape((PoolShape("mixed", Layout("h100-sxm", "bf16", 1), 2),))
    out = Refined("two", full, full)
    check_headroom(prepare(spec).ctx, out)
    return out


def test_every_term_is_simulated_against_the_sized_plan(small_search) -> None:
    # 0.2 req/s, 200-request runs: a standard run spans S = 1,000 s. Each term runs long enough
    # for its whole event plus S: the upgrade of 2 replicas at 120 s each 1,240 s (248 requests),
    # the cold join 120 + 1,000 s (224 requests). The burst factor is 1 (given): no burst run.
    # A cold start is the spec's 120 s plus reading the weights (16 GB of bf16 8B weights on one
    # card at 6.5 GB/s: 2.5 s), so each event lasts that much longer.
    plan = small_search.ranked[0]
    lay = plan.fleet.pools[0].layout
    load = small_search.ctx.load_s(lay)
    assert load == pytest.approx(small_search.hw.model.weight_bytes("bf16") / 6.5e9)
    cold = 120 + load
    lines = [s for s in to_json(small_search)["plans"][0]["explanation"] if s.startswith("headroom checked")]
    assert [ln.split(": ")[1] for ln in lines] == [
        "1 mixed replica(s) down for the whole run",
        f"a rolling upgrade of the mixed pool (2 replicas, one out at a time, {cold:.0f} s each)",
        f"a mixed replica joining cold (empty cache) after {round(120 + round(load, 1), 1):g} s (120 s start + "
        f"{load:.1f} s reading its "
        "weights from storage)",
    ]
    assert [ln.split(": ")[2].split(",")[0] for ln in lines] == [
        "200 requests over 1000 s", f"{math.ceil(0.2 * (2 * cold + 1000))} requests over {2 * cold + 1000:.0f} s",
        f"{math.ceil(0.2 * (cold + 1000))} requests over {cold + 1000:.0f} s"]
    assert all("-> holds" in ln and "added" not in ln for ln in lines)


def test_each_run_covers_its_whole_event(spec_factory) -> None:
    spec = spec_factory(headroom={"burst_factor": 1.5, "burst_window_s": 100.0, "cold_start_s": 300.0})
    ctx = prepare(spec).ctx
    full = FleetShape((PoolShape("mixed", Layout("h100-sxm", "bf16", 1), 3),))
    runs = headroom_runs(ctx, full)
    load = ctx.load_s(full.pools[0].layout)
    cold = 300 + load
    assert [(r.term, r.role, r.span_s, len(r.requests)) for r in runs] == [
        ("1 mixed replica(s) down for the whole run", "mixed", 1000.0, 200),
        (f"a rolling upgrade of the mixed pool (3 replicas, one out at a time, {cold:.0f} s each)", "mixed",
         3 * cold + 1000, math.ceil(0.2 * (3 * cold + 1000))),
        (f"a mixed replica joining cold (empty cache) after {round(300 + round(load, 1), 1):g} s (300 s start + "
         f"{load:.1f} s reading its "
         "weights from storage)", "mixed", cold + 1000, math.ceil(0.2 * (cold + 1000))),
        # S/2 at 0.2 req/s, 100 s at 0.3 req/s, S/2 at 0.2 req/s: 100 + 30 + 100 requests
        ("a burst of x1.50 the target rate for 100 s (the workload's burst factor)", None, 1100.0, 230),
    ]
    upgrade, cold_join = runs[1].faults, runs[2].faults
    assert upgrade is not None and upgrade.faults[0].restart_after_s == 300.0 + load
    assert cold_join is not None and cold_join.faults[0].restart_after_s == 300.0 + load  # the full load, never cut
    # the runs are longer than the mix holds: the mix is repeated
    assert [r.prompt_tokens for r in runs[1].requests[-3:]] == [256, 256, 256]
    assert runs[1].requests[-1].arrival_s < 3 * cold + 1000 <= runs[1].requests[-1].arrival_s + 5 / 0.2 * 2


def test_the_upgrade_run_takes_the_spec_batch_out_at_once(spec_factory) -> None:
    # upgrade_batch_replicas 2 sizes for two replicas out together: the run drains two at a time,
    # so 5 replicas take ceil(5 / 2) = 3 cold starts (it drained one at a time, 5 cold starts).
    spec = spec_factory(headroom={"failures_to_survive": 0, "upgrade_batch_replicas": 2, "cold_start_s": 300.0})
    ctx = prepare(spec).ctx
    full = FleetShape((PoolShape("mixed", Layout("h100-sxm", "bf16", 1), 5),))
    up = headroom_runs(ctx, full)[0]
    cold = 300 + ctx.load_s(full.pools[0].layout)
    assert (up.term, up.span_s) == (
        f"a rolling upgrade of the mixed pool (5 replicas, 2 out at a time, {cold:.0f} s each)", 3 * cold + 1000)
    assert up.faults is not None and up.faults.faults[0].batch == 2


def test_the_burst_run_uses_the_derived_factor(spec_factory) -> None:
    spec = spec_factory(headroom={"burst_factor": None})
    ctx = prepare(spec).ctx
    derived = burst_factor(ctx.mix, 0.2, 60.0)
    assert ctx.burst == derived and 1.5 < derived < 2.5
    full = FleetShape((PoolShape("mixed", Layout("h100-sxm", "bf16", 1), 3),))
    burst = headroom_runs(ctx, full)[-1]
    assert burst.term == f"a burst of x{derived:.2f} the target rate for 60 s (the workload's burst factor)"
    assert (burst.span_s, len(burst.requests)) == (1060.0, math.ceil(0.2 * 1000 + 0.2 * derived * 60 - 1e-9))
    # the window holds the arrivals whose cumulative count at the constant rate falls in
    # [0.2 x 500, 0.2 x 500 + 0.2 x derived x 60): derived times a mean window's 12
    u = np.array([r.arrival_s * 0.2 for r in requests_over(ctx.mix, 0.2, 1000 + derived * 60)])
    t = np.array([r.arrival_s for r in burst.requests])
    in_window = int(((t >= 500.0) & (t < 560.0)).sum())
    assert in_window == int(((u >= 100) & (u < 100 + 0.2 * derived * 60)).sum())
    assert in_window / 12 == pytest.approx(derived, abs=0.25)


def test_burst_arrivals_hold_factor_times_the_mean_in_the_window() -> None:
    n = 100
    even = LengthMix(np.full(n, 256), np.full(n, 64), np.ones(n), "even")
    reqs = burst_requests(even, 2.0, 3.0, start_s=10.0, window_s=5.0, after_s=10.0)
    t = np.array([r.arrival_s for r in reqs])
    assert len(reqs) == 70  # 2/s x 10 s + 6/s x 5 s + 2/s x 10 s
    assert [int(((t >= a) & (t < b)).sum()) for a, b in ((0, 10), (10, 15), (15, 25))] == [20, 30, 20]
    assert t[20] == 10.0 and t[21] == pytest.approx(10.0 + 1 / 6) and t[50] == 15.0
    assert np.all(np.diff(t) > 0)


def test_a_missed_burst_adds_capacity_and_says_so(spec_factory) -> None:
    # Two replicas carry 14 req/s of 2048/128-token requests; a 20 s burst at x2 (28 req/s) is too
    # much for them: the burst run misses, replicas are added until it holds.
    out = _two_replicas_checked(spec_factory, {"failures_to_survive": 0, "upgrade_batch_replicas": 0, "cold_start_s": 0,
                                  "burst_factor": 2.0, "burst_window_s": 20.0})
    (check,) = out.headroom
    assert check.term == "a burst of x2.00 the target rate for 20 s (the workload's burst factor)"
    assert (check.requests, check.span_s) == (1400, 80.0)  # 14/s x 30 s + 28/s x 20 s + 14/s x 30 s
    # 2 replicas miss the burst, 3 hold it (the figures below follow the shipped profile)
    assert (check.added, check.verdict.passed, out.full.pool("mixed").replicas) == (1, True, 3)
    assert check.line(90, 1.0, 0.05).endswith(
        "-> holds; missed first (as sized: attainment 56.8%, TTFT p90 676 ms, TPOT p90 118.9 ms), so 1 mixed "
        "replica(s) were added")


def test_a_missed_failure_check_adds_a_replica(spec_factory) -> None:
    # Two replicas carry 14 req/s of 2048/128-token requests; one alone cannot (TTFT p90 3.4 s).
    # Sized with no failure spare, the failure check misses and adds one replica, then holds.
    out = _two_replicas_checked(spec_factory, {"failures_to_survive": 1, "upgrade_batch_replicas": 0, "cold_start_s": 0})
    (check,) = out.headroom
    assert check.term == "1 mixed replica(s) down for the whole run"
    assert (check.added, check.verdict.passed, out.full.pool("mixed").replicas) == (1, True, 3)
    assert check.line(90, 1.0, 0.05).endswith(
        "-> holds; missed first (as sized: attainment 0.0%, TTFT p90 3440 ms, TPOT p90 125.8 ms), so 1 mixed "
        "replica(s) were added")


def test_a_missed_upgrade_is_rerun_in_full_for_the_larger_pool(spec_factory) -> None:
    # 14 req/s of 2048/128-token requests: one replica out of two for 60 s during an upgrade misses;
    # with a third replica the upgrade takes one more 60 s outage, and the rerun covers it (3 x 60 s + S).
    out = _two_replicas_checked(spec_factory, {"failures_to_survive": 0, "upgrade_batch_replicas": 1, "cold_start_s": 60.0})
    upgrade, cold = out.headroom
    load = get_model("llama-3.1-8b").weight_bytes("bf16") / 6.5e9  # one H100 reads 16 GB at 6.5 GB/s
    c = 60 + load
    assert (upgrade.term, upgrade.span_s, upgrade.requests, upgrade.added, upgrade.verdict.passed) == (
        f"a rolling upgrade of the mixed pool (3 replicas, one out at a time, {c:.0f} s each)", pytest.approx(3 * c + 60),
        math.ceil(14 * (3 * c + 60)), 1, True)
    # the cold join then runs against the three replicas the upgrade left
    assert (cold.term, cold.span_s, cold.requests, cold.added) == (
        f"a mixed replica joining cold (empty cache) after {round(60 + round(load, 1), 1):g} s (60 s start + "
        f"{load:.1f} s reading its weights "
        "from storage)", pytest.approx(c + 60), math.ceil(14 * (c + 60)), 0)
    assert out.full.pool("mixed").replicas == 3


def test_derived_burst_factor_is_the_p99_window_count_over_the_mean(spec_factory) -> None:
    spec = spec_factory(workload={"rate_rps": 10.0})
    mix = build_mix(spec.workload, 1000, seed=0)
    # 100 s of Poisson arrivals at 10/s is under two 60 s windows: the counting-noise bound
    # 1 + z99 * cv / sqrt(rate * window) applies.
    cv = mix.stats.interarrival_cv
    assert burst_factor(mix, 10.0, 60.0) == pytest.approx(1 + 2.326 * cv / math.sqrt(600))
    # Over 1 s windows there are enough: p99 of the per-window counts over their mean.
    t = np.cumsum(mix.unit_gaps) / 10.0
    counts = np.bincount((t // 1.0).astype(np.int64))[:-1]
    assert burst_factor(mix, 10.0, 1.0) == pytest.approx(float(np.percentile(counts, 99) / counts.mean()))
    assert 1.5 < burst_factor(mix, 10.0, 1.0) < 2.2


def test_a_term_still_missed_after_its_adds_demotes_the_plan(small_search) -> None:
    # A plan whose headroom term still misses after the replicas it may add does not survive what
    # the spec asks: it ranks below a dearer plan whose terms hold, and says which term and how far.
    import copy
    from dataclasses import replace

    from fleetwise.planner import ranking
    from fleetwise.planner.results import HeadroomCheck

    cheap, dear = small_search.ranked[0], small_search.ranked[1]
    assert cheap.refined is not None and cheap.cost_per_hour < dear.cost_per_hour and cheap.demoted is None
    held = cheap.refined.headroom[0]
    missed = HeadroomCheck(held.term, held.role, replace(held.verdict, passed=False, attainment=0.5), 2,
                           held.requests, held.span_s, held.verdict)
    worse = copy.copy(cheap)
    worse.refined = replace(cheap.refined, headroom=[missed, *cheap.refined.headroom[1:]])
    again = copy.copy(small_search)
    again.rejected, again.disaggregation = [], {}
    again.refined = [worse, dear]
    ranking.run(again)
    assert [c.key for c in again.ranked] == [dear.key, cheap.key]
    assert worse.demoted == ("demoted: headroom still missed after adding replicas: 1 mixed replica(s) down for "
                             "the whole run (attainment 50.0% with 2 mixed replica(s) added)")
    assert [(r.candidate, r.reason) for r in again.rejected] == [
        (cheap.key, f"${cheap.cost_per_hour:.2f}/h, meets the SLO but {worse.demoted}")]


@pytest.mark.parametrize("during", [False, True])
def test_failures_during_upgrade_are_down_throughout_the_upgrade_run(spec_factory, during: bool) -> None:
    # failures_during_upgrade sizes one failure spare beside the upgrade batch; the upgrade run then
    # has the last replica it reaches down from the start (it was only sized for, never simulated).
    spec = spec_factory(headroom={"failures_to_survive": 1, "upgrade_batch_replicas": 1, "cold_start_s": 60.0,
                                  "failures_during_upgrade": during})
    ctx = prepare(spec).ctx
    full = FleetShape((PoolShape("mixed", Layout("h100-sxm", "bf16", 1), 4),))
    up = next(r for r in headroom_runs(ctx, full) if r.key == "upgrade:mixed")
    cold = 60 + ctx.load_s(full.pools[0].layout)
    assert up.faults is not None and up.span_s == 4 * cold + 1000
    crashes = [(f.replica, f.at_s, f.restart_after_s) for f in up.faults.faults if f.kind == "crash"]
    assert crashes == ([("mixed-3", 0.0, None)] if during else [])
    assert up.term.endswith(f"{cold:.0f} s each, 1 mixed replica(s) down throughout)" if during else f"{cold:.0f} s each)")


def test_the_upgrade_with_a_failure_runs_the_whole_pool_and_restores_the_failed_replica(spec_factory) -> None:
    from fleetwise.planner.refinement import headroom_run
    from fleetwise.planner.simulate import to_plan_spec
    from fleetwise.sim.runner import simulate

    spec = spec_factory(headroom={"failures_to_survive": 1, "upgrade_batch_replicas": 1, "cold_start_s": 60.0,
                                  "failures_during_upgrade": True})
    ctx = prepare(spec).ctx
    full = FleetShape((PoolShape("mixed", Layout("h100-sxm", "bf16", 1), 4),))
    run = headroom_run(ctx, full, next(r for r in headroom_runs(ctx, full) if r.key == "upgrade:mixed"))
    s = simulate(to_plan_spec(spec, full, ctx.prices), run.requests, faults=run.faults).summary
    log = [(f["fault"], f["phase"], f["target"]) for f in s["faults"]]
    assert log[0] == (0, "drain", "mixed-0") and (1, "crash", "mixed-3") in log
    assert [t for k, p, t in log if (k, p) == (0, "restart")] == ["mixed-0", "mixed-1", "mixed-2", "mixed-3"]
    assert s["requests_completed"] == len(run.requests)
