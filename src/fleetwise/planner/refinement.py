"""Phase 5, refinement: the cheapest candidates confirmed, corrected and checked in simulation.

Owns choosing what to refine (cost order; while nothing passes, the next batch), confirming a
sized fleet at peak rate and correcting it where the evidence points, the runs at the target
rate over several seeds (stopping at the first seed that misses: the plan has then failed), and
how each headroom term is simulated in full against the sized plan (a failure and a whole
rolling upgrade per pool, a cold replica joining after its load time, a burst at the workload's
factor, each its own run), adding a replica when one misses. Which plans get their headroom
simulated is the checks phase's choice (`checks`). Does not rank (ranking).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fleetwise.core.request import Request
from fleetwise.planner.executor import Executor
from fleetwise.planner.layout import Rejection
from fleetwise.planner.results import HeadroomCheck, Refined, cold_start_text
from fleetwise.planner.simulate import (
    FleetRun,
    FleetShape,
    SimVerdict,
    burst_requests,
    crash_scenario,
    requests_over,
    run_fleet,
    run_span_s,
)
from fleetwise.planner.sizing import fleet_cost, spares
from fleetwise.planner.state import Candidate, Context, Search
from fleetwise.spec.faults import FaultScenario, ReplicaCrash, RollingUpgrade

MAX_CORRECTIONS = 4


def _role_to_grow(ctx: Context, v: SimVerdict, fleet: FleetShape) -> str:
    """The pool a missed run points to: TPOT -> decode; TTFT -> the pool whose wait is longer."""
    spec, key = ctx.spec, f"p{ctx.spec.slo.percentile}"
    if not fleet.disaggregated:
        return fleet.pools[0].role
    if v.tpot[key] > spec.slo.tpot_s:
        return "decode"
    if v.ttft[key] > spec.slo.ttft_s:
        # TTFT is the prefill queue plus the decode admission wait: add where the wait is.
        return "decode" if v.waits.get("decode_wait", 0.0) > v.waits.get("prefill_queue", 0.0) else "prefill"
    return "prefill" if fleet.pool("prefill").replicas <= fleet.pool("decode").replicas else "decode"


def _correct(ctx: Context, v: SimVerdict, fleet: FleetShape) -> tuple[FleetShape, str] | None:
    """One replica more where the failing target points (TTFT -> prefill, TPOT -> decode)."""
    if not fleet.disaggregated:
        p = fleet.pools[0]
        return fleet.with_replicas(mixed=p.replicas + 1), f"added a mixed replica ({p.replicas} -> {p.replicas + 1})"
    role = _role_to_grow(ctx, v, fleet)
    n = fleet.pool(role).replicas
    return fleet.with_replicas(**{role: n + 1}), f"added a {role} replica ({n} -> {n + 1}) after the check missed"


def _trim(ctx: Context, out: Refined, fleet: FleetShape) -> FleetShape:
    """The P:D ratio moved down as well as up: while a pool of the confirmed P/D fleet (the
    less-utilised first) has a replica to spare and the run at peak still meets the SLO without
    it, drop it (at most MAX_CORRECTIONS corrections in all). Returns the fleet kept."""
    assert out.confirm is not None
    shrunk = True
    while shrunk and fleet.disaggregated and len(out.corrections) < MAX_CORRECTIONS:
        shrunk = False
        util = out.confirm.utilization
        for role in sorted(("prefill", "decode"), key=lambda r: (util.get(r, 1.0), r)):
            n = fleet.pool(role).replicas
            if n <= 1:
                continue
            smaller = fleet.with_replicas(**{role: n - 1})
            v = run_fleet(ctx.spec, ctx.mix, smaller, ctx.prices, ctx.peak_rps, seed=0)
            out.runs += 1
            out.tried.append((smaller, v))
            if v.passed:
                out.corrections.append(f"removed a {role} replica ({n} -> {n - 1}): at {util.get(role, 0.0):.0%} "
                                       "utilisation the run at peak still met the SLO without it")
                fleet, out.confirm, shrunk = smaller, v, True
                break
    return fleet


def refine_plan(ctx: Context, key: str, serving: FleetShape, spare: dict[str, int]) -> Refined:
    """Confirm at peak (correcting up to MAX_CORRECTIONS times), then seeds at the target rate
    until one misses; the headroom terms are `check_headroom`'s."""
    out = Refined(key, serving, serving)
    fleet = serving
    for _ in range(MAX_CORRECTIONS + 1):
        out.confirm = run_fleet(ctx.spec, ctx.mix, fleet, ctx.prices, ctx.peak_rps, seed=0)
        out.runs += 1
        out.tried.append((fleet, out.confirm))
        if out.confirm.passed:
            break
        fix = _correct(ctx, out.confirm, fleet)
        if fix is None or len(out.corrections) == MAX_CORRECTIONS:
            break
        fleet, why = fix
        out.corrections.append(why)
    if out.confirm is not None and out.confirm.passed:
        fleet = _trim(ctx, out, fleet)
    out.serving = fleet
    out.full = fleet.with_replicas(**{p.role: p.replicas + spare.get(p.role, 0) for p in fleet.pools})
    rate = ctx.spec.workload.rate_rps
    for seed in range(ctx.spec.search.seeds):
        out.seeds.append(run_fleet(ctx.spec, ctx.mix, out.full, ctx.prices, rate, seed=seed))
        out.runs += 1
        if not out.seeds[-1].passed:
            break  # the plan has missed the SLO; later seeds cannot change that
    return out


