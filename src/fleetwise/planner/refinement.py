"""Phase 5, refinement: the cheapest candidates confirmed, corrected and checked in simulation.

Owns choosing what to refine (cost order; while nothing passes, the next batch), confirming a
sized fleet at peak rate (the burst term) and correcting it where the evidence points, the runs
at the target rate over several seeds, and each headroom term simulated against the full plan (a
failure and a rolling upgrade per pool, a cold replica joining), adding a replica when one
misses. Does not rank (ranking).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetwise.planner.executor import Executor
from fleetwise.planner.fit import Rejection
from fleetwise.planner.simulate import FleetShape, SimVerdict, crash_scenario, requests_for, run_fleet
from fleetwise.planner.sizing import fleet_cost, spares
from fleetwise.planner.state import Candidate, Context, Search
from fleetwise.spec.faults import FaultScenario, ReplicaCrash, RollingUpgrade

MAX_CORRECTIONS = 4


@dataclass
class Refined:
    """A fleet after confirmation, its seeds at the target rate, and its run with failures spent."""

    key: str
    serving: FleetShape
    full: FleetShape
    corrections: list[str] = field(default_factory=list)
    confirm: SimVerdict | None = None
    seeds: list[SimVerdict] = field(default_factory=list)
    headroom: list[HeadroomCheck] = field(default_factory=list)
    """Each headroom term simulated against the sized plan (and what was added when one missed)."""
    runs: int = 0
    tried: list[tuple[FleetShape, SimVerdict]] = field(default_factory=list)
    """Each fleet the confirmation ran at peak rate, in order (the P:D ratios tried, for PD plans)."""

    @property
    def passed(self) -> bool:
        return bool(self.seeds) and all(v.passed for v in self.seeds)


def _correct(ctx: Context, v: SimVerdict, fleet: FleetShape) -> tuple[FleetShape, str] | None:
    """One replica more where the failing target points (TTFT -> prefill, TPOT -> decode)."""
    spec, key = ctx.spec, f"p{ctx.spec.slo.percentile}"
    if not fleet.disaggregated:
        p = fleet.pools[0]
        return fleet.with_replicas(mixed=p.replicas + 1), f"added a mixed replica ({p.replicas} -> {p.replicas + 1})"
    if v.tpot[key] > spec.slo.tpot_s:
        role = "decode"
    elif v.ttft[key] > spec.slo.ttft_s:
        # TTFT is the prefill queue plus the decode admission wait: add where the wait is.
        role = "decode" if v.waits.get("decode_wait", 0.0) > v.waits.get("prefill_queue", 0.0) else "prefill"
    else:
        role = "prefill" if fleet.pool("prefill").replicas <= fleet.pool("decode").replicas else "decode"
    n = fleet.pool(role).replicas
    return fleet.with_replicas(**{role: n + 1}), f"added a {role} replica ({n} -> {n + 1}) after the check missed"


def refine_plan(ctx: Context, key: str, serving: FleetShape, spare: dict[str, int]) -> Refined:
    """Confirm at peak (correcting up to MAX_CORRECTIONS times), then seeds at the target rate, then failures."""
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
    out.serving = fleet
    out.full = fleet.with_replicas(**{p.role: p.replicas + spare.get(p.role, 0) for p in fleet.pools})
    rate = ctx.spec.workload.rate_rps
    for seed in range(ctx.spec.search.seeds):
        out.seeds.append(run_fleet(ctx.spec, ctx.mix, out.full, ctx.prices, rate, seed=seed))
        out.runs += 1
    check_headroom(ctx, out)
    return out


MAX_HEADROOM_ADDS = 2
"""Replicas one headroom check may add to its pool before it is reported as still missing."""


@dataclass
class HeadroomCheck:
    """One headroom term simulated at the target rate against the full plan."""

    term: str
    role: str
    verdict: SimVerdict
    added: int = 0

    def line(self, pct: int, slo_ttft_s: float, slo_tpot_s: float) -> str:
        v, k = self.verdict, f"p{pct}"
        fix = (f"; missed first, so {self.added} {self.role} replica(s) were added" if self.added and v.passed else
               f"; STILL MISSES after adding {self.added} {self.role} replica(s)" if self.added else "")
        return (f"headroom checked in simulation: {self.term}: attainment {v.attainment:.1%}, TTFT {k} "
                f"{v.ttft[k] * 1e3:.0f} ms (target {slo_ttft_s * 1e3:.0f}), TPOT {k} {v.tpot[k] * 1e3:.1f} ms "
                f"(target {slo_tpot_s * 1e3:.0f}) -> {'holds' if v.passed else 'misses'}{fix}")


def _headroom_scenarios(ctx: Context, full: FleetShape) -> list[tuple[str, str, FaultScenario]]:
    """(term, pool, faults): a failure in each pool, a rolling upgrade of each pool, a cold replica
    joining the largest pool. The burst term is the confirmation at peak rate (`refine_plan`)."""
    h, rate = ctx.spec.headroom, ctx.spec.workload.rate_rps
    span = requests_for(rate, ctx.spec.search.sample_requests) / rate
    out: list[tuple[str, str, FaultScenario]] = []
    for p in full.pools:
        n = h.failures_to_survive
        if n > 0 and p.replicas > n:
            out.append((f"{n} {p.role} replica(s) down for the whole run", p.role, crash_scenario(full, p.role, n)))
        if h.upgrade_batch_replicas > 0 and p.replicas > 1:
            out.append((f"a rolling upgrade of the {p.role} pool (one replica out at a time, {h.cold_start_s:g} s "
                        "each)", p.role, FaultScenario(name=f"{p.role} upgrade", faults=[RollingUpgrade(
                            pool=p.role, start_s=0.0, new_model_version="v1", restart_after_s=h.cold_start_s)])))
    big = max(full.pools, key=lambda p: p.gpus)
    if h.cold_start_s > 0 and big.replicas > 1:
        back = round(min(h.cold_start_s, span / 2), 3)
        out.append((f"a {big.role} replica joining cold (empty cache) after {back:g} s of loading"
                    f"{'' if back == h.cold_start_s else f' (cold_start_s {h.cold_start_s:g} s, cut to half the run)'}",
                    big.role, FaultScenario(name="cold join", faults=[ReplicaCrash(
                        replica=f"{big.role}-0", at_s=0.0, restart_after_s=back)])))
    return out


def check_headroom(ctx: Context, out: Refined) -> None:
    """Simulate each headroom term against the sized plan; a miss adds a replica to its pool."""
    rate = ctx.spec.workload.rate_rps
    for term, role, scen in _headroom_scenarios(ctx, out.full):
        v = run_fleet(ctx.spec, ctx.mix, out.full, ctx.prices, rate, seed=0, faults=scen)
        out.runs += 1
        check = HeadroomCheck(term, role, v)
        while not check.verdict.passed and check.added < MAX_HEADROOM_ADDS:
            n = out.full.pool(role).replicas
            out.full = out.full.with_replicas(**{role: n + 1})
            check.added += 1
            check.verdict = run_fleet(ctx.spec, ctx.mix, out.full, ctx.prices, rate, seed=0, faults=scen)
            out.runs += 1
        out.headroom.append(check)


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
            c.cost_per_hour = fleet_cost(search, r.full, {})  # spares, and what the headroom checks added
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
