"""Phase 5b, checks: headroom terms and P/D claims simulated only where they can change the answer.

Owns which refined plans that met the SLO get their headroom terms simulated
(`refinement.check_headroom`, which may add replicas) and, for P/D plans, their claims
(`disaggregation.check_claims`, which may demote), and in what order. Both only ever move a plan
down: its final `ranking.rank_key` (demoted, $/h, -goodput, name) is never below the key it has
before them (not demoted, the $/h of its serving replicas plus spares, the same goodput and
name). So plans are checked in waves, each wave's runs in parallel: a wave takes every
unchecked plan that is still among the first `top_k` of the order that uses each checked plan's
final key and each unchecked plan's lower bound (it could still be reported); likewise the
cheapest colocated plan (the equal-cost verdict's reference, whose TPOT every claim quotes),
settled before any claim runs; and, when a colocated plan ranks first, the cheapest P/D plan
(the verdict sentence names it). What is left unchecked could not have been reported whatever
its checks gave, ranks nowhere and says so (`not_checked`). Does not rank (ranking).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial
from typing import Any

from fleetwise.planner.disaggregation import check_claims, claim_runs, reference_colocated
from fleetwise.planner.executor import Executor
from fleetwise.planner.layout import Rejection
from fleetwise.planner.ranking import rank_key
from fleetwise.planner.refinement import check_headroom, headroom_run, headroom_runs
from fleetwise.planner.results import Claims, Refined
from fleetwise.planner.simulate import FleetRun, FleetShape, NotSimulated, SimVerdict, memo_only, requests_for
from fleetwise.planner.sizing import fleet_cost, over_limits
from fleetwise.planner.state import Candidate, Context, Search
from fleetwise.spec.planning import PlanningSpec

MAX_AHEAD_ROUNDS = 8
"""Rounds of runs simulated ahead per wave (the likely runs, then each round what the checks
replayed from the memo need next); whatever is still missing after them is simulated while the
checks run here."""

CheckItem = tuple[Refined, float | None, bool]
"""What a check task gets: the refined plan, the reference colocated TPOT p99, whether to check claims."""


def check_plan(ctx: Context, item: CheckItem) -> tuple[Refined, Claims | None]:
    """A refined plan's headroom terms (the plan as they leave it) and, when asked, its P/D claims."""
    r, colo_tpot, claims = item
    check_headroom(ctx, r)
    return r, (check_claims(ctx, r.full, colo_tpot, r.seeds[0]) if claims else None)


def _simulate(ctx: Context, run: FleetRun) -> SimVerdict:
    return run.verdict(ctx.spec, ctx.prices)


def _requests(spec: PlanningSpec, run: FleetRun) -> float:
    """A run's relative cost for handing out work: its requests (a standard run's at its rate)."""
    return float(len(run.requests) if run.requests is not None else requests_for(run.rate_rps, spec.search.sample_requests))


def runs_ahead(ctx: Context, c: Candidate) -> list[FleetRun]:
    """The runs checking `c` starts with: each headroom term against the plan as refined. Its
    P/D claims run against the plan as the terms leave it, so they are simulated ahead only once
    the terms have run (`next_runs`), not on the guess that no term misses (a term that misses
    on the built-in question's two P/D plans left their four claim runs each wasted)."""
    assert c.refined is not None
    return _plan_runs(ctx, c.refined.full, False)


def _plan_runs(ctx: Context, full: FleetShape, claims: bool) -> list[FleetRun]:
    return [headroom_run(ctx, full, t) for t in headroom_runs(ctx, full)] + (claim_runs(ctx, full) if claims else [])


def next_runs(ctx: Context, item: CheckItem) -> list[FleetRun]:
    """The run checking `item` needs next that the memo lacks (none: every run it makes is
    there), replayed on a copy from the memo alone, and after it the runs the rest of the check
    makes if that run passes: the later terms and the claims against the plan as it then stands."""
    r, colo_tpot, claims = item
    probe = copy.deepcopy(r)
    try:
        with memo_only():
            check_plan(ctx, (probe, colo_tpot, claims))
    except NotSimulated as need:
        later = _plan_runs(ctx, probe.full, claims)
        want = need.run.key(ctx.spec, ctx.prices)
        at = next((i for i, run in enumerate(later) if run.key(ctx.spec, ctx.prices) == want), len(later))
        return [need.run, *later[at + 1:]]
    return []


def undecided(cands: list[Candidate], key: Callable[[Candidate], Any], k: int,
              checked: set[str]) -> list[Candidate]:
    """The unchecked candidates among the first `k` by `key` (each a final value once checked, a
    lower bound before): the ones that may still take one of those `k` places."""
    return [c for c in sorted(cands, key=key)[:k] if c.key not in checked]


