"""Simulation tasks the pipeline fans out over worker processes (top-level, picklable).

Owns three task kinds, each a pure function of its arguments (seeded, no shared state):
- `measure_goodput`: the effective goodput of one replica of a layout in one role, found by
  bisecting the arrival rate at which the SLO still holds on a sample of the target mix. A
  prefill replica is measured with an oversized decode pool and judged on TTFT only; a decode
  replica with an oversized prefill pool and judged on TPOT only; a mixed replica on both.
- `refine_plan`: confirm (and correct) a sized fleet at peak rate, then simulate it at the
  target rate over several seeds, then with the failure headroom spent (replicas down).
- `check_claims`: the four claims a heterogeneous PD plan rests on, each checked in simulation.
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
    failure_run: SimVerdict | None = None
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
    out.failure_run = _failure_run(ctx, out.full)
    out.runs += 1 if out.failure_run else 0
    return out


def _failure_run(ctx: Context, full: FleetShape) -> SimVerdict | None:
    n = ctx.spec.headroom.failures_to_survive
    if n == 0:
        return None
    pool = max(full.pools, key=lambda p: p.gpus)
    if pool.replicas <= n:
        return None
    scen = crash_scenario(full, pool.role, n)
    return run_fleet(ctx.spec, ctx.mix, full, ctx.prices, ctx.spec.workload.rate_rps, seed=0, faults=scen)


@dataclass
class Claims:
    """The four claims of a heterogeneous PD plan, each with its evidence."""

    results: list[dict[str, object]]
    runs: int


def check_claims(ctx: Context, full: FleetShape, colocated_tpot_p99_s: float | None,
                 base: SimVerdict) -> Claims:
    """Phases apart, KV transfer bounded, pool queues balance, a fault or skew in one pool survived."""
    slo = ctx.spec.slo
    key = f"p{slo.percentile}"
    res: list[dict[str, object]] = []
    ref = f" (best colocated plan: {colocated_tpot_p99_s * 1e3:.1f} ms)" if colocated_tpot_p99_s else ""
    res.append({"claim": "prefill and decode run apart", "holds": base.tpot[key] <= slo.tpot_s,
                "evidence": f"decode TPOT {key} {base.tpot[key] * 1e3:.1f} ms with no prompt chunks in decode "
                            f"steps{ref}; target {slo.tpot_s * 1e3:.0f} ms"})
    kv99 = base.kv_transfer.get("p99_s", 0.0)
    res.append({"claim": "KV transfer cost stays bounded", "holds": kv99 <= 0.2 * slo.ttft_s,
                "evidence": f"transfer p99 {kv99 * 1e3:.1f} ms = {kv99 / slo.ttft_s:.0%} of the TTFT target "
                            "(bound: 20%)"})
    bal = base.ttft[key] <= slo.ttft_s and base.tpot[key] <= slo.tpot_s and base.attainment >= slo.attainment
    res.append({"claim": "the two pools' queues balance", "holds": bal,
                "evidence": f"neither stage is the bottleneck at the target rate: TTFT {key} "
                            f"{base.ttft[key] * 1e3:.0f} ms (prefill queue) and TPOT {key} "
                            f"{base.tpot[key] * 1e3:.1f} ms (decode batch) both within target, attainment "
                            f"{base.attainment:.1%}"})
    runs = 0
    for scen, what in _fault_scenarios(ctx, full):
        v = run_fleet(ctx.spec, ctx.mix, full, ctx.prices, ctx.spec.workload.rate_rps, seed=1, faults=scen)
        runs += 1
        res.append({"claim": f"service survives {what}", "holds": v.attainment >= slo.attainment,
                    "evidence": f"attainment {v.attainment:.1%} (required {slo.attainment:.0%}), "
                                f"{v.failed} request(s) failed, TTFT {key} {v.ttft[key] * 1e3:.0f} ms, "
                                f"TPOT {key} {v.tpot[key] * 1e3:.1f} ms"})
    return Claims(res, runs)


def _fault_scenarios(ctx: Context, full: FleetShape) -> list[tuple[FaultScenario, str]]:
    rate = ctx.spec.workload.rate_rps
    span = requests_for(rate, ctx.spec.search.sample_requests) / rate  # the run's traffic, not the whole mix
    at = round(span / 4, 3)
    crash = FaultScenario(name="prefill crash", faults=[ReplicaCrash(
        replica="prefill-0", at_s=at, restart_after_s=ctx.spec.headroom.cold_start_s)])
    skew = FaultScenario(name="decode upgrade", faults=[RollingUpgrade(
        pool="decode", start_s=at, new_model_version="v2", restart_after_s=min(30.0, ctx.spec.headroom.cold_start_s))])
    return [(crash, f"a prefill replica crash at {at:g} s (restart after {ctx.spec.headroom.cold_start_s:g} s)"),
            (skew, "a rolling upgrade of the decode pool (version skew between pools)")]
