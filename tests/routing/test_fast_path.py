"""The composed policy's columns path decides as the per-candidate reference of the tests.

Two policies of the same preset and seed, one wrapped in `reference_policy.ReferencePolicy`
(each candidate's signals from its view and a walk of the ledger, the per-candidate scorers of
`reference_scorers.py`, the load bound over candidates, totals and the max in dicts), are fed the
same views and feedback: lagged views with and without token backlogs, shared prefixes,
identical workers (exact ties), latency and failure feedback that moves the slowness factors, a
load bound that excludes workers, weighted workers, pickers other than `max`. Every decision
(worker, scores, reason, kind), the winners' recorded scores and the final reports must be equal.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from reference_policy import ReferencePolicy

from fleetwise.core.feedback import Completed, Dispatched, Failed, FirstToken
from fleetwise.core.views import FleetView, RouteRequest, WorkerView
from fleetwise.routing.base import winning_scores
from fleetwise.routing.plugins import SCORERS
from fleetwise.routing.policy import ComposedPolicy
from fleetwise.routing.vector import ScoreTable
from fleetwise.spec.routing import RoutingSpec

WORKERS = 12
"""Workers in the fleet (four of them identical, so that exact ties occur)."""
REQUESTS = 400
"""Decisions per run."""
VIEW_EVERY = 7
"""Requests routed on one fleet view before the next."""


VARIANTS = {
    "no-bound": ("fleetwise-default", {"load_bound": {"enabled": False}}),
    "no-share-check": ("fleetwise-default", {"load_bound": {"share_window": 0}, "tie_break": "random"}),
    "feedback-scorer": ("fleetwise-default", {"scorers": {"load": 1.0, "feedback": 0.5, "requests": 0.2}}),
    "bounded-power-of-two": ("power-of-two", {"load_bound": {"enabled": True}, "feedback": {"enabled": True}}),
    "bounded-round-robin": ("round-robin", {"load_bound": {"enabled": True}}),
}
"""Parameter sets beyond the presets: `name` -> (preset, overrides)."""


def make(preset: str, seed: int, reference: bool) -> ComposedPolicy | ReferencePolicy:
    base, overrides = VARIANTS.get(preset, (preset, {}))
    spec = RoutingSpec(policy=base, params=overrides)
    p = ComposedPolicy(spec.policy, spec.resolved(), spec.safe_mode, seed=seed)
    return ReferencePolicy(p) if reference else p


def views(rng: np.random.Generator, now: float, backlogs: bool, weighted: bool = False) -> tuple[WorkerView, ...]:
    out = []
    for i in range(WORKERS):
        twin = i < 4  # w00..w03 report the same state: they tie until the ledger tells them apart
        q, r = (2, 5) if twin else (int(rng.integers(0, 6)), int(rng.integers(0, 20)))
        kv = 0.4 if twin else float(rng.uniform(0, 1))
        pre, dec = ((300, 900) if twin else (int(rng.integers(0, 5000)), int(rng.integers(0, 8000)))) if backlogs \
            else (None, None)
        out.append(WorkerView(f"w{i:02d}", queued_requests=q, running_requests=r, queued_prefill_tokens=pre,
                              running_decode_tokens=dec, kv_usage=kv, kv_capacity_tokens=100_000,
                              reported_at_s=now - float(rng.uniform(0, 0.3)), weight=1.0 + (i % 3 if weighted else 0)))
    return tuple(out)


def drive(preset: str, seed: int, reference: bool, backlogs: bool, weighted: bool = False) -> tuple[list, list, dict]:
    rng = np.random.default_rng(seed)
    p = make(preset, seed, reference)
    prefixes = [tuple(range(k * 100, k * 100 + n)) for k, n in enumerate([2, 4, 8])]
    open_: list[tuple[str, str]] = []
    decisions, rows = [], []
    now = 0.0
    fleet = FleetView(now, views(rng, now, backlogs, weighted))
    for i in range(REQUESTS):
        now += float(rng.exponential(0.01))
        if i % VIEW_EVERY == 0:
            fleet = FleetView(now, views(rng, now, backlogs, weighted))
        else:
            fleet = FleetView(now, fleet.workers)
        while open_ and rng.random() < 0.6:  # feedback on an earlier request
            rid, w = open_.pop(int(rng.integers(len(open_))))
            slow = 3.0 if w in ("w05", "w06") else 1.0  # two slow workers: their factors leave 1
            if rng.random() < 0.04:
                p.observe(Failed(now, rid, w, "error"))
                continue
            p.observe(FirstToken(now, rid, w, slow * float(rng.uniform(0.05, 0.3))))
            p.observe(Completed(now, rid, w, int(rng.integers(2, 400)), slow * float(rng.uniform(0.01, 0.03)), 1.0))
        hashes = prefixes[int(rng.integers(3))] if rng.random() < 0.5 else ()
        req = RouteRequest(f"r{i}", int(rng.integers(100, 6000)), None, block_hashes=hashes)
        d = p.route(req, fleet)
        decisions.append(d)
        rows.append(winning_scores(d, tuple(SCORERS)))
        if d.worker is not None:
            p.observe(Dispatched(now, req.request_id, d.worker, req.prompt_tokens, hashes))
            open_.append((req.request_id, d.worker))
    return decisions, rows, p.report()


@pytest.mark.parametrize("backlogs", [True, False], ids=["token-backlogs", "ledger"])
@pytest.mark.parametrize("preset", ["fleetwise-default", "prefix-affinity", "feedback", "least-outstanding", *VARIANTS])
def test_fast_path_decides_as_the_reference(preset: str, backlogs: bool) -> None:
    for seed in (1, 2):
        fast, ref = (drive(preset, seed, reference, backlogs) for reference in (False, True))
        assert fast == ref
        ds = fast[0]
        if preset != "bounded-round-robin":  # the one variant without a weighted scorer
            assert any(isinstance(d.scores, ScoreTable) for d in ds)  # scored over columns
        assert len({d.worker for d in ds}) > 6


@pytest.mark.parametrize("preset", ["fleetwise-default", "least-outstanding", "bounded-power-of-two"])
def test_weighted_workers_decide_as_the_reference(preset: str) -> None:
    fast, ref = (drive(preset, 3, reference, True, weighted=True) for reference in (False, True))
    assert fast == ref
    assert all(isinstance(d.scores, ScoreTable) for d in fast[0])
    if preset == "fleetwise-default":  # weights 2 and 3 read as slowness 1/2 and 1/3 in the reasons
        assert any("slowness x0.50" in d.reason for d in fast[0])
        assert any("slowness x0.33" in d.reason for d in fast[0])


def test_the_runs_exercise_ties_exclusions_and_slowness() -> None:
    ds, _, _ = drive("fleetwise-default", 1, False, True)
    reasons = [d.reason for d in ds]
    assert any("tie of" in r for r in reasons)
    assert any("over bound" in r for r in reasons)
    assert any("slowness x" in r for r in reasons)
    assert any(d.kind == "prefix" for d in ds)


def test_uniform_weights_other_than_one_decide_as_weight_one() -> None:
    def fleet(weight: float) -> FleetView:
        return FleetView(1.0, tuple(WorkerView(f"w{i}", queued_requests=i, weight=weight, reported_at_s=1.0)
                                    for i in range(4)))

    fast, ref, one = (make("fleetwise-default", 0, r) for r in (False, True, False))
    for i in range(20):
        req = RouteRequest(f"r{i}", 1000, None)
        d = fast.route(req, fleet(2.0))
        assert d == ref.route(req, fleet(2.0))
        assert isinstance(d.scores, ScoreTable)
        assert d.worker == one.route(req, fleet(1.0)).worker  # equal weights: the same choices


def test_views_changing_in_part_decide_as_views_built_anew() -> None:
    """A driver's new view that keeps most workers' `WorkerView` objects (the simulator's, whose
    replicas' views are cached until they change) is read only where it changed, and feedback
    between decisions updates only the observed workers' terms: the decisions equal the
    reference's, which reads every worker anew each time."""
    rng = np.random.default_rng(4)
    kept, anew = make("fleetwise-default", 4, False), make("fleetwise-default", 4, True)
    current = list(views(rng, 0.0, False))
    now, open_ = 0.0, []
    for i in range(300):
        now += float(rng.exponential(0.01))
        for j in rng.choice(WORKERS, size=int(rng.integers(0, 4)), replace=False):
            current[j] = replace(current[j], running_requests=int(rng.integers(0, 30)),
                                 kv_usage=float(rng.uniform(0, 1)), reported_at_s=now)
        req = RouteRequest(f"r{i}", int(rng.integers(100, 6000)), None,
                           block_hashes=tuple(range(int(rng.integers(0, 4)))))
        d = kept.route(req, FleetView(now, tuple(current)))
        assert d == anew.route(req, FleetView(now, tuple(current)))
        fbs = [Dispatched(now, req.request_id, d.worker, req.prompt_tokens, req.block_hashes)]
        open_.append((req.request_id, d.worker))
        if rng.random() < 0.5:
            rid, w = open_.pop(int(rng.integers(len(open_))))
            fbs += [FirstToken(now, rid, w, float(rng.uniform(0.05, 0.3))),
                    Completed(now, rid, w, int(rng.integers(2, 400)), float(rng.uniform(0.01, 0.03)), 1.0)]
        for fb in fbs:
            kept.observe(fb)
            anew.observe(fb)
    assert kept.report() == anew.report()
    assert any(f != 1.0 for f in kept.feedback.factors([w.name for w in current], now))  # feedback moved
    assert isinstance(kept, ComposedPolicy)


@pytest.mark.parametrize("preset", ["fleetwise-default", "round-robin", "least-outstanding"])
def test_views_in_a_changing_order_decide_as_views_in_name_order(preset: str) -> None:
    """A driver that lists its workers in an order of its own, kept for a while then changed
    (a new listing, a worker missing from a view): the policy's order by name, reused while the
    names come in the same order, decides as a policy shown the same views sorted by name."""
    rng = np.random.default_rng(7)
    shuffled, by_name = make(preset, 7, False), make(preset, 7, False)
    current = list(views(rng, 0.0, False))
    order = list(range(len(current)))
    for i in range(200):
        now = 0.01 * (i + 1)
        if i % 25 == 0:
            order = [int(k) for k in rng.permutation(len(current))]
        shown = [current[k] for k in order]
        if i % 40 == 39:
            shown = shown[1:]  # a worker missing from this view
        req = RouteRequest(f"r{i}", int(rng.integers(100, 6000)), None)
        d = shuffled.route(req, FleetView(now, tuple(shown)))
        assert d == by_name.route(req, FleetView(now, tuple(sorted(shown, key=lambda w: w.name))))
        for p in (shuffled, by_name):
            p.observe(Dispatched(now, req.request_id, d.worker, req.prompt_tokens, ()))
    assert shuffled.report() == by_name.report()
