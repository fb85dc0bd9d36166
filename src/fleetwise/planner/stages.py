"""Simulation tasks the pipeline fans out over worker processes (top-level, picklable).

Owns three task kinds, each a pure function of its arguments (seeded, no shared state):
- `measure_goodput`: the effective goodput of one replica of a layout in one role, found by
  bisecting the arrival rate at which the SLO still holds on a sample of the target mix. A
  prefill replica is measured with an oversized decode pool and judged on TTFT only; a decode
  replica with an oversized prefill pool and judged on TPOT only; a mixed replica on both.
- `refine_plan`: confirm (and correct) a sized fleet at peak rate, then simulate it at the
  target rate over several seeds, then with the failure headroom spent (replicas down).
- `check_claims`: the claims a PD plan rests on, each measured in simulation by what it claims.
Does not decide which tasks to run (pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetwise.planner.measure import (
    FleetShape,
    SimVerdict,
    bisect_rate,
    crash_scenario,
    requests_for,
    run_fleet,
)
from fleetwise.planner.workload import LengthMix
from fleetwise.spec.faults import FaultScenario, ReplicaCrash, RollingUpgrade
from fleetwise.spec.planning import PlanningSpec

MAX_CORRECTIONS = 4
STAGE_CHECK = {"mixed": "both", "prefill": "ttft", "decode": "both"}
"""What a stage measurement judges. A decode replica is judged on TPOT *and* TTFT with an
oversized prefill pool: its admission queue (KV landed, waiting for a free slot) is part of
TTFT, and judging TPOT alone lets an overloaded replica pass (its running batch stays fast
while the queue grows without bound)."""


@dataclass(frozen=True)
class Context:
    """What every task needs: the spec, the request mix, prices, the peak rate."""

    spec: PlanningSpec
    mix: LengthMix
    prices: dict[str, float]
    burst: float

    @property
    def peak_rps(self) -> float:
        return self.spec.workload.rate_rps * self.burst


@dataclass(frozen=True)
class MeasureTask:
    """Measure one stage: `fleet` has the measured pool first, at one replica."""

    key: str
    role: str
    fleet: FleetShape
    guess_rps: float
    floor_rps: float = 0.0
    """Slowest useful replica: rate x burst / (most replicas the GPU limit allows)."""


@dataclass(frozen=True)
class MeasureResult:
    key: str
    role: str
    goodput_rps: float
    runs: int


def measure_goodput(ctx: Context, task: MeasureTask) -> MeasureResult:
    """Bisect the rate one replica sustains within the SLO (0 when it never does)."""
    check = STAGE_CHECK[task.role]
    runs = 0

    def ok(rate: float) -> bool:
        nonlocal runs
        runs += 1
        return run_fleet(ctx.spec, ctx.mix, task.fleet, ctx.prices, rate, seed=0, check=check).passed  # type: ignore[arg-type]

    g = bisect_rate(ok, task.guess_rps, ctx.spec.search.bisect_steps, task.floor_rps)
    return MeasureResult(task.key, task.role, g, runs)


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
    _check_headroom(ctx, out)
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


def _check_headroom(ctx: Context, out: Refined) -> None:
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


@dataclass
class Claims:
    """The four claims of a PD plan, each with its evidence; a failed one demotes the plan."""

    results: list[dict[str, object]]
    runs: int

    @property
    def failed(self) -> list[str]:
        return [str(r["claim"]) for r in self.results if not r["holds"]]


APART_TAIL = 1.5
"""With no colocated plan to compare against, decode steps free of prompt chunks show as a
short TPOT tail: p99 within 1.5x of p50 (a prompt chunk in a decode step stretches it several-fold)."""
KV_SHARE = 0.2
"""The KV hand-off's p99 may take at most this share of the TTFT target."""
BALANCE_WAIT_SHARE = 0.25
"""Balanced pools: neither pool's queue (prefill queue, decode admission wait) at the SLO
percentile takes more than this share of the TTFT target at the target rate."""
MIX_SHIFT = 1.25
"""The input/output ratio shift the P:D split must absorb: prompts x1.25 with outputs /1.25, and
the reverse."""


def _shifted(mix: LengthMix, factor: float) -> LengthMix:
    """The mix with prompts scaled by `factor` and outputs by 1/factor (at least one token each)."""
    import numpy as np

    prompt = np.maximum(1, np.rint(mix.prompt * factor)).astype(np.int64)
    output = np.maximum(1, np.rint(mix.output / factor)).astype(np.int64)
    return LengthMix(prompt, output, mix.unit_gaps, f"{mix.source}, prompts x{factor:g}, outputs /{factor:g}")


