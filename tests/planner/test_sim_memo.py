"""The per-process memo of `run_fleet`: a repeated run gives the verdict the uncached reference
(`simulate_fleet`) gives, any changed input is a new run, and the equal-cost check reuses the
colocated plan's confirmation instead of simulating it again."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from fleetwise.core.feedback import Completed, FirstToken
from fleetwise.planner import disaggregation
from fleetwise.planner import simulate as sim
from fleetwise.planner.early import (
    CertainMiss,
    CertainPass,
    VerdictWatch,
    allowed_misses,
    needed_for_percentile,
)
from fleetwise.planner.executor import Executor
from fleetwise.planner.results import Refined
from fleetwise.planner.simulate import (
    FleetShape,
    PoolShape,
    crash_scenario,
    passes,
    requests_over,
    run_fleet,
    simulate_fleet,
)
from fleetwise.planner.state import Candidate


def test_memo_answers_a_repeated_run_with_the_reference_verdict(spec_factory, small_search) -> None:
    spec = spec_factory()
    ctx = small_search.ctx
    fleet = small_search.refined[0].refined.serving
    sim._memo.clear()
    ref = simulate_fleet(spec, ctx.mix, fleet, ctx.prices, 0.2, seed=0)
    first = run_fleet(spec, ctx.mix, fleet, ctx.prices, 0.2, seed=0)
    assert first == ref and len(sim._memo) == 1
    again = run_fleet(spec, ctx.mix, fleet, ctx.prices, 0.2, seed=0)
    assert again is first and len(sim._memo) == 1  # served from the memo
    # every input is part of the key: another seed, rate, check, fault or arrival list is a new run
    run_fleet(spec, ctx.mix, fleet, ctx.prices, 0.2, seed=1)
    run_fleet(spec, ctx.mix, fleet, ctx.prices, 0.25, seed=0)
    run_fleet(spec, ctx.mix, fleet, ctx.prices, 0.2, seed=0, check="ttft")
    bigger = fleet.with_replicas(mixed=fleet.pools[0].replicas + 1)
    run_fleet(spec, ctx.mix, bigger, ctx.prices, 0.2, seed=0, faults=crash_scenario(bigger, "mixed", 1))
    reqs = requests_over(ctx.mix, 0.2, 120.0)
    with_reqs = run_fleet(spec, ctx.mix, fleet, ctx.prices, 0.2, seed=0, requests=reqs)
    assert len(sim._memo) == 6
    assert with_reqs == simulate_fleet(spec, ctx.mix, fleet, ctx.prices, 0.2, seed=0, requests=list(reqs))
    assert run_fleet(spec, ctx.mix, fleet, ctx.prices, 0.2, seed=0, requests=list(reqs)) is with_reqs


def test_memo_is_bounded(spec_factory, small_search, monkeypatch) -> None:
    spec, ctx = spec_factory(), small_search.ctx
    fleet = small_search.refined[0].refined.serving
    sim._memo.clear()
    monkeypatch.setattr(sim, "SIM_MEMO_ENTRIES", 2)
    for seed in range(3):
        run_fleet(spec, ctx.mix, fleet, ctx.prices, 0.2, seed=seed)
    assert len(sim._memo) == 2  # the least recently used (seed 0) was dropped


def test_equal_cost_reuses_the_confirmation(small_search) -> None:
    """The colocated side of the equal-cost check is the confirmation (serving fleet, peak rate,
    seed 0): only the PD split is simulated, and the figures are what a fresh run gives."""
    search = copy.copy(small_search)
    ctx = search.ctx
    lay = small_search.refined[0].refined.serving.pools[0].layout
    serving = FleetShape((PoolShape("mixed", lay, 2),))
    confirm = simulate_fleet(ctx.spec, ctx.mix, serving, ctx.prices, ctx.peak_rps, seed=0)
    colo = Candidate("colo", "colocated", serving, {}, [], refined=Refined("colo", serving, serving, confirm=confirm))
    seen: list[list[FleetShape]] = []

    class Counting(Executor):
        def map(self, fn, c, items):  # type: ignore[no-untyped-def]
            seen.append(list(items))
            return super().map(fn, c, items)

    before = search.simulations
    with Counting(1) as ex:
        disaggregation._equal_cost(search, ctx, ex, colo)
    d = search.disaggregation
    assert d["pd_split"] == [1, 1] and len(seen) == 1 and len(seen[0]) == 1 and seen[0][0].disaggregated
    assert search.simulations == before + 1
    assert d["colocated"] == {"slo_attainment": confirm.attainment, "goodput_rps": confirm.goodput_rps,
                              "ttft_p99_s": confirm.ttft["p99"], "tpot_p99_s": confirm.tpot["p99"],
                              "passed": confirm.passed}


@pytest.mark.parametrize(("n", "attainment", "want"), [(200, 0.9, 20), (1000, 0.99, 10), (3, 1.0, 0), (7, 0.9, 0),
                                                       (2400, 0.95, 120), (1, 0.5, 0)])
def test_allowed_misses(n, attainment, want) -> None:
    assert allowed_misses(n, attainment) == want
    assert round((n - want) / n, 9) >= attainment and (want == n or round((n - want - 1) / n, 9) < attainment)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 11, 200, 401, 2400])
@pytest.mark.parametrize("percentile", [50, 90, 99])
def test_needed_for_percentile_holds_the_percentile_whatever_the_rest(n, percentile) -> None:
    """With `needed` values at the target and every other one far above it, the percentile of
    any number m <= n of them (the requests that complete) is still at or under the target."""
    needed = needed_for_percentile(n, percentile)
    for m in range(1, n + 1):
        if m < needed:
            continue
        values = np.array([1.0] * needed + [1e9] * (m - needed))
        assert np.percentile(values, percentile) <= 1.0, (n, m)
    if needed - 2 >= 1 and needed - 2 <= n:  # one fewer than the exact count can fail: the rule is not vacuous
        values = np.array([1.0] * (needed - 2) + [1e9] * (n - needed + 2))
        assert np.percentile(values, percentile) > 1.0


class _Policy:
    wants_kv_events = True

    def __init__(self) -> None:
        self.seen: list[object] = []

    def observe(self, fb) -> None:  # type: ignore[no-untyped-def]
        self.seen.append(fb)

    def observe_twice(self, fb) -> None:  # type: ignore[no-untyped-def]
        self.seen += [fb, fb]


def test_watch_stops_after_the_allowed_misses() -> None:
    policy = _Policy()
    w = VerdictWatch(policy, ttft_s=1.0, tpot_s=0.05, n=30, attainment=0.9, percentile=90)  # 3 misses allowed
    assert w.wants_kv_events is True  # everything else is the policy's
    w.observe(FirstToken(0.5, "a", "r0", 0.9))  # met
    w.observe(FirstToken(1.0, "e", "r0", 1.0))  # exactly the target: met
    w.observe(Completed(3.0, "a", "r0", 11, 0.05, 3.0))  # exactly the TPOT target: not a miss
    w.observe(FirstToken(1.5, "b", "r0", 1.5))
    w.observe(FirstToken(1.6, "b", "r0", 1.6))  # the same request again: counted once
    w.observe(Completed(4.0, "b", "r0", 11, 0.2, 4.0))  # and late twice: still once
    w.observe(Completed(4.5, "c", "r0", 11, 0.06, 4.5))  # TPOT over
    w.observe(FirstToken(2.5, "f", "r0", 1.01))
    with pytest.raises(CertainMiss):
        w.observe(FirstToken(2.5, "d", "r0", 1.01))  # the fourth miss of three allowed
    assert len(policy.seen) == 9  # the policy heard every event, the last one included
    only_ttft = VerdictWatch(_Policy(), ttft_s=1.0, tpot_s=None, n=10, attainment=1.0, percentile=90)
    only_ttft.observe(Completed(4.0, "b", "r0", 11, 9.0, 4.0))  # TPOT not judged: no miss


def test_watch_passes_once_the_rest_cannot_pull_it_below() -> None:
    """n = 10 at 90% attainment and p90: 9 must meet both targets, and 10 TTFT and TPOT values
    (floor(0.9 x 9) + 2 = 10) must be under them for the p90 to hold whatever else happens."""
    w = VerdictWatch(_Policy(), ttft_s=1.0, tpot_s=0.05, n=10, attainment=0.9, percentile=90)
    for i in range(9):
        w.observe(FirstToken(0.1 * i, f"r{i}", "r0", 0.5))
        w.observe(Completed(1 + i, f"r{i}", "r0", 11, 0.04, 1.0))  # met
    w.observe(FirstToken(2.0, "x", "r0", 0.5))
    with pytest.raises(CertainPass):
        w.observe(Completed(20.0, "x", "r0", 11, 0.04, 1.0))
    # a request of one output token meets the SLO but has no TPOT: the p90 of TPOT is not yet certain
    w = VerdictWatch(_Policy(), ttft_s=1.0, tpot_s=0.05, n=10, attainment=0.9, percentile=90)
    for i in range(10):
        w.observe(FirstToken(0.1 * i, f"r{i}", "r0", 0.5))
        w.observe(Completed(1 + i, f"r{i}", "r0", 1 if i == 0 else 11, 0.0 if i == 0 else 0.04, 1.0))
    # a network delay makes a TTFT at the target no longer certain to meet it
    w = VerdictWatch(_Policy(), ttft_s=1.0, tpot_s=None, n=2, attainment=0.5, percentile=50, network_s=0.1)
    for i in range(2):
        w.observe(FirstToken(0.1, f"r{i}", "r0", 0.95))
        w.observe(Completed(1.0, f"r{i}", "r0", 11, 0.04, 1.0))


def _pd_fleet(fleet: FleetShape) -> FleetShape:
    lay = fleet.pools[0].layout
    return FleetShape((PoolShape("prefill", lay, 1), PoolShape("decode", lay, 1)), 50e9)


@pytest.mark.parametrize("lengths", ["fixed", "sharegpt"])
def test_passes_is_the_full_runs_verdict(spec_factory, small_search, lengths, monkeypatch) -> None:
    """The early-stopping verdict equals the full simulation's at rates that pass and that fail,
    colocated and P/D, and some runs do stop early both ways."""
    from fleetwise.planner.workload import build_mix
    from fleetwise.spec.planning import PlanWorkloadSpec

    spec, ctx = spec_factory(), small_search.ctx
    mix = ctx.mix if lengths == "fixed" else build_mix(
        PlanWorkloadSpec.model_validate({"rate_rps": 0.2, "lengths": {"kind": "preset", "name": "sharegpt"}}), 400)
    stops: list[str] = []
    real = VerdictWatch.observe

    def counting(self, fb):  # type: ignore[no-untyped-def]
        try:
            real(self, fb)
        except (CertainMiss, CertainPass) as stop:
            stops.append(type(stop).__name__)
            raise

    monkeypatch.setattr(VerdictWatch, "observe", counting)
    serving = small_search.refined[0].refined.serving
    verdicts = []
    for fleet in (serving, _pd_fleet(serving)):
        for rate in (0.2, 8.0, 30.0, 60.0, 300.0):
            for check in ("both", "ttft", "tpot"):
                sim._memo.clear()
                got = passes(spec, mix, fleet, ctx.prices, rate, seed=0, check=check)
                want = simulate_fleet(spec, mix, fleet, ctx.prices, rate, seed=0, check=check).passed
                assert got == want, (fleet.label, rate, check)
                verdicts.append(got)
    assert True in verdicts and False in verdicts
    assert "CertainPass" in stops and "CertainMiss" in stops


def test_requests_digest_tells_apart_a_change_of_any_field_of_any_request() -> None:
    """The memo key of a caller's arrivals: equal lists give one digest, and a change of any one
    field of one request (a float's last bit, 1 for 1.0, None for 0, a block id) gives another."""
    from dataclasses import fields, replace

    from fleetwise.core.request import Request

    base = [Request(str(i), 0.25 * i, 100 + i, 10 + i, block_hashes=(i, i + 1), session_id=i % 3)
            for i in range(50)]
    d = sim.requests_digest(base)
    assert d == sim.requests_digest([replace(r) for r in base]) and sim.requests_digest(None) is None
    assert sim.requests_digest(base[:-1]) != d and sim.requests_digest(base[::-1]) != d
    changes = {"request_id": "x", "arrival_s": float(np.nextafter(0.25 * 7, 1.0)), "prompt_tokens": 1,
               "output_tokens": 1, "block_hashes": (7, 9), "hash_block_tokens": 32, "tenant": "t",
               "session_id": None, "model_version": "v2", "region": "eu", "max_tokens": 5}
    assert set(changes) == {f.name for f in fields(Request)}  # every field is covered below
    seen = {d}
    for name, value in changes.items():
        reqs = list(base)
        reqs[7] = replace(reqs[7], **{name: value})
        seen.add(sim.requests_digest(reqs))
    assert len(seen) == len(changes) + 1
    # columns that hold the same text or numbers split or typed another way are other columns
    cols = [["ab", "c"], ["a", "bc"], [1, 2], [1.0, 2.0], [1, 2.0], [2**70, 1], [2**70 + 1, 1], [None, None],
            [None, 0], [(1, 2), ()], [(1,), (2,)]]
    assert len({sim._column_bytes(c) for c in cols}) == len(cols)


def test_watch_keeps_the_policy_methods_and_reads_its_other_attributes_live() -> None:
    policy = _Policy()
    w = VerdictWatch(policy, ttft_s=1.0, tpot_s=None, n=10, attainment=0.9, percentile=90)
    policy.level = 1
    assert w.level == 1
    policy.level = 2
    assert w.level == 2  # a plain attribute is read from the policy each time
    route = w.observe_twice
    assert w.observe_twice == route and "observe_twice" in vars(w)  # a method is kept after its first lookup
    w.observe_twice(FirstToken(0.5, "a", "r0", 0.5))
    assert len(policy.seen) == 2


def test_steady_goodput_counts_what_slo_met_counts() -> None:
    """The vectorised count equals `SLOSpec.met` asked request by request (the reference), on a
    seeded overloaded run where each target is missed by a different number of requests."""
    from fleetwise.core.request import Request
    from fleetwise.sim.results import request_metrics
    from fleetwise.sim.runner import SimOptions, simulate
    from fleetwise.spec.plan import PlanSpec
    from fleetwise.spec.slo import SLOSpec

    rng = np.random.default_rng(3)
    n = 300
    t = np.cumsum(rng.exponential(1 / 40.0, n))
    reqs = [Request(str(i), float(t[i]), int(rng.integers(100, 3000)), int(rng.integers(1, 300))) for i in range(n)]
    plan = PlanSpec(name="g", pools=[{"name": "m", "accelerator": "h200-sxm", "model": "llama-3.1-8b", "replicas": 1}])
    rec = simulate(plan, reqs, options=SimOptions(seed=1)).records
    ttft, tpot, e2e, done = request_metrics(rec)
    span = float(t.max() - t.min())
    counts = set()
    for slo in (SLOSpec(ttft_max_s=0.5, tpot_max_s=0.02), SLOSpec(ttft_max_s=2.0), SLOSpec(tpot_max_s=0.015),
                SLOSpec(e2e_max_s=5.0), SLOSpec(ttft_max_s=None, tpot_max_s=None)):
        good = sum(1 for i in range(n) if done[i] and slo.met(ttft[i], tpot[i], e2e[i]))
        assert sim.steady_goodput(rec, slo) == good / n * (n - 1) / span
        counts.add(good)
    assert len(counts) >= 4  # the targets bite differently