class _Checks:
    """The checks phase's bookkeeping: which plans are checked, and each wave run."""

    def __init__(self, search: Search, ex: Executor) -> None:
        self.search, self.ex = search, ex
        self.passed = [c for c in search.refined if c.refined is not None and c.refined.passed]
        self.order = {c.key: i for i, c in enumerate(search.refined)}
        self.checked: set[str] = set()

    def wave(self, cands: list[Candidate], colo_tpot: float | None) -> None:
        """Check `cands`: with parallel workers, their headroom terms are simulated ahead, one task
        per run, into this process's memo, then round by round what the checks replayed from the
        memo need next (`next_runs`: a term rerun against the larger plan, the claims), and the
        checks themselves then run here from the memo; else one task per plan."""
        ctx = self.search.ctx
        items = [(c.refined, colo_tpot, c.kind != "colocated") for c in cands if c.refined is not None]
        before = [r.runs for r, _, _ in items]
        if self.ex.parallel:
            ahead = [run for c in cands for run in runs_ahead(ctx, c)]
            open_items = list(items)
            for _ in range(MAX_AHEAD_ROUNDS):
                if not self._simulate_ahead(ahead):
                    break
                needs = [(it, next_runs(ctx, it)) for it in open_items]
                open_items = [it for it, need in needs if need]  # a plan needing nothing is complete
                ahead = [run for _, need in needs for run in need]
            done = [check_plan(ctx, it) for it in items]
        else:
            done = self.ex.map(check_plan, ctx, items)
        for c, n, (r, claims) in zip(cands, before, done, strict=True):
            self.search.simulations += r.runs - n + (claims.runs if claims else 0)
            c.refined, c.claims = r, claims
            c.cost_per_hour = fleet_cost(self.search, r.full, {})  # with what the headroom checks added
            self.checked.add(c.key)

    def _simulate_ahead(self, runs: list[FleetRun]) -> bool:
        """Simulate the runs the memo lacks (each once), one task each, costliest first, into the
        memo; False when there was none."""
        ctx, todo, seen = self.search.ctx, [], set()
        for run in runs:
            key = run.key(ctx.spec, ctx.prices)
            if key not in seen and not run.in_memo(ctx.spec, ctx.prices):
                seen.add(key)
                todo.append(run)
        for run, v in zip(todo, self.ex.map(_simulate, ctx, todo, cost=partial(_requests, ctx.spec)), strict=True):
            run.remember(ctx.spec, ctx.prices, v)
        return bool(todo)

    def colocated_undecided(self) -> list[Candidate]:
        """The cheapest colocated plan, as `disaggregation.reference_colocated` picks it."""
        colo = [c for c in self.passed if c.kind == "colocated"]
        return undecided(colo, lambda c: (c.cost_per_hour, self.order[c.key]), 1, self.checked)

    def eligible(self) -> list[Candidate]:
        """Plans the ranking may list: met the SLO, within the GPU limits (an unchecked plan's
        limits can only be exceeded further by its checks)."""
        return [c for c in self.passed if c.refined is not None and over_limits(self.search, c.refined.full, {}) is None]

    def ranking_undecided(self) -> list[Candidate]:
        """The reported plans, then, when a colocated plan is first, the cheapest P/D plan."""
        plans = self.eligible()
        need = undecided(plans, rank_key, self.search.top_k, self.checked)
        if need or not plans or min(plans, key=rank_key).kind != "colocated":
            return need
        split = [c for c in plans if c.kind != "colocated"]
        return undecided(split, lambda c: (c.cost_per_hour, *rank_key(c)), 1, self.checked)


def run(search: Search, ex: Executor) -> None:
    """Check, wave by wave, the plans that may still be reported or quoted; list the rest as unchecked."""
    ch = _Checks(search, ex)
    while need := ch.colocated_undecided():
        need += [c for c in ch.ranking_undecided() if c.kind == "colocated" and c not in need]
        ch.wave(need, None)
    colo = reference_colocated(search)
    colo_tpot = colo.refined.seeds[0].tpot["p99"] if colo and colo.refined else None
    while need := ch.ranking_undecided():
        ch.wave(need, colo_tpot)
    search.unchecked = [c for c in ch.passed if c.key not in ch.checked]
    for c in search.unchecked:
        what = "headroom terms and claims" if c.kind != "colocated" else "headroom terms"
        search.rejected.append(Rejection(c.key, (
            f"not checked: meets the SLO at the target rate, but at ${c.cost_per_hour:.2f}/h before its headroom "
            f"terms it ranks below the {search.top_k} plans reported whatever they add; its {what} were not "
            "simulated")))