def check_claims(ctx: Context, full: FleetShape, colocated_tpot_p99_s: float | None,
                 base: SimVerdict) -> Claims:
    """Each claim measured by what it claims: interference removed, KV transfer bounded, pools
    balanced at the target rate and under a shifted input/output ratio, a prefill crash and a
    decode-pool upgrade (version skew: refused hand-offs are prefilled again) survived."""
    slo, rate = ctx.spec.slo, ctx.spec.workload.rate_rps
    key = f"p{slo.percentile}"
    res: list[dict[str, object]] = []
    tail = base.tpot["p99"] / base.tpot["p50"] if base.tpot["p50"] > 0 else 1.0
    if colocated_tpot_p99_s:
        apart = base.tpot["p99"] < colocated_tpot_p99_s
        ev = (f"decode TPOT p99 {base.tpot['p99'] * 1e3:.1f} ms vs {colocated_tpot_p99_s * 1e3:.1f} ms for the "
              f"best colocated plan at the same rate (must be lower: prompt chunks no longer stall decode steps)")
    else:
        apart = tail <= APART_TAIL
        ev = (f"decode TPOT p99/p50 = {base.tpot['p99'] * 1e3:.1f}/{base.tpot['p50'] * 1e3:.1f} ms = {tail:.2f} "
              f"(bound {APART_TAIL:g}: no prompt chunk stretches a decode step; no colocated plan to compare)")
    res.append({"claim": "prefill and decode run apart", "holds": apart, "evidence": ev})
    kv99 = base.kv_transfer.get("p99_s", 0.0)
    res.append({"claim": "KV transfer cost stays bounded", "holds": kv99 <= KV_SHARE * slo.ttft_s,
                "evidence": f"transfer p99 {kv99 * 1e3:.1f} ms = {kv99 / slo.ttft_s:.0%} of the TTFT target "
                            f"(bound: {KV_SHARE:.0%})"})
    runs = 0
    pq, dw = base.waits.get("prefill_queue", 0.0), base.waits.get("decode_wait", 0.0)
    bound = BALANCE_WAIT_SHARE * slo.ttft_s
    util = ", ".join(f"{r} {u:.0%}" for r, u in sorted(base.utilization.items()))
    shifts = []
    for f in (MIX_SHIFT, 1 / MIX_SHIFT):
        v = run_fleet(ctx.spec, _shifted(ctx.mix, f), full, ctx.prices, rate, seed=0)
        runs += 1
        shifts.append((f, v))
    bal = pq <= bound and dw <= bound and all(v.passed for _, v in shifts)
    shift_ev = "; ".join(f"prompts x{f:.2f}/outputs /{f:.2f}: attainment {v.attainment:.1%}, TTFT {key} "
                         f"{v.ttft[key] * 1e3:.0f} ms, TPOT {key} {v.tpot[key] * 1e3:.1f} ms "
                         f"({'meets' if v.passed else 'MISSES'} the SLO)" for f, v in shifts)
    res.append({"claim": "the two pools' queues balance", "holds": bal,
                "evidence": f"at {rate:g} req/s: prefill queue {key} {pq * 1e3:.0f} ms, decode admission wait {key} "
                            f"{dw * 1e3:.0f} ms (each bound {bound * 1e3:.0f} ms = {BALANCE_WAIT_SHARE:.0%} of TTFT), "
                            f"utilisation {util or 'n/a'}; under a shifted input/output ratio: {shift_ev}"})
    for scen, what in _fault_scenarios(ctx, full):
        v = run_fleet(ctx.spec, ctx.mix, full, ctx.prices, rate, seed=1, faults=scen)
        runs += 1
        reasons = ", ".join(f"{k} {n}" for k, n in sorted(v.failure_reasons.items())) or "none"
        res.append({"claim": f"service survives {what}", "holds": v.passed,
                    "evidence": f"attainment {v.attainment:.1%} (required {slo.attainment:.0%}), {v.retried} "
                                f"request(s) routed again, {v.failed} failed ({reasons}), TTFT {key} "
                                f"{v.ttft[key] * 1e3:.0f} ms, TPOT {key} {v.tpot[key] * 1e3:.1f} ms"})
    return Claims(res, runs)


def _fault_scenarios(ctx: Context, full: FleetShape) -> list[tuple[FaultScenario, str]]:
    """The fault claims the headroom policy makes: a crash when it keeps failure spares, version
    skew when it plans rolling upgrades (a plan asked to survive neither claims neither)."""
    rate, h = ctx.spec.workload.rate_rps, ctx.spec.headroom
    span = requests_for(rate, ctx.spec.search.sample_requests) / rate  # the run's traffic, not the whole mix
    at = round(span / 4, 3)
    crash = FaultScenario(name="prefill crash", faults=[ReplicaCrash(
        replica="prefill-0", at_s=at, restart_after_s=ctx.spec.headroom.cold_start_s)])
    skew = FaultScenario(name="decode upgrade", faults=[RollingUpgrade(
        pool="decode", start_s=at, new_model_version="v2", restart_after_s=min(30.0, ctx.spec.headroom.cold_start_s))])
    out = []
    if h.failures_to_survive > 0:
        out.append((crash, f"a prefill replica crash at {at:g} s (restart after {h.cold_start_s:g} s)"))
    if h.upgrade_batch_replicas > 0:
        out.append((skew, "a rolling upgrade of the decode pool (version skew: refused hand-offs prefilled again)"))
    return out
