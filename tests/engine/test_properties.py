"""Hypothesis properties of the engine: invariants on random workloads, and fused == unfused."""

from __future__ import annotations

import pytest
from engine_factories import affine_time, check_engine, convex_time, drive, make_engine, make_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetwise.core.request import Request

PREFIXES = [(1, 2, 3, 4), (1, 2, 5, 6), (7, 8, 9, 10)]


@st.composite
def workloads(draw, max_requests: int = 12) -> list[Request]:
    n = draw(st.integers(1, max_requests))
    reqs = []
    for rid in range(n):
        prompt = draw(st.integers(1, 260))
        output = draw(st.integers(1, 40))
        prefix = draw(st.sampled_from(PREFIXES))
        shared = draw(st.integers(0, 4))
        hashes = prefix[: min(shared, -(-prompt // 64))]
        gap = draw(st.integers(0, 30))
        # the offset keeps arrivals off the grid of step times, so no pass ends exactly at one
        # (at a tie, float rounding alone decides whether it joins that pass or the next)
        arrival = (reqs[-1].arrival_s if reqs else 0.0) + gap * 1.37e-3 + (3.1e-4 + 3.3e-10 if gap else 0.0)
        reqs.append(make_request(rid, prompt, output, tuple(hashes), 64, arrival))
    return reqs


engine_knobs = st.fixed_dictionaries({
    "num_blocks": st.integers(24, 80),
    "max_num_batched_tokens": st.sampled_from([32, 64, 200]),
    "max_num_seqs": st.sampled_from([2, 4, 32]),
    "block_size": st.sampled_from([4, 16]),
    "enable_prefix_caching": st.booleans(),
    "enable_chunked_prefill": st.booleans(),
})


def _config(knobs: dict) -> dict:
    knobs = dict(knobs)
    if not knobs["enable_chunked_prefill"]:
        knobs["max_num_batched_tokens"] = 300  # whole prompts must fit a step
    return knobs


def _fitting(reqs: list[Request], knobs: dict) -> list[Request]:
    eng = make_engine(**knobs)
    return [r for r in reqs if eng.fits(r)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), engine_knobs)
def test_invariants_hold_and_every_request_completes(reqs, knobs):
    knobs = _config(knobs)
    reqs = _fitting(reqs, knobs)
    eng = make_engine(**knobs)
    budget, max_seqs = knobs["max_num_batched_tokens"], knobs["max_num_seqs"]
    tr = drive(eng, reqs, check=check_engine)
    assert sorted(tr.finish_s) == sorted(r.request_id for r in reqs)
    assert tr.tokens == sum(r.output_tokens for r in reqs)  # none short, none extra
    assert set(tr.first_token_s) == set(tr.finish_s)
    for step in tr.steps:
        assert step.shape.new_tokens <= budget and step.num_seqs <= max_seqs
        assert step.num_passes == 1 or step.prefill_tokens == 0
    order = [r.request_id for r in sorted(reqs, key=lambda r: (r.arrival_s, int(r.request_id)))]
    assert tr.admission_order == order  # FCFS
    assert eng.pool.num_used == 0 and not eng.has_work


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), engine_knobs, st.sampled_from(["affine", "convex"]))
def test_fused_and_unfused_runs_finish_at_the_same_times(reqs, knobs, cost):
    knobs = _config(knobs)
    reqs = _fitting(reqs, knobs)
    step_time = affine_time if cost == "affine" else convex_time
    fused = drive(make_engine(step_time=step_time, max_bundle_steps=64, **knobs), reqs)
    single = drive(make_engine(step_time=step_time, max_bundle_steps=1, **knobs), reqs)
    assert fused.finish_s.keys() == single.finish_s.keys()
    for rid, t in single.finish_s.items():
        assert fused.finish_s[rid] == pytest.approx(t, rel=1e-9)
        assert fused.first_token_s[rid] == pytest.approx(single.first_token_s[rid], rel=1e-9)
    assert (fused.tokens, fused.preempted) == (single.tokens, single.preempted)
    assert len(fused.steps) <= len(single.steps)
    assert sum(s.num_passes for s in fused.steps) == len(single.steps)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), engine_knobs, st.sampled_from(["affine", "convex"]), st.sampled_from(["soft", "cut"]))
def test_soft_horizon_and_cut_steps_keep_unfused_times(reqs, knobs, cost, mode):
    """A fused step may run the pass an arrival falls in (soft horizon, or cut short when the
    arrival was not known): the same times as single passes, in fewer steps than hard horizons."""
    knobs = _config(knobs)
    reqs = _fitting(reqs, knobs)
    step_time = affine_time if cost == "affine" else convex_time
    hard = drive(make_engine(step_time=step_time, max_bundle_steps=64, **knobs), reqs, check=check_engine)
    soft = drive(make_engine(step_time=step_time, max_bundle_steps=64, **knobs), reqs, check=check_engine,
                 horizon=mode)
    single = drive(make_engine(step_time=step_time, max_bundle_steps=1, **knobs), reqs)
    assert soft.finish_s.keys() == single.finish_s.keys()
    for rid, t in single.finish_s.items():
        assert soft.finish_s[rid] == pytest.approx(t, rel=1e-9)
        assert soft.first_token_s[rid] == pytest.approx(single.first_token_s[rid], rel=1e-9)
        assert soft.scheduled_s[rid] == pytest.approx(single.scheduled_s[rid], rel=1e-9)
    assert (soft.tokens, soft.preempted) == (single.tokens, single.preempted)
    assert sum(s.num_passes for s in soft.steps) == len(single.steps)
    assert len(soft.steps) <= len(hard.steps)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(2, 300), st.floats(1e-4, 0.2))
def test_fused_step_stays_within_the_horizon(n, output, horizon):
    eng = make_engine(max_bundle_steps=64)
    for rid in range(n):
        eng.add_request(make_request(rid, prompt=30, output=output))
    assert eng.schedule() is not None
    eng.complete()
    step = eng.schedule(horizon)
    assert step is not None
    assert step.num_passes == 1 or step.duration_s <= horizon
    assert step.num_passes <= min(64, output - 1)


def test_preemption_storm_still_completes_everything():
    reqs = [make_request(i, prompt=50 + 7 * i, output=30 + i) for i in range(10)]
    eng = make_engine(num_blocks=40, block_size=4, max_num_batched_tokens=64, max_num_seqs=32)
    tr = drive(eng, reqs, check=check_engine)
    assert tr.preempted > 0
    assert sorted(tr.finish_s, key=int) == [str(i) for i in range(10)]
    assert tr.tokens == sum(r.output_tokens for r in reqs)


def test_prefill_role_with_late_release_blocks_then_drains():
    reqs = [make_request(i, prompt=120, output=5, hashes=(1, 2), hash_block_tokens=64) for i in range(6)]
    eng = make_engine("prefill", num_blocks=20, block_size=16, max_num_batched_tokens=256, max_num_seqs=8)
    tr = drive(eng, reqs, check=check_engine, release_after_s=0.01)
    assert sorted(tr.handoff_s, key=int) == [str(i) for i in range(6)] and tr.tokens == 0
    assert eng.pool.num_used == 0
