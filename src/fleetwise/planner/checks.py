"""Phase 5b, checks: headroom terms and P/D claims simulated only where they can change the answer.

Owns which refined plans that met the SLO get their headroom terms simulated
(`refinement.check_headroom`, which may add replicas) and, for P/D plans, their claims
(`disaggregation.check_claims`, which may demote), and in what order. Both only ever move a plan
down: its final `ranking.rank_key` (demoted, $/h, -goodput, name) is never below the key it has
before them (not demoted, the $/h of its serving replicas plus spares, the same goodput and
name), nor below the key it has when a term that missed has added replicas (their cost
included). So plans are checked in steps, each step's runs in parallel: a step takes every
unchecked plan that is still among the first `top_k` of the order that uses each checked plan's
final key and each unchecked plan's lower bound (it could still be reported), and runs its
checks until they complete or a term that missed adds a replica (the bound rises; a plan that
then falls out of the first `top_k` is not checked further, `_Checks.advance`); likewise the
cheapest colocated plan (the equal-cost verdict's reference, whose TPOT every claim quotes),
settled before any claim runs; and, when a colocated plan ranks first, the cheapest P/D plan
(the verdict sentence names it). What is left unchecked could not have been reported whatever
its checks gave, ranks nowhere and says so (`not_checked`). Does not rank (ranking).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import nullcontext
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

CheckItem = tuple[Refined, float | None, bool]
"""What a check task gets: the refined plan, the reference colocated TPOT p99, whether to check claims."""


class Grown(Exception):
    """A check stopped where a headroom term that missed added a replica (`stop_after`)."""


def stop_after(grows: int) -> Callable[[Refined], None]:
    """An `on_grow` for `check_headroom` that lets the first `grows` replicas added pass and stops
    the check (`Grown`) when the next is added, before its rerun."""
    seen = 0

    def hook(_r: Refined) -> None:
        nonlocal seen
        seen += 1
        if seen > grows:
            raise Grown

    return hook


def check_plan(ctx: Context, item: CheckItem,
               on_grow: Callable[[Refined], None] | None = None) -> tuple[Refined, Claims | None]:
    """A refined plan's headroom terms (the plan as they leave it) and, when asked, its P/D claims."""
    r, colo_tpot, claims = item
    check_headroom(ctx, r, on_grow)
    return r, (check_claims(ctx, r.full, colo_tpot, r.seeds[0]) if claims else None)


def _simulate(ctx: Context, run: FleetRun) -> SimVerdict:
    return run.verdict(ctx.spec, ctx.prices)


def _requests(spec: PlanningSpec, run: FleetRun) -> float:
    """A run's relative cost for handing out work: its requests (a standard run's at its rate)."""
    return float(len(run.requests) if run.requests is not None else requests_for(run.rate_rps, spec.search.sample_requests))


def runs_ahead(ctx: Context, c: Candidate) -> list[FleetRun]:
    """The runs checking `c` starts with: each headroom term against the plan as refined. Its
    P/D claims run against the plan as the terms leave it, so they are simulated ahead only once
    the terms have run (`_then`), not on the guess that no term misses (a term that misses
    on the built-in question's two P/D plans left their four claim runs each wasted)."""
    assert c.refined is not None
    return _plan_runs(ctx, c.refined.full, False)


def _plan_runs(ctx: Context, full: FleetShape, claims: bool) -> list[FleetRun]:
    return [headroom_run(ctx, full, t) for t in headroom_runs(ctx, full)] + (claim_runs(ctx, full) if claims else [])


Chain = list[tuple[FleetRun, bool]]
"""Runs of one plan's check in the order it makes them, each with whether it is a headroom term
(a term that misses adds a replica, so the runs after it in the chain are then not needed)."""


def _then(ctx: Context, need: NotSimulated, probe: Refined, claims: bool) -> Chain:
    """The run a replayed check lacked, and after it the runs the rest of the check makes if
    that run passes: the later terms and the claims against the plan as it then stands."""
    terms = len(headroom_runs(ctx, probe.full))
    later = _plan_runs(ctx, probe.full, claims)
    want = need.run.key(ctx.spec, ctx.prices)
    at = next((i for i, run in enumerate(later) if run.key(ctx.spec, ctx.prices) == want), len(later))
    return [(need.run, at < terms), *((run, i < terms) for i, run in enumerate(later) if i > at)]


def undecided(cands: list[Candidate], key: Callable[[Candidate], Any], k: int,
              checked: set[str]) -> list[Candidate]:
    """The unchecked candidates among the first `k` by `key` (each a final value once checked, a
    lower bound before): the ones that may still take one of those `k` places."""
    return [c for c in sorted(cands, key=key)[:k] if c.key not in checked]


