"""The columns implementations against their readable references (`reference_scorers.py`,
`reference_policy.py`): the scorers, the load bound, totals and ties, the max picker, the
feedback factor, the scores table."""

from __future__ import annotations

import math
import struct
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_policy import load_bound, max_of, reference_factor
from reference_scorers import REFERENCE

from fleetwise.core.views import RouteRequest, WorkerView
from fleetwise.routing import kernels
from fleetwise.routing.base import winning_scores
from fleetwise.routing.plugins import (
    SCORERS,
    TIE_TOLERANCE,
    Candidate,
    PickerState,
    candidate_columns,
)
from fleetwise.routing.reasons import fixed
from fleetwise.routing.score_rows import SCORE_DIGITS, rounded
from fleetwise.routing.state import LatencyFeedback
from fleetwise.routing.vector import Columns, ScoreTable
from fleetwise.spec.routing import FeedbackParams, LoadBoundParams

cand = st.tuples(st.floats(0, 1e6), st.floats(0, 1e4), st.floats(0.25, 8), st.integers(0, 300), st.integers(0, 12),
                 st.floats(-0.5, 1.5), st.sampled_from([1.0, 0.5, 2.0, 3.0]), st.floats(-1.0, 2.0))


def candidates(rows, weighted: bool = False):
    return [Candidate(WorkerView(f"w{i:02d}", kv_usage=kv, weight=wt if weighted else 1.0), reqs, load, own, slow,
                      pre, room)
            for i, (load, own, slow, reqs, pre, kv, wt, room) in enumerate(rows)]


def columns(cs, n_hashes, kept):
    """The default policy's columns: every weight 1 (None), no KV room."""
    return Columns([c.load for c in cs], [c.own for c in cs], [c.slowness for c in cs], [c.requests for c in cs],
                   [c.prefix_blocks for c in cs], [c.view.kv_usage for c in cs], n_hashes, kept, [c.view for c in cs])


@settings(max_examples=200, deadline=None)
@given(st.lists(cand, min_size=1, max_size=12), st.integers(0, 12), st.data())
def test_each_scorer_equals_its_reference_on_the_kept_workers(rows, n_hashes, data):
    req = RouteRequest("r", 1000, 10, block_hashes=tuple(range(n_hashes)))
    kept = sorted(data.draw(st.sets(st.integers(0, len(rows) - 1), min_size=1)))
    unit = candidates([(*r[:-1], 0.0) for r in rows])  # the columns fast path: weights 1, no KV room
    cols = columns(unit, n_hashes, kept)
    weighted = candidates(rows, weighted=True)  # the per-candidate paths: weights, KV room
    wcols = candidate_columns(req, weighted)
    wcols.kept = kept
    assert set(SCORERS) == set(REFERENCE)
    for name, scorer in SCORERS.items():
        assert scorer(req, cols) == list(REFERENCE[name](req, [unit[i] for i in kept]).values()), name
        assert scorer(req, wcols) == list(REFERENCE[name](req, [weighted[i] for i in kept]).values()), name


def test_prefix_scorer_without_any_cached_prefix_scores_zero():
    cs = candidates([(10.0, 5.0, 1.0, 0, 0, 0.5, 1.0, 0.0)] * 3)
    cols = Columns([10.0] * 3, [5.0] * 3, [1.0] * 3, [0] * 3, None, [0.5] * 3, 4, [0, 2], [c.view for c in cs])
    req = RouteRequest("r", 1, 1, (1, 2, 3, 4))
    assert SCORERS["prefix"](req, cols) == [0.0, 0.0] == list(REFERENCE["prefix"](req, [cs[0], cs[2]]).values())


@settings(max_examples=200, deadline=None)
@given(st.lists(cand, min_size=2, max_size=12), st.floats(1.01, 3), st.integers(0, 8),
       st.lists(st.tuples(st.integers(0, 14), st.integers(1, 5000)), max_size=40))
def test_bounded_equals_load_bound(rows, c, window, recent_idx):
    cs = candidates(rows)
    names = [x.name for x in cs]
    # names beyond the fleet too
    recent = deque(((f"w{i:02d}", w) for i, w in recent_idx), maxlen=max(1, window))
    p = LoadBoundParams(c=c, share_window=window)
    want_kept, want_bound, _ = load_bound(cs, recent, p)
    counts = None
    k = 0
    if window > 0 and recent:
        counts = [sum(w for r, w in recent if r == n) for n in names]
        k = sum(counts)
    bound, kept = kernels.bounded([x.load for x in cs], [x.own for x in cs], [x.slowness for x in cs], c,
                                  TIE_TOLERANCE, counts, k)
    assert bound == want_bound
    assert [names[i] for i in kept] == [x.name for x in want_kept]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1 / 3]), st.floats(0, 1), st.floats(0, 1)),
                min_size=1, max_size=12),
       st.sampled_from([[1.0, 0.3, 0.05], [0.5, 0.5, 0.0001], [2.0, 1.0, 1.0]]))
def test_totals_and_ties_equal_the_reference(rows, weights):
    # scores drawn from a few values, so that exact ties and near-ties both occur
    per = [[r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]]
    names = [f"w{i:02d}" for i in range(len(rows))]
    want: dict[str, float] = {}
    for j, n in enumerate(names):  # the reference: `0 + w1 * s1 + w2 * s2 ...` per worker
        t: float = 0
        for w, col in zip(weights, per, strict=True):
            t += w * col[j]
        want[n] = t
    got = kernels.totals(per, weights)
    assert got == list(want.values())
    best = max(want.values())
    assert [names[j] for j in kernels.tied(got, TIE_TOLERANCE)] == sorted(
        n for n, t in want.items() if t >= best - TIE_TOLERANCE)
    for seed in range(3):  # the picker over the list decides as the reference over the dict
        ps, ref = PickerState(np.random.default_rng(seed)), PickerState(np.random.default_rng(seed))
        ps.chosen("w01")
        ref.chosen("w01")
        for tie_break in ("lru", "random"):
            i, tied = ps.max(names, got, tie_break)
            assert (names[i], tied) == max_of(ref, want, tie_break)


