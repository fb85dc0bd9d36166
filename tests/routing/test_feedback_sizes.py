"""Latency feedback measures a worker's speed, not the size of the requests it gets.

TTFT has a fixed part (an engine step, the network) besides the part that grows with the work,
so a worker that receives prefix hits (short uncached prompts) takes more seconds per predicted
token than one that receives whole prompts, at the same speed. Feedback compares each TTFT with
the fleet's for requests of the same size: that worker reads normal, a slowed one does not."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from fleetwise.core.feedback import Completed, Dispatched, FirstToken
from fleetwise.core.views import FleetView, RouteRequest, WorkerView
from fleetwise.routing import make_policy
from fleetwise.routing.state import LatencyFeedback
from fleetwise.spec.routing import FeedbackParams

FIXED_S = 0.02
"""Fixed part of every TTFT (seconds): a step and the network."""
TOKENS_PER_S = 100_000.0
"""Prefill speed of a normal worker."""
HIT, WHOLE = 100.0, 4000.0
"""Predicted cost (tokens) of a prefix hit and of a whole prompt."""
MIX = {"w0": (HIT,), "w1": (HIT, WHOLE), "w2": (WHOLE,), "w3": (HIT, WHOLE)}
"""What each worker receives, in turn: w0 only prefix hits, w2 only whole prompts."""


def ttft(cost: float, slowdown: float = 1.0) -> float:
    return (FIXED_S + cost / TOKENS_PER_S) * slowdown


def feed(fb: LatencyFeedback, rounds: int, slow: str | None = None) -> None:
    for r in range(rounds):
        for w, costs in MIX.items():
            cost = costs[r % len(costs)]
            fb.first_token(w, ttft(cost, 3.0 if w == slow else 1.0), cost, now_s=float(r))


def test_the_mix_is_a_trap_for_ttft_per_token_alone():
    per_token = {w: statistics.mean(ttft(c) / c for c in cs) for w, cs in MIX.items()}
    # w0: 2.1e-4 s/token; w1 and w3: 1.125e-4 on average; w2: 1.5e-5 -> w0 reads 1.87x slow
    assert per_token["w0"] / statistics.median(per_token.values()) == pytest.approx(2.1e-4 / 1.125e-4)


def test_normal_speed_reads_normal_whatever_the_request_size():
    fb = LatencyFeedback(FeedbackParams(enabled=True))
    feed(fb, 40)
    assert fb.factors(list(MIX), 39.0) == [1.0, 1.0, 1.0, 1.0]


def test_a_slowed_worker_is_penalised_and_nobody_else():
    fb = LatencyFeedback(FeedbackParams(enabled=True))
    feed(fb, 40, slow="w3")
    f = fb.factors(list(MIX), 39.0)
    assert f[:3] == [1.0, 1.0, 1.0]
    assert f[3] == pytest.approx(3.0, rel=1e-4)  # its TTFT over the fleet's at each size


def test_a_slowed_prefix_hit_worker_is_penalised():
    fb = LatencyFeedback(FeedbackParams(enabled=True))
    feed(fb, 40, slow="w0")
    f = fb.factors(list(MIX), 39.0)
    assert f[1:] == [1.0, 1.0, 1.0]
    assert f[0] == pytest.approx(3.0, rel=1e-4)


def test_a_size_nobody_else_serves_is_compared_with_the_nearest_size():
    fb = LatencyFeedback(FeedbackParams(enabled=True))
    feed(fb, 40)
    for r in range(40):  # w2 alone gets 16x larger requests, three times slower per token
        fb.first_token("w2", 3.0 * (16 * WHOLE) / TOKENS_PER_S, 16 * WHOLE, now_s=40.0 + r)
    ref = ttft(WHOLE) / WHOLE  # the nearest size with a reference: whole prompts
    assert fb.factor("w2", 79.0) == pytest.approx(3.0 * (16 * WHOLE / TOKENS_PER_S) / (16 * WHOLE) / ref, rel=1e-4)


def test_through_observe_prefix_hit_workers_read_normal():
    """The policy's own path: requests placed by the driver (`Dispatched`) with the mix above,
    prompt tokens as the size, TTFTs by the same law; after 40 rounds every factor is 1, and
    the routing weighs every worker alike."""
    p = make_policy("fleetwise-default", seed=0)
    n = 0
    for r in range(40):
        now = float(r)
        for w, costs in MIX.items():
            rid, prompt = f"r{n}", int(costs[r % len(costs)])
            n += 1
            p.observe(Dispatched(now, rid, w, prompt))
            t = ttft(prompt)
            p.observe(FirstToken(now + t, rid, w, t))
            p.observe(Completed(now + t, rid, w, 8, 0.001, t + 0.007))
    assert p.feedback.factors(list(MIX), 39.0) == [1.0, 1.0, 1.0, 1.0]
    views = FleetView(40.0, tuple(WorkerView(w, reported_at_s=40.0) for w in MIX))
    assert "slowness" not in p.route(RouteRequest("next", 100, 8, arrival_s=40.0), views).reason


def reference_walk(sizes, k: int) -> float | None:
    """Class `k`'s reference recomputed from the EWMAs themselves (the median of the workers with
    enough samples; None below two or when not positive)."""
    vals = sorted(e.value for e in sizes._ewma.get(k, {}).values() if e.n >= sizes.p.min_samples)
    if len(vals) < 2:
        return None
    mid = len(vals) // 2
    ref = vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2
    return ref if ref > 0 else None


def test_class_medians_kept_sorted_equal_the_walk():
    """The per-class sorted values (the fast path) give the same references as recomputing
    each median from the EWMAs, through observations and workers forgotten (seeded)."""
    rng = np.random.default_rng(7)
    fb = LatencyFeedback(FeedbackParams(enabled=True))
    workers = [f"w{i}" for i in range(6)]
    for step in range(3000):
        w = workers[int(rng.integers(len(workers)))]
        if step % 500 == 499:
            fb.forget(w)
            continue
        cost = float(rng.uniform(1.0, 5000.0))
        fb.first_token(w, float(rng.uniform(0.001, 0.5)), cost, now_s=step * 0.01)
        k = fb._sizes.size_class(cost)
        assert fb._sizes.reference(k) == reference_walk(fb._sizes, k)
    sizes = fb._sizes
    assert [sizes.reference(k) for k in range(sizes._lo, sizes._hi + 1)] == \
        [reference_walk(sizes, k) for k in range(sizes._lo, sizes._hi + 1)]
    assert sum(r is not None for r in map(sizes.reference, range(sizes._lo, sizes._hi + 1))) > 10


def fleet_median_walk(fb: LatencyFeedback, attr: str) -> tuple[int, float]:
    """(workers with enough samples, their median EWMA) of `attr`, sorted from the EWMAs themselves."""
    vals = sorted(getattr(s, attr).value for s in fb._w.values() if getattr(s, attr).n >= fb.p.min_samples)
    if not vals:
        return 0, 0.0
    mid = len(vals) // 2
    return len(vals), vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def test_fleet_medians_kept_sorted_equal_the_walk():
    """The fleet's TTFT-ratio and TPOT medians, kept sorted per observation, equal the medians
    sorted from every worker's EWMA, through first tokens, completions, failures and workers
    forgotten (seeded)."""
    rng = np.random.default_rng(11)
    fb = LatencyFeedback(FeedbackParams(enabled=True))
    workers = [f"w{i}" for i in range(7)]
    for step in range(3000):
        w = workers[int(rng.integers(len(workers)))]
        r = rng.random()
        if step % 400 == 399:
            fb.forget(w)
        elif r < 0.45:
            fb.first_token(w, float(rng.uniform(0.001, 0.5)), float(rng.uniform(1.0, 5000.0)), now_s=step * 0.01)
        elif r < 0.9:
            fb.completed(w, float(rng.uniform(0.005, 0.05)), int(rng.integers(1, 300)), now_s=step * 0.01)
        else:
            fb.failed(w, now_s=step * 0.01)
        for attr in ("ttft_ratio", "tpot"):
            assert fb._reference(attr) == fleet_median_walk(fb, attr)
    assert all(fleet_median_walk(fb, attr)[0] >= 3 for attr in ("ttft_ratio", "tpot"))
