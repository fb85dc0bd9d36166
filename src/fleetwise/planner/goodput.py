"""Phase 3, effective goodput: what one replica of a layout sustains within the SLO.

Owns which layouts are measured per role (colocated ones must meet both targets; a prefill pool
only TTFT, a decode pool TPOT and its admission queue), the measurement task itself (bisecting
the arrival rate in the simulator on a sample of the target mix; a prefill replica with an
oversized decode pool, a decode replica with an oversized prefill pool), and load tests from the
spec (`loadtest`), which replace the simulated figure of their layout. Does not size (sizing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

from fleetwise.planner.executor import Executor
from fleetwise.planner.layout import Layout, Rejection, kv_link
from fleetwise.planner.loadtest import load_measurement
from fleetwise.planner.results import LayoutEstimate, Sizing, size_pool
from fleetwise.planner.simulate import FleetShape, PoolShape, bisect_rate, passes, requests_for
from fleetwise.planner.state import Context, Search
from fleetwise.spec.planning import PlanningSpec

STAGE_CHECK = {"mixed": "both", "prefill": "ttft", "decode": "both"}
"""What a stage measurement judges. A decode replica is judged on TPOT *and* TTFT with an
oversized prefill pool: its admission queue (KV landed, waiting for a free slot) is part of
TTFT, and judging TPOT alone lets an overloaded replica pass (its running batch stays fast
while the queue grows without bound)."""


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
    low_passed: bool | None = None
    """When the replica missed at its floor rate: whether it met the SLO at `LOW_PROBE_SHARE` of it."""


LOW_PROBE_SHARE = 0.1
"""A replica that misses the SLO at its floor rate is tried once more at this share of it: if it
misses there too, its latency misses, not its capacity, and more GPUs (a lower floor) cannot help."""


def measure_goodput(ctx: Context, task: MeasureTask) -> MeasureResult:
    """Bisect the rate one replica sustains within the SLO (0 when it never does)."""
    check = STAGE_CHECK[task.role]
    runs = 0

    def ok(rate: float) -> bool:
        nonlocal runs
        runs += 1
        return passes(ctx.spec, ctx.mix, task.fleet, ctx.prices, rate, seed=0, check=check)  # type: ignore[arg-type]

    g = bisect_rate(ok, task.guess_rps, ctx.spec.search.bisect_steps, task.floor_rps)
    low = ok(task.floor_rps * LOW_PROBE_SHARE) if g <= 0 < task.floor_rps else None
    return MeasureResult(task.key, task.role, g, runs, low)


STAGE_SHORTLIST = 3  # prefill and decode layouts measured per stage
MIXED_GUESS_DECODE_SHARE = 0.25
"""First rate tried for a mixed layout without an analytical mixed capacity, as a share of its
decode capacity (a rough start; the bisection measures the real goodput)."""


def _cost_rate(search: Search, lay: Layout, mu: float) -> float:
    return search.hw.price(lay.accelerator) * lay.gpus / mu if mu > 0 else math.inf


def analytical_sizing(search: Search, e: LayoutEstimate) -> Sizing:
    """The colocated replicas a layout needs at the target rate by its analytical capacity
    (`mu_mixed_rps` > 0): serving replicas for rate x burst plus the headroom spares."""
    return size_pool("mixed", e.mu_mixed_rps, search.spec.workload.rate_rps, search.burst, search.spec.headroom,
                     search.ctx.load_s(e.layout))


def _fleet_cost(search: Search, e: LayoutEstimate) -> float:
    """$/h of `analytical_sizing`'s fleet. At a low rate whole replicas and spares dominate, so the
    cost per req/s alone ranks a big fast layout ahead of a small one that needs no more replicas
    and costs less: the layout with the cheapest such fleet is simulated too."""
    return search.hw.price(e.layout.accelerator) * e.layout.gpus * analytical_sizing(search, e).total


def _shortlists(search: Search) -> dict[str, list[Layout]]:
    """Layouts to simulate per role: colocated ones must meet both targets; a prefill pool only
    the TTFT target and a decode pool only the TPOT target (each phase runs apart)."""
    est = list(search.estimates.values())
    ok = [e for e in est if e.latency_ok]
    mode = search.spec.search.disaggregation
    lists: dict[str, list[Layout]] = {"mixed": [], "prefill": [], "decode": []}
    if mode != "only":
        by = sorted((e for e in ok if e.mu_mixed_rps > 0), key=lambda e: _cost_rate(search, e.layout, e.mu_mixed_rps))
        k = search.spec.search.refine_top
        chosen = by[:k]
        fleet = min(by, key=lambda e: (_fleet_cost(search, e), _cost_rate(search, e.layout, e.mu_mixed_rps)), default=None)
        if fleet is not None and fleet not in chosen:
            chosen.append(fleet)
        lists["mixed"] = [e.layout for e in chosen]
        for e in by:
            if e not in chosen:
                search.rejected.append(Rejection(f"colocated {e.layout.label}", (
                    f"not simulated: analytical cost ${_cost_rate(search, e.layout, e.mu_mixed_rps):.2f}/h per req/s "
                    f"is above the {k} best colocated layouts, and its fleet at the target rate "
                    f"(${_fleet_cost(search, e):.2f}/h) is not the cheapest")))
        if not lists["mixed"] and ok:
            lists["mixed"] = [min(ok, key=lambda e: _cost_rate(search, e.layout, e.mu_decode_rps)).layout]
    if mode != "off":
        pre = sorted((e for e in est if e.ttft_ok and e.mu_prefill_rps > 0),
                     key=lambda e: _cost_rate(search, e.layout, e.mu_prefill_rps))
        dec = sorted((e for e in est if e.tpot_ok and e.mu_decode_rps > 0),
                     key=lambda e: _cost_rate(search, e.layout, e.mu_decode_rps))
        lists["prefill"] = _diverse(pre, STAGE_SHORTLIST)
        lists["decode"] = _diverse(dec, STAGE_SHORTLIST)
    return lists


def _diverse(ranked: list[LayoutEstimate], k: int) -> list[Layout]:
    """The k best, making sure every accelerator type's best is among them (heterogeneous pairs need it)."""
    firsts: dict[str, Layout] = {}
    for e in ranked:
        firsts.setdefault(e.layout.accelerator, e.layout)
    out = list(firsts.values())
    for e in ranked:
        if len(out) >= max(k, len(firsts)):
            break
        if e.layout not in out:
            out.append(e.layout)
    return out