MAX_HEADROOM_ADDS = 2
"""Replicas one headroom check may add to its pool before it is reported as still missing."""


@dataclass(frozen=True)
class HeadroomRun:
    """One headroom term as a simulation: its arrivals (long enough for the whole event) and faults.
    `role` is the pool a miss adds to; None: the pool the missed run points to (a burst)."""

    key: str
    """The term's identity across pool sizes (`failure:<role>`, `upgrade:<role>`, `cold`, `burst`)."""
    term: str
    role: str | None
    requests: list[Request]
    span_s: float
    faults: FaultScenario | None = None


def headroom_runs(ctx: Context, full: FleetShape) -> list[HeadroomRun]:
    """Each headroom term as its own run against the sized plan at the target rate, each long
    enough for the whole event plus a standard run's span S after it:

    - per pool, `failures_to_survive` replicas down for the whole run (S);
    - per pool, a rolling upgrade, `upgrade_batch_replicas` replicas out at a time for a cold start
      each (`cold_start_s` plus the layout's weights load time, `Context.cold_s`)
      (ceil(replicas / batch) x cold start + S); with `failures_during_upgrade`, the last
      `failures_to_survive` replicas it reaches are also down from the start (no restart: the
      upgrade takes each down one at once and brings it back upgraded);
    - a replica of the largest pool joining cold, with an empty cache, after a cold start
      (cold start + S);
    - a burst at the workload's burst factor for `burst_window_s`, between S/2 of the target
      rate before and after (when the factor exceeds 1).
    """
    spec, mix = ctx.spec, ctx.mix
    h, rate = spec.headroom, spec.workload.rate_rps
    span = run_span_s(spec, rate)
    out: list[HeadroomRun] = []

    def over(key: str, term: str, role: str, seconds: float, faults: FaultScenario) -> None:
        out.append(HeadroomRun(key, term, role, requests_over(mix, rate, seconds), seconds, faults))

    for p in full.pools:
        n = h.failures_to_survive
        if n > 0 and p.replicas > n:
            over(f"failure:{p.role}", f"{n} {p.role} replica(s) down for the whole run", p.role, span, crash_scenario(full, p.role, n))
        cold = ctx.cold_s(p.layout)
        b = h.upgrade_batch_replicas
        if b > 0 and p.replicas > 1:
            # failures_during_upgrade: the last replicas the upgrade reaches are down from the start
            down = n if h.failures_during_upgrade and p.replicas > n + 1 else 0
            also = f", {down} {p.role} replica(s) down throughout" if down else ""
            crashes = crash_scenario(full, p.role, down, last=True).faults if down else []
            over(f"upgrade:{p.role}", f"a rolling upgrade of the {p.role} pool ({p.replicas} replicas, "
                 f"{'one' if b == 1 else b} out at a time, {cold:.0f} s each{also})", p.role,
                 math.ceil(p.replicas / b) * cold + span,
                 FaultScenario(name=f"{p.role} upgrade", faults=[RollingUpgrade(
                     pool=p.role, start_s=0.0, new_model_version="v1", restart_after_s=cold, batch=b), *crashes]))
    big = max(full.pools, key=lambda p: p.gpus)
    cold, load = ctx.cold_s(big.layout), ctx.load_s(big.layout)
    if h.cold_start_s > 0 and big.replicas > 1:  # cold_start_s 0: the spec asks for no cold-join check
        total, load_text = cold_start_text(h.cold_start_s, load)
        over("cold", f"a {big.role} replica joining cold (empty cache) after {total} s ({h.cold_start_s:g} s start "
             f"+ {load_text} s reading its weights from storage)", big.role,
             cold + span, FaultScenario(name="cold join", faults=[ReplicaCrash(
                 replica=f"{big.role}-0", at_s=0.0, restart_after_s=cold)]))
    if ctx.burst > 1.0:
        w = h.burst_window_s
        out.append(HeadroomRun(
            "burst", f"a burst of x{ctx.burst:.2f} the target rate for {w:g} s (the workload's burst factor)", None,
            burst_requests(mix, rate, ctx.burst, span / 2, w, span / 2), span + w))
    return out