class _Checks:
    """The checks phase's bookkeeping: which plans are checked, how far each unfinished check
    has got, and each step run."""

    def __init__(self, search: Search, ex: Executor) -> None:
        self.search, self.ex = search, ex
        self.passed = [c for c in search.refined if c.refined is not None and c.refined.passed]
        self.order = {c.key: i for i, c in enumerate(search.refined)}
        self.checked: set[str] = set()
        self.start: dict[str, Refined] = {}
        """Each plan as refined, before its checks: every step replays the check from it."""
        self.grows: dict[str, int] = {}
        """Replicas a plan's headroom terms have added in the steps so far."""
        self.counted: dict[str, int] = {}
        """Check runs of a plan already in `search.simulations`."""
        self.ahead: set[str] = set()
        """Plans whose first runs (`runs_ahead`) have been simulated ahead."""

    def advance(self, cands: list[Candidate], colo_tpot: float | None, ahead: list[Candidate] | None = None) -> None:
        """Take each plan of `cands` to its next stop: its checks complete (it is checked), or a
        headroom term misses and adds a replica (its cost, still a lower bound of its final cost,
        rises, and the caller decides again whether it may still be reported). With parallel
        workers the runs are simulated ahead, one task per run, into this process's memo, all in
        one batch: the headroom terms of each plan not started (of `cands`, and of `ahead`, plans
        the next call is to check, so no worker waits for a long term while another has work),
        and what each started plan's step, replayed from the memo alone, lacks (`_then`); then,
        round by round, what the steps still lack. Else each step simulates as it goes. Either
        way a step stops at the same place, so the answer does not depend on the workers."""
        ctx = self.search.ctx
        fresh = [c for c in cands if c.key not in self.start]
        for c in fresh:
            assert c.refined is not None
            self.start[c.key] = c.refined
        if not self.ex.parallel:
            self.ex.map(lambda _ctx, c: self._step(c, colo_tpot), ctx, cands)
            return
        # A plan whose first runs were simulated ahead by an earlier call steps from the memo at
        # once: its runs after a term that missed there were dropped and are not needed.
        new = [c for c in fresh if c.key not in self.ahead]
        later = [c for c in ahead or [] if c.key not in self.start and c.key not in self.ahead]
        self.ahead.update(c.key for c in new + later)
        started = [(c, self._step(c, colo_tpot)) for c in cands if c not in new]
        self._simulate_ahead([[(run, True) for run in runs_ahead(ctx, c)] for c in new + later]
                             + [need for _, need in started if need])
        todo = new + [c for c, need in started if need]
        while todo:
            needs = [(c, self._step(c, colo_tpot)) for c in todo]
            todo = [c for c, need in needs if need]
            self._simulate_ahead([need for _, need in needs if need])

    def _step(self, c: Candidate, colo_tpot: float | None) -> Chain:
        """Replay `c`'s check from the plan as refined up to its next stop (`advance`) and keep
        what it found; with parallel workers from the memo alone, returning the runs it lacks."""
        probe = copy.deepcopy(self.start[c.key])
        claims = c.kind != "colocated"
        try:
            with memo_only() if self.ex.parallel else nullcontext():
                r, cl = check_plan(self.search.ctx, (probe, colo_tpot, claims), stop_after(self.grows.get(c.key, 0)))
        except NotSimulated as need:
            return _then(self.search.ctx, need, probe, claims)
        except Grown:
            self.grows[c.key] = self.grows.get(c.key, 0) + 1
            r, cl = probe, None
        else:
            self.checked.add(c.key)
        runs = r.runs - self.start[c.key].runs + (cl.runs if cl else 0)
        self.search.simulations += runs - self.counted.get(c.key, 0)
        self.counted[c.key] = runs
        c.refined, c.claims = r, cl
        c.cost_per_hour = fleet_cost(self.search, r.full, {})  # with what the headroom checks added
        return []

    def _simulate_ahead(self, chains: list[Chain]) -> None:
        """Simulate the runs of `chains` the memo lacks (each once), one task each, costliest
        first, into the memo. A headroom term that misses adds a replica, so the runs after it
        in its chain, against the plan without it, are dropped if no worker has taken them yet
        (`Executor.map_pruned`); a step that needs one of them again names it."""
        ctx, todo, seen = self.search.ctx, [], set()
        where: list[tuple[int, int, bool]] = []
        """(chain, place in it, headroom term) per run in `todo`."""
        places = sorted(((at, n) for n, chain in enumerate(chains) for at in range(len(chain))))
        for at, n in places:  # each chain's first run (the one its step lacks) belongs to that chain
            run, term = chains[n][at]
            key = run.key(ctx.spec, ctx.prices)
            if key not in seen and not run.in_memo(ctx.spec, ctx.prices):
                seen.add(key)
                todo.append(run)
                where.append((n, at, term))

        def after_miss(i: int, v: SimVerdict) -> list[int]:
            n, at, term = where[i]
            return [j for j, (m, later, _) in enumerate(where) if m == n and later > at] if term and not v.passed else []

        done = self.ex.map_pruned(_simulate, ctx, todo, partial(_requests, ctx.spec), after_miss)
        for run, v in zip(todo, done, strict=True):
            if v is not None:
                run.remember(ctx.spec, ctx.prices, v)

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
    """Check, step by step, the plans that may still be reported or quoted; list the rest as unchecked."""
    ch = _Checks(search, ex)
    while need := ch.colocated_undecided():
        ranking = ch.ranking_undecided()
        need += [c for c in ranking if c.kind == "colocated" and c not in need]
        ch.advance(need, None, ahead=[c for c in ranking if c.kind != "colocated"])
    colo = reference_colocated(search)
    colo_tpot = colo.refined.seeds[0].tpot["p99"] if colo and colo.refined else None
    while need := ch.ranking_undecided():
        ch.advance(need, colo_tpot)
    search.unchecked = [c for c in ch.passed if c.key not in ch.checked]
    for c in search.unchecked:
        what = "headroom terms and claims" if c.kind != "colocated" else "headroom terms"
        added = ch.grows.get(c.key, 0)
        why = (f"at ${c.cost_per_hour:.2f}/h before its headroom terms it ranks below the {search.top_k} plans "
               f"reported whatever they add; its {what} were not simulated") if not added else (
               f"at ${c.cost_per_hour:.2f}/h with the {added} replica(s) its headroom terms added so far it ranks "
               f"below the {search.top_k} plans reported whatever the rest add; its other {what} were not simulated")
        search.rejected.append(Rejection(c.key, f"not checked: meets the SLO at the target rate, but {why}"))