def kv_link_rates(search: Search, lay: Layout) -> tuple[float, float]:
    """(bytes/s, latency s) of the KV hand-off link per GPU NIC for a prefill layout."""
    link = kv_link(search.spec, search.hw.gpus[lay.accelerator], lay)
    return link.bandwidth_bytes_per_s, link.latency_s


def _measure_tasks(search: Search, lists: dict[str, list[Layout]]) -> list[MeasureTask]:
    tasks, est = [], search.estimates
    for lay in lists["mixed"]:
        e = est[lay]
        tasks.append(MeasureTask(f"mixed|{lay.label}", "mixed", FleetShape((PoolShape("mixed", lay, 1),)),
                                 e.mu_mixed_rps or e.mu_decode_rps * MIXED_GUESS_DECODE_SHARE))
    best_dec = lists["decode"][0] if lists["decode"] else None
    best_pre = lists["prefill"][0] if lists["prefill"] else None
    for lay in lists["prefill"] if best_dec else []:
        assert best_dec is not None
        n = min(16, max(1, math.ceil(4 * est[lay].mu_prefill_rps / est[best_dec].mu_decode_rps)))
        fleet = FleetShape((PoolShape("prefill", lay, 1), PoolShape("decode", best_dec, n)), *kv_link_rates(search, lay))
        tasks.append(MeasureTask(f"prefill|{lay.label}", "prefill", fleet, est[lay].mu_prefill_rps))
    for lay in lists["decode"] if best_pre else []:
        assert best_pre is not None
        n = min(16, max(1, math.ceil(4 * est[lay].mu_decode_rps / est[best_pre].mu_prefill_rps)))
        fleet = FleetShape((PoolShape("prefill", best_pre, n), PoolShape("decode", lay, 1)), *kv_link_rates(search, best_pre))
        tasks.append(MeasureTask(f"decode|{lay.label}", "decode", fleet, est[lay].mu_decode_rps))
    return tasks


