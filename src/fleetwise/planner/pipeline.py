"""The planning workflow's state and its first phases (enumerate, estimate, measure).

enumerate (fit) -> estimate (latency floors; drop layouts that cannot meet the SLO at any load)
-> measure (effective goodput per replica and per stage, in the simulator, in parallel) -> size
(replicas plus headroom terms; colocated, PD and heterogeneous PD candidates) -> refine (the
cheapest few confirmed, corrected, over several seeds, with failures) -> compare (colocated vs PD
at equal GPU count; heterogeneous claims) -> rank (cost per hour among plans meeting the SLO,
then goodput). Phases 4-7 live in `assemble`; `api.plan` runs them all; `report` renders.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fleetwise.perf.kv import kv_transfer_s
from fleetwise.perf.profile import Profile
from fleetwise.perf.roofline import PerfModel
from fleetwise.planner import candidates as cand
from fleetwise.planner.candidates import Enumeration, Hardware, Layout, Rejection
from fleetwise.planner.estimate import LayoutEstimate, estimate
from fleetwise.planner.executor import Executor
from fleetwise.planner.explain import latency_reason, no_layout_meets_latency, suggestions
from fleetwise.planner.measure import MAX_REQUESTS_PER_RUN, FleetShape, PoolShape
from fleetwise.planner.measured import load_measurement
from fleetwise.planner.sizing import Sizing
from fleetwise.planner.stages import Claims, Context, MeasureTask, Refined, measure_goodput
from fleetwise.planner.workload import LengthStats, build_mix, burst_factor
from fleetwise.spec.planning import PlanningSpec

STAGE_SHORTLIST = 3  # prefill and decode layouts measured per stage


@dataclass(frozen=True)
class PlanOptions:
    """How to run the search (not what to search: that is the spec)."""

    workers: int = 1
    """Worker processes for simulations (1 = in this process)."""
    top_k: int | None = None
    """Plans to report; None uses spec.search.top_k."""
    ray_address: str | None = None
    """Fan simulations out over a Ray cluster instead (needs the `fleetwise[ray]` extra)."""


@dataclass
class Candidate:
    """A sized fleet before refinement, with the steps that produced it."""

    key: str
    kind: str
    """`colocated`, `disaggregated` or `heterogeneous`."""
    fleet: FleetShape
    sizings: dict[str, Sizing]
    steps: list[str]
    cost_per_hour: float = 0.0
    refined: Refined | None = None
    claims: Claims | None = None

    @property
    def demoted(self) -> str | None:
        """Why the plan ranks below the plans whose claims hold (None when its claims hold)."""
        if self.claims is None or not self.claims.failed:
            return None
        return "demoted: claim(s) failed in simulation: " + "; ".join(self.claims.failed)


@dataclass
class Search:
    """Everything the phases produce; the report reads it."""

    spec: PlanningSpec
    hw: Hardware
    stats: LengthStats
    burst: float
    burst_source: str
    perf: PerfModel
    """Prices every step of the estimate; the simulator loads the same profile (`spec.profile`)."""
    estimates: dict[Layout, LayoutEstimate] = field(default_factory=dict)
    fits: dict[Layout, str] = field(default_factory=dict)
    goodput: dict[tuple[str, Layout], float] = field(default_factory=dict)
    measured: dict[tuple[str, Layout], str] = field(default_factory=dict)
    """Goodputs taken from a load test instead of the simulator, with the evidence."""
    candidates: list[Candidate] = field(default_factory=list)
    ranked: list[Candidate] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    disaggregation: dict[str, object] = field(default_factory=dict)
    simulations: int = 0
    wall_s: float = 0.0
    top_k: int = 3
    infeasible: str | None = None


# ---- phase 1: enumerate ------------------------------------------------------------------------
def _prepare(spec: PlanningSpec) -> tuple[Search, Context, Enumeration]:
    n = MAX_REQUESTS_PER_RUN + 500
    mix = build_mix(spec.workload, n, seed=0)
    stats = mix.stats
    hw = cand.resolve_hardware(spec, stats.prompt_max + stats.output_max)
    if spec.headroom.burst_factor is not None:
        burst, src = spec.headroom.burst_factor, "given in the spec"
    else:
        burst = burst_factor(mix, spec.workload.rate_rps, spec.headroom.burst_window_s)
        src = f"p99 over mean arrivals per {spec.headroom.burst_window_s:g} s window of the workload"
    profile = Profile.load(spec.profile) if spec.profile else None
    search = Search(spec, hw, stats, burst, src, PerfModel(profile))
    enum = cand.enumerate_layouts(hw, spec)
    search.rejected.extend(enum.rejected)
    ctx = Context(spec, mix, {n: hw.price(n) for n in hw.gpus}, burst)
    return search, ctx, enum


def _fit_line(hw: Hardware, lay: Layout, f: object, kv_dtype: str) -> str:
    m = hw.model
    fit = f  # LayoutFit
    line = (f"fit: {m.name} ({m.params_total / 1e9:.1f}B params, {m.weight_bytes(lay.weight_dtype) / 1e9:.0f} GB at "
            f"{lay.weight_dtype}) on {lay.label}: {fit.weight_bytes / 1e9:.1f} GB weights per card, "  # type: ignore[attr-defined]
            f"KV ({kv_dtype}) for {fit.kv_capacity_tokens:,} tokens per replica")  # type: ignore[attr-defined]
    if m.moe is not None:
        line += (f"; MoE: memory follows total params ({m.params_total / 1e9:.0f}B), compute follows active "
                 f"({m.params_active / 1e9:.1f}B, 1/{m.params_total / m.params_active:.1f})")
    return line


# ---- phase 2: estimate -------------------------------------------------------------------------
def _estimate(search: Search, enum: Enumeration) -> None:
    spec, hw = search.spec, search.hw
    if not enum.fitting:
        raise cand.nothing_fits(hw, spec)
    for lay, f in enum.fitting:
        dep = hw.deployment(lay, spec.kv_dtype)
        link = cand.kv_link(spec, hw.gpus[lay.accelerator], lay)
        kv99 = kv_transfer_s(math.ceil(search.stats.prompt_p99), dep, dep, link)
        search.estimates[lay] = estimate(search.perf.bind(dep), lay, f.kv_capacity_tokens, search.stats, spec.slo, kv99)
        search.fits[lay] = _fit_line(hw, lay, f, spec.kv_dtype)
    all_est = list(search.estimates.values())
    split = spec.search.disaggregation != "off"
    for e in all_est:
        if not e.latency_ok:
            why = latency_reason(e, search.stats, spec.slo)
            # A layout that meets one target can still serve the pool of that phase alone.
            kept = ("; kept as a prefill-pool candidate only" if split and e.ttft_ok else
                    "; kept as a decode-pool candidate only" if split and e.tpot_ok else "")
            search.rejected.append(Rejection(
                e.layout.label, f"{why}; {suggestions(e, all_est, search.stats, spec.slo)}{kept}"))
    if not any(e.ttft_ok for e in all_est) or not any(e.tpot_ok for e in all_est):
        raise no_layout_meets_latency(all_est, search.stats, spec.slo)


def profile_line(search: Search) -> str:
    """Which perf profile priced the plan (estimate and simulation alike)."""
    p, path = search.perf.profile, search.spec.profile
    if path is None:
        return ("priced by: the default, uncalibrated perf factors (no profile given; calibrate one with "
                "`fleetwise calibrate` and pass it as `profile` or `--profile`)")
    fit = (f", fitted to median {p.fit['median_abs_pct']:.1f}% error" if "median_abs_pct" in p.fit else "")
    return (f"priced by: perf profile {path} (accelerator {p.accelerator}, engine {p.engine}{fit}), in the "
            "estimate and in every simulation")


def _latency_line(e: LayoutEstimate, spec: PlanningSpec, stats: LengthStats) -> str:
    pct = spec.slo.percentile
    return (f"latency floor: one replica prefills the median prompt ({stats.prompt_p50:,.0f} tokens) in "
            f"{e.ttft_alone_p50_s * 1e3:.0f} ms and the p{pct} prompt ({stats.percentile_prompt(pct):,.0f}) in "
            f"{e.ttft_alone_slo_s * 1e3:.0f} ms (TTFT target {spec.slo.ttft_s * 1e3:.0f} ms); a decode step takes "
            f"{e.tpot_floor_s * 1e3:.1f} ms at batch 1 and stays under {0.9 * spec.slo.tpot_s * 1e3:.0f} ms up to "
            f"{e.decode_batch} sequences ({e.decode_bound}-bound at batch 1)")


# ---- phase 3: measure --------------------------------------------------------------------------
def _cost_rate(search: Search, lay: Layout, mu: float) -> float:
    return search.hw.price(lay.accelerator) * lay.gpus / mu if mu > 0 else math.inf


def _shortlists(search: Search) -> dict[str, list[Layout]]:
    """Layouts to simulate per role: colocated ones must meet both targets; a prefill pool only
    the TTFT target and a decode pool only the TPOT target (each phase runs apart)."""
    est = list(search.estimates.values())
    ok = [e for e in est if e.latency_ok]
    mode = search.spec.search.disaggregation
    lists: dict[str, list[Layout]] = {"mixed": [], "prefill": [], "decode": []}
    if mode != "only":
        by = sorted((e for e in ok if e.mu_mixed_rps > 0), key=lambda e: _cost_rate(search, e.layout, e.mu_mixed_rps))
        lists["mixed"] = [e.layout for e in by[: search.spec.search.refine_top]]
        for e in by[search.spec.search.refine_top:]:
            search.rejected.append(Rejection(f"colocated {e.layout.label}", (
                f"not simulated: analytical cost ${_cost_rate(search, e.layout, e.mu_mixed_rps):.2f}/h per req/s "
                f"is above the {search.spec.search.refine_top} best colocated layouts")))
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


def _link(search: Search, lay: Layout) -> tuple[float, float]:
    link = cand.kv_link(search.spec, search.hw.gpus[lay.accelerator], lay)
    return link.bandwidth_bytes_per_s, link.latency_s


def _measure_tasks(search: Search, lists: dict[str, list[Layout]]) -> list[MeasureTask]:
    tasks, est = [], search.estimates
    for lay in lists["mixed"]:
        e = est[lay]
        tasks.append(MeasureTask(f"mixed|{lay.label}", "mixed", FleetShape((PoolShape("mixed", lay, 1),)),
                                 e.mu_mixed_rps or e.mu_decode_rps / 4))
    best_dec = lists["decode"][0] if lists["decode"] else None
    best_pre = lists["prefill"][0] if lists["prefill"] else None
    for lay in lists["prefill"] if best_dec else []:
        assert best_dec is not None
        n = min(16, max(1, math.ceil(4 * est[lay].mu_prefill_rps / est[best_dec].mu_decode_rps)))
        fleet = FleetShape((PoolShape("prefill", lay, 1), PoolShape("decode", best_dec, n)), *_link(search, lay))
        tasks.append(MeasureTask(f"prefill|{lay.label}", "prefill", fleet, est[lay].mu_prefill_rps))
    for lay in lists["decode"] if best_pre else []:
        assert best_pre is not None
        n = min(16, max(1, math.ceil(4 * est[lay].mu_decode_rps / est[best_pre].mu_prefill_rps)))
        fleet = FleetShape((PoolShape("prefill", best_pre, n), PoolShape("decode", lay, 1)), *_link(search, best_pre))
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


def _measure(search: Search, ctx: Context, ex: Executor) -> dict[str, list[Layout]]:
    lists = _shortlists(search)
    measured = _from_load_tests(search, lists)
    tasks = [_floor(search, t) for t in _measure_tasks(search, lists)]
    tasks = [t for t in tasks if (t.role, t.fleet.pools[0 if t.role != "decode" else 1].layout) not in measured]
    search.goodput.update(measured)
    by_key = {t.key: t for t in tasks}
    for res in ex.map(measure_goodput, ctx, tasks):
        search.simulations += res.runs
        lay = by_key[res.key].fleet.pools[0 if res.role != "decode" else 1].layout
        search.goodput[(res.role, lay)] = res.goodput_rps
        if res.goodput_rps <= 0:
            search.rejected.append(Rejection(
                f"{res.role} {lay.label}",
                f"in simulation one {res.role} replica missed the SLO even at {by_key[res.key].floor_rps:.3g} req/s, "
                f"the least each replica must carry for the target x burst within the GPU limit "
                f"({res.runs} runs): raise search.max_gpus, relax the SLO, or pick a faster layout"))
    return lists