def headroom_run(ctx: Context, full: FleetShape, run: HeadroomRun) -> FleetRun:
    """The simulation of one headroom term against `full`: the target rate, seed 0."""
    return FleetRun(ctx.mix, full, ctx.spec.workload.rate_rps, 0, run.faults, run.requests)


def check_headroom(ctx: Context, out: Refined, on_grow: Callable[[Refined], None] | None = None) -> None:
    """Simulate each headroom term against the sized plan; a miss adds a replica to its pool and
    the term is run again as it stands for the larger pool (an upgrade of one replica more may
    last one batch's cold start longer). Later terms run against the plan with what earlier ones added.
    `on_grow` hears the plan each time a replica is added, before the rerun (it may raise to stop
    the check there: `checks`)."""
    def sim(run: HeadroomRun) -> SimVerdict:
        out.runs += 1
        return headroom_run(ctx, out.full, run).verdict(ctx.spec, ctx.prices)

    built: dict[FleetShape, list[HeadroomRun]] = {}

    def terms() -> list[HeadroomRun]:
        """The terms of the plan as it stands, built once per shape (each builds its arrivals)."""
        if out.full not in built:
            built[out.full] = headroom_runs(ctx, out.full)
        return built[out.full]

    done: set[str] = set()
    while (run := next((r for r in terms() if r.key not in done), None)) is not None:
        done.add(run.key)
        v = first = sim(run)
        role = run.role or _role_to_grow(ctx, v, out.full)
        added = 0
        while not v.passed and added < MAX_HEADROOM_ADDS:
            out.full = out.full.with_replicas(**{role: out.full.pool(role).replicas + 1})
            added += 1
            if on_grow is not None:
                on_grow(out)
            run = next((r for r in terms() if r.key == run.key), run)
            v = sim(run)
        out.headroom.append(HeadroomCheck(run.term, role, v, added, len(run.requests), run.span_s,
                                          first if added else None))


def _refine_task(ctx: Context, item: tuple[str, FleetShape, dict[str, int]]) -> Refined:
    return refine_plan(ctx, *item)


REFINE_ROUNDS = 3
"""Batches of `refine_top` candidates refined, cheapest first, while none has passed yet."""


def _choose(search: Search, ordered: list[Candidate]) -> list[Candidate]:
    chosen = ordered[: search.spec.search.refine_top]
    for kind in ("colocated", "disaggregated", "heterogeneous"):
        best = next((c for c in ordered if c.kind == kind), None)
        if best is not None and best not in chosen:
            chosen.append(best)
    return chosen


def run(search: Search, ex: Executor) -> None:
    """Refine the cheapest candidates; while none passes, the next `refine_top` (REFINE_ROUNDS batches)."""
    ctx = search.ctx
    ordered = sorted(search.candidates, key=lambda c: (c.cost_per_hour, c.key))
    batch = _choose(search, ordered)
    done: list[Candidate] = []
    for _ in range(REFINE_ROUNDS):
        items = [(c.key, c.fleet, spares(c.sizings)) for c in batch]
        for c, r in zip(batch, ex.map(_refine_task, ctx, items), strict=True):
            c.refined = r
            search.simulations += r.runs
            c.cost_per_hour = fleet_cost(search, r.full, {})  # spares; the headroom checks may add more
        done += batch
        if any(c.refined and c.refined.passed for c in done):
            break
        batch = [c for c in ordered if c not in done][: search.spec.search.refine_top]
        if not batch:
            break
    for c in ordered:
        if c not in done:
            search.rejected.append(Rejection(c.key, f"not refined: ${c.cost_per_hour:.2f}/h is above the "
                                                    f"{len(done)} cheapest candidates refined"))
    search.refined = done