def _floor(search: Search, task: MeasureTask) -> MeasureTask:
    lay = task.fleet.pools[0 if task.role != "decode" else 1].layout
    most = max(1, min(search.spec.search.max_gpus, search.hw.max_gpus[lay.accelerator]) // lay.gpus)
    floor = search.spec.workload.rate_rps * search.burst / most
    return MeasureTask(task.key, task.role, task.fleet, task.guess_rps, floor)


def _from_load_tests(search: Search, lists: dict[str, list[Layout]]) -> dict[tuple[str, Layout], float]:
    """Goodputs the spec's load tests give (their layouts join the shortlists)."""
    out: dict[tuple[str, Layout], float] = {}
    for i, m in enumerate(search.spec.measured):
        res = load_measurement(m, f"measured.{i}")
        lay = next((lay for lay in search.estimates if (lay.accelerator, lay.weight_dtype, lay.tp, lay.pp) ==
                    (m.accelerator, m.weight_dtype, m.tp, m.pp)), None)
        label = f"{m.accelerator} {m.weight_dtype} TP={m.tp} PP={m.pp}"
        if lay is None:
            search.rejected.append(Rejection(f"measured {label}", (
                f"load test {m.path} is for a layout that does not fit this workload or is not searched")))
            continue
        g = res.goodput_rps(search.spec.slo, m.role)
        out[(m.role, lay)] = g
        if g <= 0:
            search.rejected.append(Rejection(f"{m.role} {lay.label}", (
                f"load test {m.path} met the SLO at none of its measured rates; test lower rates")))
        search.measured[(m.role, lay)] = (
            f"measured, not simulated: {res.describe(search.spec.slo)}; the highest rate meeting the SLO is "
            f"{g:.2f} req/s")
        if m.role in lists and lay not in lists[m.role]:
            lists[m.role].append(lay)
    return out


def _task_cost(spec: PlanningSpec, task: MeasureTask) -> float:
    """A bisection's relative cost for handing out work: its first run's requests times the
    replicas simulated (every run of a bisection is near its first one's rate)."""
    return requests_for(max(task.guess_rps, task.floor_rps), spec.search.sample_requests) * sum(
        p.replicas for p in task.fleet.pools)


def run(search: Search, ex: Executor) -> None:
    """Measure (or read from load tests) each shortlisted layout's goodput per role."""
    ctx = search.ctx
    lists = search.shortlists = _shortlists(search)
    measured = _from_load_tests(search, lists)
    tasks = [_floor(search, t) for t in _measure_tasks(search, lists)]
    tasks = [t for t in tasks if (t.role, t.fleet.pools[0 if t.role != "decode" else 1].layout) not in measured]
    search.goodput.update(measured)
    by_key = {t.key: t for t in tasks}
    for res in ex.map(measure_goodput, ctx, tasks, cost=partial(_task_cost, search.spec)):
        search.simulations += res.runs
        lay = by_key[res.key].fleet.pools[0 if res.role != "decode" else 1].layout
        search.goodput[(res.role, lay)] = res.goodput_rps
        if res.goodput_rps <= 0:
            search.rejected.append(Rejection(f"{res.role} {lay.label}", _missed_text(res, by_key[res.key].floor_rps)))


def _missed_text(res: MeasureResult, floor: float) -> str:
    """Why a layout has no goodput: what one replica missed, and what could change that."""
    low = floor * LOW_PROBE_SHARE
    head = (f"in simulation one {res.role} replica missed the SLO even at {floor:.3g} req/s, the least each replica "
            f"must carry for the target x burst within the GPU limit ({res.runs} runs)")
    if res.low_passed is False:
        return (f"{head}, and at {low:.3g} req/s too: its latency misses the SLO, not its capacity, so more "
                "GPUs cannot help; relax the SLO or pick a faster layout (more TP, a faster card)")
    if res.low_passed:
        return f"{head}; it met the SLO at {low:.3g} req/s: raise search.max_gpus, relax the SLO, or pick a faster layout"
    return f"{head}: raise search.max_gpus, relax the SLO, or pick a faster layout"