obs = st.tuples(st.sampled_from(["first_token", "completed", "failed", "forget"]), st.integers(0, 5),
                st.floats(0, 3), st.floats(1, 20000), st.integers(0, 400))


@settings(max_examples=150, deadline=None)
@given(st.lists(obs, max_size=40), st.lists(st.floats(0, 60), min_size=1, max_size=6),
       st.sampled_from([FeedbackParams(enabled=True), FeedbackParams(enabled=True, min_factor=1.2, deadband=0.0),
                        FeedbackParams(enabled=True, min_samples=1, half_life_s=0.5), FeedbackParams(),
                        FeedbackParams(enabled=True, min_samples=1, failure_penalty=0.0)]))
def test_factors_equal_factor(events, times, params):
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
            want = [reference_factor(fb, w, t + now) for w in workers]
            assert fb.factors(workers, t + now) == want
            assert [fb.factor(w, t + now) for w in workers] == want


def test_slowness_leaves_out_a_ratio_of_zero():
    # a worker whose EWMA is 0 at age 0 has ratio (ref - ref) / ref = 0: left out, as the reference does
    got = kernels.slowness(10.0, 5.0, [10.0, 10.0], [True, True], [2.0, 2.0], [-2.0, 1.0], [True, False],
                           [4.0, 1.0], [2.0, 0.0], [1.0, 1.0], 0.25, 8.0, 0.05)
    assert got == [math.exp(math.log(1.5))] * 2


def table(kept):
    names = ["a", "b", "c", "d"]
    keys = [[f"{n}.load" for n in names], [f"{n}.kv" for n in names]]
    where = {n: (0, i) for i, n in enumerate(names)}
    for k, ks in enumerate(keys, start=1):
        where.update((key, (k, i)) for i, key in enumerate(ks))
    m = len(kept) if kept is not None else 4
    cols = [[0.1234565 + j for j in range(m)], [1 / 3 + j for j in range(m)], [2 / 3 + j for j in range(m)]]
    ref: dict[str, float] = {}
    idx = kept if kept is not None else range(4)
    for col, ks in zip(cols, [names, *keys], strict=True):
        for j, i in enumerate(idx):
            ref[ks[i]] = round(col[j], 6)
    return ScoreTable(names, {"load": 1, "kv": 2}, keys, where, kept, cols), ref


@pytest.mark.parametrize("kept", [None, [0, 2, 3], [1]])
def test_score_table_is_the_reference_dict(kept):
    t, ref = table(kept)
    assert t["d.kv" if kept != [1] else "b.kv"] == ref["d.kv" if kept != [1] else "b.kv"]
    assert t.get("zz") is None and t.get("zz", 7) == 7 and "zz" not in t
    if kept is not None:
        assert t.get("b.load" if kept != [1] else "a.load") is None
    assert list(t.items()) == list(ref.items())  # same keys, values and order
    assert t == ref and ref == t and len(t) == len(ref)
    assert repr(t) == repr(ref)


@pytest.mark.parametrize("kept", [None, [0, 2, 3]])
def test_score_table_row_is_winning_scores_of_the_dict(kept):
    from fleetwise.core.views import RoutingDecision

    t, ref = table(kept)
    scorers = ("load", "requests", "prefix", "kv", "feedback")
    for w in ("a", "b", "c", "d"):  # b: not kept (no entries)
        assert winning_scores(RoutingDecision(w, scores=t), scorers) == winning_scores(
            RoutingDecision(w, scores=ref), scorers)


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-2.0, 2.0),
                 st.integers(-3_000_000, 3_000_000).map(lambda k: (k + 0.5) / 1e6),
                 st.tuples(st.integers(-3_000_000, 3_000_000), st.integers(-3, 3)).map(
                     lambda t: math.nextafter((t[0] + 0.5) / 1e6, math.copysign(math.inf, t[1])))))
def test_rounded_is_the_builtin_round(x):
    """`score_rows.rounded` returns the very double `round(x, 6)` does: near ties, at zero of
    either sign, NaN and infinities included."""
    got, want = rounded(x), round(x, SCORE_DIGITS)
    assert _bits(got) == _bits(want) or (math.isnan(got) and math.isnan(want))


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e5, 1e5),
                 st.integers(-200_000, 200_000).map(lambda k: k / 10 + 0.05),
                 st.integers(-200_000, 200_000).map(lambda k: k + 0.5),
                 st.tuples(st.integers(-200_000, 200_000), st.booleans()).map(
                     lambda t: math.nextafter(t[0] / 10 + 0.05, math.inf if t[1] else -math.inf)),
                 st.integers(-200_000, 200_000).map(lambda k: k / 100 + 0.005)),
       st.sampled_from([0, 1, 2, 3]))
def test_fixed_is_the_builtin_format(x, digits):
    """`reasons.fixed` writes the very text `f"{x:.{digits}f}"` does: near ties, negative zero,
    NaN and infinities included."""
    assert fixed(x, digits) == f"{x:.{digits}f}"
