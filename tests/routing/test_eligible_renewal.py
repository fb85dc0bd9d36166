"""The eligible set of a new view, renewed from the previous view's without filtering
(`Eligible.renewed`, when `view_cache.same_fields` holds), against the filters run afresh on
every view; and `InFlight.since`'s shortcut (`_latest`) against the walk."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwise.core.feedback import WorkerDown, WorkerUp
from fleetwise.core.views import FleetView, RouteRequest, WorkerView
from fleetwise.routing.policy import ComposedPolicy
from fleetwise.routing.state import InFlight, Pending
from fleetwise.routing.view_cache import Eligible
from fleetwise.spec.routing import RoutingSpec

WORKERS = 8
DECISIONS = 400


def policy(filters: list[str] | None = None) -> ComposedPolicy:
    spec = RoutingSpec(policy="fleetwise-default", params={"filters": filters} if filters else {})
    return ComposedPolicy(spec.policy, spec.resolved(), spec.safe_mode, seed=3)


def fleet(rng: np.random.Generator) -> list[WorkerView]:
    return [WorkerView(f"w{i}", queued_requests=0, running_requests=0, kv_usage=0.1, kv_capacity_tokens=10_000,
                       region=("eu", "us")[i % 2], model_version=("v1", "v2")[i % 3 == 0], reported_at_s=0.0)
            for i in range(WORKERS)]


def test_renewed_eligible_sets_equal_the_filters_run_afresh() -> None:
    """Views that change only in load (renewed), or in a filtered field (health, region, model
    version, role, weight), workers reported down and up: every decision's eligible set, its
    order, reason, names and weights equal a fresh filtering of the same view."""
    rng = np.random.default_rng(11)
    p = policy()
    current = fleet(rng)
    renewed = 0
    back: dict[int, str] = {}
    for i in range(DECISIONS):
        now = 0.01 * (i + 1)
        for j in rng.choice(WORKERS, size=int(rng.integers(0, 3)), replace=False):  # load only
            current[j] = replace(current[j], running_requests=int(rng.integers(0, 30)), reported_at_s=now)
        if rng.random() < 0.15:  # a filtered field changes
            j = int(rng.integers(WORKERS))
            field = str(rng.choice(["healthy", "region", "model_version", "role", "weight"]))
            value = {"healthy": not current[j].healthy, "region": str(rng.choice(["eu", "us", "ap"])),
                     "model_version": str(rng.choice(["v1", "v2"])), "weight": float(rng.choice([1.0, 2.0])),
                     "role": str(rng.choice(["mixed", "prefill"]))}[field]
            current[j] = replace(current[j], **{field: value}, reported_at_s=now)
        if i in back:  # a worker reported down 10 decisions ago is back
            p.observe(WorkerUp(now, back.pop(i)))
        elif rng.random() < 0.03:
            back[i + 10] = f"w{int(rng.integers(WORKERS))}"
            p.observe(WorkerDown(now, back[i + 10]))
        view = FleetView(now, tuple(current))
        pinned = rng.random() < 0.2  # most requests name no version or region: one eligible set renewed
        req = RouteRequest(f"r{i}", 100, None, model_version=rng.choice([None, "v1", "v2"]) if pinned else None,
                           region=rng.choice([None, "eu", "us"]) if pinned else None)
        prev_renew = p._elig_key
        e = p._eligible_cached(req, view)
        renewed += p._elig_renew and prev_renew is not None
        fresh = Eligible(*p._eligible(req, view))
        assert [w.name for w in e.ws] == [w.name for w in fresh.ws]
        assert all(a is b for a, b in zip(e.ws, fresh.ws, strict=True))  # the new view's objects
        assert (e.why, e.names, e.weights, e.unit, e.reported) == (
            fresh.why, fresh.names, fresh.weights, fresh.unit, fresh.reported)
    assert 0.3 * DECISIONS < renewed < DECISIONS  # both paths ran


def test_a_filter_outside_field_filters_filters_every_view() -> None:
    """A policy whose filters are not all `FIELD_FILTERS` never renews an eligible set."""
    p = policy()
    p._filters_by_fields = False  # as for a plugin filter that reads any field
    current = fleet(np.random.default_rng(1))
    for i in range(20):
        current[0] = replace(current[0], running_requests=i, reported_at_s=0.01 * i)
        p._eligible_cached(RouteRequest(f"r{i}", 100, None), FleetView(0.01 * i, tuple(current)))
        assert not p._elig_renew


WORKER_NAMES = ("a", "b", "c")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("add", "pop", "first_token")), st.integers(0, 20),
                          st.sampled_from(WORKER_NAMES), st.sampled_from((None, *WORKER_NAMES)),
                          st.floats(0.0, 5.0)), max_size=50),
       st.floats(-1.0, 6.0), st.sampled_from((0.5, 1.0, 0.3)))
def test_since_equals_the_walk(ops, since_s, weight):
    """`since` (its `_latest` shortcut and its memo) returns the walk's (requests, tokens), after any changes."""
    f = InFlight()
    for op, k, w, pw, t in ops:
        rid = f"r{k}"
        if op == "add":
            f.add(Pending(rid, w, pw, t, 300, 40, 0.0))
        elif op == "pop":
            f.pop(rid)
        else:
            f.prefill_done(rid)
        for x in WORKER_NAMES:
            for s in (since_s, t):
                assert f.since(x, s, weight) == f._since_walk(x, s, weight)
