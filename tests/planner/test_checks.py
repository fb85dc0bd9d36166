"""The checks phase simulates headroom terms and claims only for plans that can still be reported:
the pruned search must give the full search's answer, and skip only plans the full search did
not report."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleetwise.planner import checks, disaggregation, fit, goodput, latency, ranking, refinement, sizing
from fleetwise.planner.executor import Executor
from fleetwise.planner.report import to_json
from fleetwise.planner.state import Search
from fleetwise.spec.planning import planning_spec_from_dict

SPEC: dict[str, Any] = {
    "name": "checks-8b", "model": "llama-3.1-8b", "accelerators": [{"name": "h200-sxm"}],
    "workload": {"rate_rps": 2, "prompt_tokens": {"kind": "uniform", "min_tokens": 3000, "max_tokens": 6000},
                 "output_tokens": {"kind": "uniform", "min_tokens": 400, "max_tokens": 800}},
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05, "percentile": 90, "attainment": 0.9},
    "weight_dtypes": ["bf16"],
    "headroom": {"failures_to_survive": 1, "upgrade_batch_replicas": 0, "burst_factor": 1.0, "cold_start_s": 10.0},
    "search": {"max_gpus": 6, "top_k": 1, "refine_top": 2, "seeds": 1, "sample_requests": 50,
               "disaggregation": "auto", "bisect_steps": 2},
}


def _check_everything(cands: list[Any], key: Any, k: int, checked: set[str]) -> list[Any]:
    """The full search: every plan that met the SLO is checked, whatever its bound."""
    return [c for c in cands if c.key not in checked]


def _refined(doc: dict[str, Any]) -> Search:
    """The search up to refinement (`api.plan`'s phases before the checks)."""
    spec = planning_spec_from_dict(doc)
    search = fit.prepare(spec)
    search.top_k = spec.search.top_k
    latency.run(search)
    with Executor(1) as ex:
        goodput.run(search, ex)
        sizing.run(search)
        refinement.run(search, ex)
    return search


def _finish(search: Search, workers: int = 1) -> Search:
    """`api.plan`'s phases from the checks on."""
    with Executor(workers) as ex:
        checks.run(search, ex)
        disaggregation.run(search, ex)
    ranking.run(search)
    return search


@pytest.fixture(scope="module")
def refined() -> Search:
    return _refined(SPEC)


@pytest.mark.slow
def test_pruned_checks_give_the_full_search_answer(refined: Search, monkeypatch: pytest.MonkeyPatch) -> None:
    pruned = _finish(copy.deepcopy(refined))
    with monkeypatch.context() as m:
        m.setattr(checks, "undecided", _check_everything)
        full = _finish(copy.deepcopy(refined))
    a, b = to_json(pruned), to_json(full)
    assert a["plans"] == b["plans"] and a["fleet"] == b["fleet"]
    assert a["disaggregation"] == b["disaggregation"]
    assert not full.unchecked and pruned.unchecked, "the spec must leave some plan unchecked"
    assert pruned.simulations < full.simulations
    full_rank = {c["candidate"]: c["rank"] for c in b["candidates"]}
    for c in a["candidates"]:
        if c["verdict"] == "not_checked":  # skipped only where the full search did not report it
            assert full_rank[c["candidate"]] is None or full_rank[c["candidate"]] > refined.top_k
        elif c["rank"] is not None:  # an exact rank is the full search's rank
            assert c["rank"] == full_rank[c["candidate"]]


@pytest.mark.slow
def test_runs_simulated_ahead_in_workers_give_the_same_checks(refined: Search,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetwise.planner import simulate

    one = _finish(copy.deepcopy(refined))
    simulate._memo.clear()  # the checks must find the workers' verdicts under run_fleet's own keys
    here: list[object] = []
    real = simulate.simulate_fleet
    monkeypatch.setattr(simulate, "simulate_fleet", lambda *a, **k: here.append(a) or real(*a, **k))
    with Executor(2) as ex:
        two = copy.deepcopy(refined)
        checks.run(two, ex)
        in_checks = len(here)
        disaggregation.run(two, ex)
    ranking.run(two)
    assert to_json(one) | {"search": None} == to_json(two) | {"search": None}
    assert one.simulations == two.simulations
    # every run the checks made, a rerun after a term that missed included, was simulated in a
    # worker (ahead, round by round) and found in the memo
    assert in_checks == 0, "a check run was simulated in the planning process"


def _next_runs(ctx, item) -> list:
    """The run checking `item` needs next that the memo lacks (none: every run it makes is there),
    replayed on a copy from the memo alone, and the runs that follow it (`checks._then`): the
    reference for what `_Checks._step` hands the workers."""
    from fleetwise.planner.simulate import NotSimulated, memo_only

    r, colo_tpot, claims = item
    probe = copy.deepcopy(r)
    try:
        with memo_only():
            checks.check_plan(ctx, (probe, colo_tpot, claims))
    except NotSimulated as need:
        return [run for run, _term in checks._then(ctx, need, probe, claims)]
    return []


def test_next_runs_replays_from_the_memo_and_names_the_rerun_after_a_miss(spec_factory) -> None:
    """Two H100 replicas at 14 req/s sized with no failure spare: the failure term misses, so the
    check needs that term again against three replicas. Replayed from the memo with the likely
    runs in it, `next_runs` names exactly that rerun, then nothing; the check then runs from the
    memo alone and gives what the check simulating everything itself gives."""
    from fleetwise.planner import simulate
    from fleetwise.planner.fit import prepare
    from fleetwise.planner.layout import Layout
    from fleetwise.planner.results import Refined
    from fleetwise.planner.simulate import FleetShape, PoolShape, memo_only

    spec = spec_factory(workload={"rate_rps": 14.0, "prompt_tokens": {"kind": "fixed", "tokens": 2048},
                                  "output_tokens": {"kind": "fixed", "tokens": 128}},
                        headroom={"failures_to_survive": 1, "upgrade_batch_replicas": 0, "cold_start_s": 0})
    ctx = prepare(spec).ctx
    full = FleetShape((PoolShape("mixed", Layout("h100-sxm", "bf16", 1), 2),))
    simulate._memo.clear()
    item = (Refined("two", full, full), None, False)
    likely = checks._plan_runs(ctx, full, False)
    assert _next_runs(ctx, item)[0].key(spec, ctx.prices) == likely[0].key(spec, ctx.prices)
    for run in likely:
        run.verdict(spec, ctx.prices)
    (rerun,) = _next_runs(ctx, item)
    assert rerun.fleet.pool("mixed").replicas == 3 and rerun.faults == likely[0].faults
    rerun.verdict(spec, ctx.prices)
    assert _next_runs(ctx, item) == []
    with memo_only():
        from_memo, _ = checks.check_plan(ctx, (copy.deepcopy(item[0]), None, False))
    simulate._memo.clear()
    alone, _ = checks.check_plan(ctx, (copy.deepcopy(item[0]), None, False))
    assert from_memo == alone and from_memo.full.pool("mixed").replicas == 3


@pytest.mark.parametrize("workers", [1, 2])
def test_a_check_stops_where_a_term_that_missed_adds_a_replica(spec_factory, workers: int) -> None:
    """The plan of `test_next_runs_...` (its failure term misses at two replicas): one step runs
    the term, adds the third replica and stops before the rerun, the plan unchecked at the
    larger plan's cost (its bound); the next step completes the check, equal to the check run
    alone, with each run counted once. The same with the runs simulated ahead in workers."""
    from fleetwise.planner import simulate
    from fleetwise.planner.fit import prepare
    from fleetwise.planner.layout import Layout
    from fleetwise.planner.results import Refined
    from fleetwise.planner.simulate import FleetShape, PoolShape, SimVerdict
    from fleetwise.planner.state import Candidate

    spec = spec_factory(workload={"rate_rps": 14.0, "prompt_tokens": {"kind": "fixed", "tokens": 2048},
                                  "output_tokens": {"kind": "fixed", "tokens": 128}},
                        headroom={"failures_to_survive": 1, "upgrade_batch_replicas": 0, "cold_start_s": 0})
    search = prepare(spec)
    full = FleetShape((PoolShape("mixed", Layout("h100-sxm", "bf16", 1), 2),))
    met = SimVerdict(True, 14.0, 0, {}, {}, 1.0, 14.0, 0)
    c = Candidate("two", "colocated", full, {}, [], 6.0, Refined("two", full, full, seeds=[met]))
    search.refined = [c]
    simulate._memo.clear()
    with Executor(workers) as ex:
        ch = checks._Checks(search, ex)
        ch.advance([c], None)
        assert c.refined is not None and c.refined.full.pool("mixed").replicas == 3
        assert (ch.grows, ch.checked, c.cost_per_hour, search.simulations) == ({"two": 1}, set(), 9.0, 1)
        ch.advance([c], None)
    assert ch.checked == {"two"}
    simulate._memo.clear()
    alone, _ = checks.check_plan(search.ctx, (Refined("two", full, full, seeds=[met]), None, False))
    assert c.refined == alone and search.simulations == alone.runs == 2


class _InlineParallel(Executor):
    """A parallel executor that runs its tasks here, costliest first, dropping what `prune` names
    (`Executor.map_pruned` with one worker that is never ahead): deterministic look-ahead."""

    def __init__(self) -> None:
        super().__init__(workers=2)
        self.submitted: list[list[Any]] = []

    def map_pruned(self, fn, ctx, items, cost, prune):  # type: ignore[no-untyped-def]
        out: list[Any] = [None] * len(items)
        waiting = sorted(range(len(items)), key=lambda i: -cost(items[i]))
        self.submitted.append([])
        while waiting:
            i = waiting.pop(0)
            self.submitted[-1].append(items[i])
            out[i] = fn(ctx, items[i])
            dropped = set(prune(i, out[i]))
            waiting = [j for j in waiting if j not in dropped]
        return out


def test_a_plan_looked_ahead_steps_from_the_memo_and_asks_only_for_what_it_lacks(spec_factory) -> None:
    """`advance(cands, ahead=[b])` simulates b's first runs beside the checked plan's. Two H100
    replicas at 14 req/s: one cannot carry the load alone, so b's rolling upgrade misses, and the
    shorter terms after it in b's chain (cold join, burst) are dropped unrun. When b is checked
    next its step starts from the memo: it stops where the upgrade adds a replica without asking
    for anything (those dropped runs, against the plan without that replica, are not needed);
    the next step asks exactly for the rerun chain (`_next_runs`); and b ends as checking it
    alone does."""
    from fleetwise.planner import simulate
    from fleetwise.planner.fit import prepare
    from fleetwise.planner.layout import Layout
    from fleetwise.planner.results import Refined
    from fleetwise.planner.simulate import FleetShape, PoolShape, SimVerdict
    from fleetwise.planner.state import Candidate

    spec = spec_factory(workload={"rate_rps": 14.0, "prompt_tokens": {"kind": "fixed", "tokens": 2048},
                                  "output_tokens": {"kind": "fixed", "tokens": 128}},
                        headroom={"failures_to_survive": 0, "upgrade_batch_replicas": 1, "cold_start_s": 30,
                                  "burst_factor": 1.5, "burst_window_s": 10})
    search = prepare(spec)
    ctx, key = search.ctx, (lambda run: run.key(spec, search.ctx.prices))
    met = SimVerdict(True, 14.0, 0, {}, {}, 1.0, 14.0, 0)
    big = FleetShape((PoolShape("mixed", Layout("h100-sxm", "bf16", 1), 6),))
    two = FleetShape((PoolShape("mixed", Layout("h100-sxm", "bf16", 1), 2),))
    a = Candidate("a", "colocated", big, {}, [], 18.0, Refined("a", big, big, seeds=[met]))
    b = Candidate("b", "colocated", two, {}, [], 6.0, Refined("b", two, two, seeds=[met]))
    search.refined = [a, b]
    simulate._memo.clear()
    ex = _InlineParallel()
    ch = checks._Checks(search, ex)
    ch.advance([a], None, ahead=[b])
    upgrade, *after = checks.runs_ahead(ctx, b)
    ran = {key(run) for run in ex.submitted[0]}
    assert key(upgrade) in ran and after and not ran & {key(run) for run in after}
    assert not upgrade.verdict(spec, ctx.prices).passed
    ex.submitted.clear()
    ch.advance([b], None)
    assert ex.submitted in ([], [[]]) and ch.grows == {"b": 1}
    want = [key(run) for run in _next_runs(ctx, (ch.start["b"], None, False))]
    assert want and not set(want) & {key(run) for run in after}
    ex.submitted.clear()
    while "b" not in ch.checked:
        ch.advance([b], None)
    asked = [key(run) for run in ex.submitted[0]]
    assert len(asked) == len(want) and set(asked) == set(want)
    simulate._memo.clear()
    alone, _ = checks.check_plan(ctx, (Refined("b", two, two, seeds=[met]), None, False))
    assert b.refined is not None and (b.refined.full, b.refined.headroom) == (alone.full, alone.headroom)
