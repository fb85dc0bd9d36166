"""Array twins against their scalar references: rounding, scorers, the feedback factor."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwise.core.views import RouteRequest, WorkerView
from fleetwise.routing.plugins import SCORERS, Candidate
from fleetwise.routing.state import LatencyFeedback
from fleetwise.routing.vector import VECTOR_SCORERS, Columns, round_scores
from fleetwise.spec.routing import FeedbackParams

finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(finite, st.floats(0, 2), st.integers(-10**7, 10**7).map(lambda k: k / 1e6),
                          st.integers(-10**7, 10**7).map(lambda k: (k + 0.5) / 1e6),
                          st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-7, 1.5e-6, 2.5e-6])),
                max_size=40))
def test_round_scores_is_round_to_six_places(xs):
    got = round_scores(np.array(xs, dtype=np.float64))
    want = [round(x, 6) for x in map(float, xs)]
    assert [(math.copysign(1, g), g) if g == g else "nan" for g in got] == \
        [(math.copysign(1, w), w) if w == w else "nan" for w in want]


def test_round_scores_near_ties_match_round():
    # k/10^6 + 5e-7 and its neighbours: the cases where the scaled product could round across
    ks = np.arange(0, 2_000_000, 997)
    xs = np.concatenate([(ks + 0.5) / 1e6, np.nextafter((ks + 0.5) / 1e6, 0), np.nextafter((ks + 0.5) / 1e6, 2)])
    assert round_scores(xs) == [round(float(x), 6) for x in xs]


cand = st.tuples(st.floats(0, 1e6), st.floats(0, 1e4), st.floats(0.25, 8), st.integers(0, 300), st.integers(0, 12),
                 st.floats(-0.5, 1.5))


@settings(max_examples=200, deadline=None)
@given(st.lists(cand, min_size=1, max_size=12), st.integers(0, 12))
def test_each_vector_scorer_equals_its_scorer(rows, n_hashes):
    req = RouteRequest("r", 1000, 10, block_hashes=tuple(range(n_hashes)))
    cs = [Candidate(WorkerView(f"w{i}", kv_usage=kv), reqs, load, own, slow, pre)
          for i, (load, own, slow, reqs, pre, kv) in enumerate(rows)]
    cols = Columns(np.array([c.load for c in cs]), np.array([c.own for c in cs]), np.array([c.slowness for c in cs]),
                   np.array([c.requests for c in cs], dtype=np.int64),
                   np.array([c.prefix_blocks for c in cs], dtype=np.int64),
                   np.array([c.view.kv_usage for c in cs]), n_hashes)
    for name, twin in VECTOR_SCORERS.items():
        assert twin(cols).tolist() == list(SCORERS[name](req, cs).values()), name


obs = st.tuples(st.sampled_from(["first_token", "completed", "failed", "forget"]), st.integers(0, 5),
                st.floats(0, 3), st.floats(1, 20000), st.integers(0, 400))


@settings(max_examples=150, deadline=None)
@given(st.lists(obs, max_size=40), st.lists(st.floats(0, 60), min_size=1, max_size=6),
       st.sampled_from([FeedbackParams(enabled=True), FeedbackParams(enabled=True, min_factor=1.2, deadband=0.0),
                        FeedbackParams(enabled=True, min_samples=1, half_life_s=0.5), FeedbackParams()]))
def test_factor_array_equals_factor(events, times, params):
    fb = LatencyFeedback(params)
    workers = [f"w{i}" for i in range(6)]
    t = 0.0
    for kind, w, x, cost, out in events:
        t += x
        name = workers[w]
        if kind == "first_token":
            fb.first_token(name, x, cost, t)
        elif kind == "completed":
            fb.completed(name, x / 50, out, t)
        elif kind == "failed":
            fb.failed(name, t)
        else:
            fb.forget(name)
        for now in times:
            assert fb.factor_array(workers, t + now).tolist() == [fb.factor(w, t + now) for w in workers]
