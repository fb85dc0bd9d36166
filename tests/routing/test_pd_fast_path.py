"""The composed policy's P/D pair decision over kept columns decides as the per-candidate reference.

Two policies of the same preset and seed, one wrapped in `reference_policy.ReferencePolicy`
(whose P/D decisions `reference_pd.route_pd` recomputes from nothing, one candidate and one
pair at a time), are fed the same views, KV link views and feedback: views that change in part
(most `WorkerView` objects kept, as the simulator's are) or are built anew, links that get busy,
degrade, go down and come back, a decode replica on another model version (its KV format pairs
with no prefill replica until it is upgraded), decode replicas near full KV, latency feedback,
shared prompt prefixes, presets whose sides pick other than `max`, and a pair scorer that reads
the request and the views (scored per decision, unlike the link-only `handoff`). Every decision (worker,
prefill worker, scores, reason, kind) and the final reports must be equal.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
from reference_policy import ReferencePolicy

from fleetwise.core.feedback import Completed, Dispatched, FirstToken
from fleetwise.core.views import FleetView, KvLinkView, RouteRequest, WorkerView
from fleetwise.routing.pd_scorers import PairColumns
from fleetwise.routing.policy import ComposedPolicy
from fleetwise.spec.routing import RoutingSpec
from fleetwise.spec.routing_plugins import ROUTING_PLUGINS

PREFILL, DECODE = 3, 5
"""Workers of each side."""
REQUESTS = 300
"""Decisions per run."""
BW = 50e9
"""Bytes/s of a healthy link."""

VARIANTS = {
    "default": ("fleetwise-default", {}),
    "no-bound": ("fleetwise-default", {"load_bound": {"enabled": False}, "tie_break": "random"}),
    "power-of-two-sides": ("fleetwise-default", {"pd": {"prefill": {"picker": "power_of_two"}}}),
    "max-prefill-rr-decode": ("fleetwise-default", {"pd": {"decode": {"picker": "round_robin"}}}),
    "side-filters": ("fleetwise-default", {"pd": {"prefill": {"filters": ["healthy"]},
                                                  "decode": {"filters": ["healthy", "model_version"]}}}),
    "request-pair-scorer": ("fleetwise-default", {"pd": {"pair_scorers": {"handoff": 0.25, "idle_decode": 0.3}}}),
    "round-robin": ("round-robin", {}),
    "least-outstanding": ("least-outstanding", {}),
}
"""name -> (preset, overrides)."""


def make(variant: str, seed: int, reference: bool) -> ComposedPolicy | ReferencePolicy:
    preset, overrides = VARIANTS[variant]
    spec = RoutingSpec(policy=preset, params=overrides)
    p = ComposedPolicy(spec.policy, spec.resolved(), spec.safe_mode, seed=seed)
    return ReferencePolicy(p) if reference else p


def fleet_views(rng: np.random.Generator, now: float, upgraded: bool) -> list[WorkerView]:
    out = [WorkerView(f"p{i}", role="prefill", queued_requests=int(rng.integers(0, 4)),
                      queued_prefill_tokens=int(rng.integers(0, 6000)), reported_at_s=now - 0.01)
           for i in range(PREFILL)]
    for j in range(DECODE):
        out.append(WorkerView(f"d{j}", role="decode", running_requests=int(rng.integers(0, 40)),
                              running_decode_tokens=int(rng.integers(0, 9000)), kv_usage=float(rng.uniform(0, 0.97)),
                              kv_capacity_tokens=200_000, reported_at_s=now - 0.01,
                              model_version="v0" if j == DECODE - 1 and not upgraded else "v1"))
    return out


def link_views(rng: np.random.Generator, old: tuple[KvLinkView, ...] | None) -> tuple[KvLinkView, ...]:
    if old is None:
        return tuple(KvLinkView(f"p{i}", f"d{j}", BW, 2e-5) for i in range(PREFILL) for j in range(DECODE))
    out = list(old)
    for k in rng.choice(len(out), size=int(rng.integers(0, 4)), replace=False):
        r = rng.random()
        bw = BW * (0.1 if r < 0.15 else 1.0)
        out[k] = replace(out[k], bandwidth_bytes_per_s=bw, active_transfers=int(rng.integers(0, 3)),
                         healthy=r > 0.05)
    return tuple(out)


def drive(variant: str, seed: int, reference: bool) -> tuple[list, dict]:
    rng = np.random.default_rng(seed)
    p = make(variant, seed, reference)
    prefixes = [tuple(range(k * 100, k * 100 + n)) for k, n in enumerate([2, 4, 8])]
    current = fleet_views(rng, 0.0, False)
    links = link_views(rng, None)
    now, open_, decisions = 0.0, [], []
    for i in range(REQUESTS):
        now += float(rng.exponential(0.01))
        if i % 50 == 0:
            current = fleet_views(rng, now, i >= REQUESTS // 2)
        for j in rng.choice(len(current), size=int(rng.integers(0, 3)), replace=False):
            current[j] = replace(current[j], running_requests=int(rng.integers(0, 40)),
                                 kv_usage=float(rng.uniform(0, 0.99)), reported_at_s=now,
                                 healthy=bool(rng.random() > 0.1))
        links = link_views(rng, links)
        while open_ and rng.random() < 0.5:
            rid, w, pw = open_.pop(int(rng.integers(len(open_))))
            slow = 3.0 if pw == "p1" else 1.0
            p.observe(FirstToken(now, rid, w, slow * float(rng.uniform(0.05, 0.3))))
            p.observe(Completed(now, rid, w, int(rng.integers(2, 400)), float(rng.uniform(0.01, 0.03)), 1.0))
        hashes = prefixes[int(rng.integers(3))] if rng.random() < 0.5 else ()
        req = RouteRequest(f"r{i}", int(rng.integers(100, 6000)), None, block_hashes=hashes)
        d = p.route(req, FleetView(now, tuple(current), links))
        decisions.append(d)
        if d.worker is not None:
            p.observe(Dispatched(now, req.request_id, d.worker, req.prompt_tokens, hashes, d.prefill_worker))
            open_.append((req.request_id, d.worker, d.prefill_worker))
    return decisions, p.report()


@pytest.fixture
def idle_decode() -> Iterator[None]:
    """A pair scorer that reads the views and the request (not link-only): `1 / (1 + running
    requests of the decode worker + prompt / 10k)`, attached for the test; the registry is left as it was."""
    ROUTING_PLUGINS.declare("pair_scorer", "idle_decode", "1 / (1 + decode running + prompt / 10k).")

    def score(req: RouteRequest, c: PairColumns) -> list[float]:
        return [1.0 / (1.0 + d.running_requests + req.prompt_tokens / 10_000) for d in c.decode]

    ROUTING_PLUGINS.implements("pair_scorer", "idle_decode")(score)
    try:
        yield
    finally:
        ROUTING_PLUGINS._impl["pair_scorer"].pop("idle_decode", None)
        ROUTING_PLUGINS._declared["pair_scorer"].pop("idle_decode", None)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_pd_decisions_equal_the_reference(variant: str, idle_decode: None) -> None:
    for seed in (1, 2):
        fast, ref = (drive(variant, seed, reference) for reference in (False, True))
        assert fast == ref
        ds = fast[0]
        assert len({d.worker for d in ds}) >= 3 and len({d.prefill_worker for d in ds}) >= 2
        assert "d4" in {d.worker for d in ds[REQUESTS // 2:]}  # upgraded half way: paired since
        assert "d4" not in {d.worker for d in ds[:REQUESTS // 2]}  # another KV format: never paired


def test_the_runs_exercise_links_and_headroom() -> None:
    ds, _ = drive("default", 1, False)
    assert any(d.kind == "pair" for d in ds)
    assert len({d.reason.split(": ", 1)[0] for d in ds}) > 5
    assert any(d.scores and min(d.scores.values()) < max(d.scores.values()) - 0.1 for d in ds)
