"""Phase 2, latency: analytical floors and per-replica capacities from the perf model.

Owns the closed-form questions asked before any simulation, and the plain-language verdict when
a layout cannot meet the SLO at any load (with what would help):
- TTFT floor: the p50 and SLO-percentile prompt prefilled alone (chunked at the token budget).
- TPOT floor: one decode step at batch 1; the largest decode batch whose step stays under the
  TPOT target (and whose KV fits).
- Capacities (requests/s per replica), used to bracket the simulator's goodput search and to
  size P:D:
  decode   mu_d = B* / (out_mean * t_dec(B*)),  B* = largest batch with t_dec(B) <= 0.9 * TPOT;
  prefill  mu_p = rho* / S_p, S_p = prefill seconds of a mean prompt at full token budget and
           rho* the largest load with  t_alone(p) + Wq_p(rho) + t_kv(p) <= TTFT, where M/G/1
           waiting (Pollaczek-Khinchine) has mean Wq = rho*S*(1 + C^2)/(2(1-rho)), C^2 the squared
           coefficient of variation of the prefill service time over the prompt-length
           distribution (each bin of `LengthStats.prompt_bins` priced by the perf model; 0 gives
           M/D/1), and tail quantile Wq_p ~ (Wq/rho)*ln(rho/(1-p));
  mixed    the largest rate whose decode steps, stretched by prefill work sharing the GPU
           (t_dec(B)/(1 - lambda*S_p), B = lambda*out_mean*TPOT by Little's law), meet TPOT and
           whose prefill queue meets TTFT as above.
Every step is priced by the search's perf model (`Search.perf`, the spec's profile). Does not
decide replica counts (sizing) or simulate (goodput).
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from typing import Protocol

from fleetwise.errors import InfeasibleError
from fleetwise.perf.kv import kv_transfer_s
from fleetwise.perf.memory import kv_request_tokens
from fleetwise.perf.roofline import BoundPerf
from fleetwise.perf.types import BatchShape, Deployment, SeqWork, StepCost
from fleetwise.planner.fit import fit_line, nothing_fits
from fleetwise.planner.layout import Layout, Rejection, kv_link
from fleetwise.planner.results import LayoutEstimate
from fleetwise.planner.state import Search
from fleetwise.planner.workload import LengthStats
from fleetwise.spec.engine_defaults import MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS
from fleetwise.spec.planning import PlanningSpec, PlanSLOSpec

TOKEN_BUDGET = MAX_NUM_BATCHED_TOKENS
"""Step token budget a plan's engines run with (the engine default, declared in spec.engine_defaults)."""
MAX_SEQS = MAX_NUM_SEQS
"""Most running sequences a plan's engines admit (the engine default, declared in spec.engine_defaults)."""


TPOT_MARGIN = 0.9  # plan decode batches to 90% of the TPOT target

MAX_UTILISATION = 0.98
"""Highest utilisation the load bisection tries: M/G/1 waits diverge as rho -> 1."""
MIN_UTILISATION = 1e-6
"""Lowest utilisation the load bisection tries; a layout failing even this has no capacity."""
BISECT_STEPS = 30
"""Halvings of the load bisection: a resolution of 2**-30 of the range."""
MIXED_PREFILL_UTILISATION = 0.95
"""Most of a mixed replica's time prefills may take; decode steps stall behind the rest."""


class StepPricer(Protocol):
    """What the latency phase prices steps with: a `BoundPerf`, or one scaled by a measured factor."""

    @property
    def deployment(self) -> Deployment: ...

    def step_time_s(self, shape: BatchShape) -> float: ...

    def step_cost(self, shape: BatchShape) -> StepCost: ...


class MeasuredPerf:
    """A bound perf model whose steps take a measured factor times the modelled seconds: a card's
    measured service (`measured_service[].step_time_factor`, from `calibrate --from-metrics`),
    applied as the simulator applies it to a pool (`PoolSpec.step_time_factor`): `factor` on steps
    with prompt tokens, `decode_factor` (default `factor`) on decode-only ones, where a P/D fleet's
    prefill and decode pools on the card were measured apart."""

    def __init__(self, perf: BoundPerf, factor: float, decode_factor: float | None = None) -> None:
        self.perf, self.factor = perf, factor
        self.decode_factor = factor if decode_factor is None else decode_factor

    @property
    def deployment(self) -> Deployment:
        """The deployment the model is bound to."""
        return self.perf.deployment

    def _factor(self, shape: BatchShape) -> float:
        return self.factor if shape.prefill_tokens > 0 else self.decode_factor

    def step_time_s(self, shape: BatchShape) -> float:
        """Seconds of one step of `shape`, measured factor applied."""
        return self.perf.step_time_s(shape) * self._factor(shape)

    def step_cost(self, shape: BatchShape) -> StepCost:
        """The step's cost with every part scaled by the measured factor (what bounds it unchanged)."""
        c, f = self.perf.step_cost(shape), self._factor(shape)
        return replace(c, **{x.name: getattr(c, x.name) * f for x in fields(c) if x.name != "bound"})


def priced(search: Search, dep: Deployment, accelerator: str) -> StepPricer:
    """The perf model bound to `dep`, scaled by the measured step-time factors of `accelerator` (the
    layout's card, as the spec names it) when the spec gives them, as `simulate.to_plan_spec` scales
    the simulated pools: floors, capacities and pruning see the speed the simulator runs at (prompt
    steps at the prefill pools' factor, decode-only steps at the decode pools', where measured apart)."""
    bound = search.perf.bind(dep)
    spec = search.spec
    prefill, decode = spec.step_time_factor(accelerator, "prefill"), spec.step_time_factor(accelerator, "decode")
    return bound if prefill == decode == 1.0 else MeasuredPerf(bound, prefill, decode)


def prefill_alone_s(perf: StepPricer, prompt_tokens: int, budget: int = TOKEN_BUDGET) -> tuple[float, str]:
    """Seconds to prefill one prompt alone, chunk by chunk, and what bounds its largest chunk."""
    done, total, bound = 0, 0.0, ""
    while done < prompt_tokens:
        chunk = min(budget, prompt_tokens - done)
        cost = perf.step_cost(BatchShape.of([SeqWork(chunk, done)]))
        total += cost.total_s
        bound = bound or cost.bound
        done += chunk
    return total, bound


def decode_step_s(perf: StepPricer, batch: int, ctx: int) -> float:
    """Seconds of one decode step of `batch` sequences at `ctx` tokens of context each."""
    return perf.step_time_s(BatchShape.decode(batch, max(1, ctx)))


def _max_decode_batch(dep: StepPricer, ctx: int, target_s: float, kv_cap: int, seq_tokens: float) -> int:
    limit = max(0, min(MAX_SEQS, int(kv_cap // max(1.0, seq_tokens))))
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if decode_step_s(dep, mid, ctx) <= target_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _wait_quantile(rho: float, service_s: float, pct: float, cv2: float = 0.0) -> float:
    """M/G/1 waiting-time quantile for service-time squared CV `cv2` (0: M/D/1), exponential-tail
    approximation (0 when rho <= 1-p)."""
    if rho <= 0:
        return 0.0
    mean = rho * service_s * (1 + cv2) / (2 * (1 - rho))
    tail = 1 - pct / 100
    return 0.0 if rho <= tail else (mean / rho) * math.log(rho / tail)


def _max_load(ok: object, hi: float = MAX_UTILISATION) -> float:
    """Largest value in (0, hi] with ok(value) true, by bisection (0 when even a tiny one fails)."""
    check = ok  # callable[[float], bool]
    lo_v, hi_v = 0.0, hi
    if not check(MIN_UTILISATION):  # type: ignore[operator]
        return 0.0
    for _ in range(BISECT_STEPS):
        mid = (lo_v + hi_v) / 2
        if check(mid):  # type: ignore[operator]
            lo_v = mid
        else:
            hi_v = mid
    return lo_v


def _per_request_prefill_s(perf: StepPricer, prompt_mean: float) -> float:
    """GPU seconds of a mean prompt when prompts are packed into full token-budget steps."""
    chunk = TOKEN_BUDGET
    n = max(1, round(chunk / max(1.0, prompt_mean)))
    seq = max(1, int(prompt_mean))
    step = perf.step_time_s(BatchShape.prefill(n, seq))
    return step / n


def service_cv2(perf: StepPricer, prompt_bins: tuple[float, ...]) -> float:
    """Squared coefficient of variation of the prefill service time over the prompt-length bins
    (each bin's prompt priced packed at the token budget); 0 with fewer than two bins."""
    if len(prompt_bins) < 2:
        return 0.0
    s = [_per_request_prefill_s(perf, b) for b in prompt_bins]
    m = sum(s) / len(s)
    return max(0.0, sum(x * x for x in s) / len(s) / (m * m) - 1.0) if m > 0 else 0.0


def estimate(dep: StepPricer, layout: Layout, kv_cap: int, stats: LengthStats, slo: PlanSLOSpec,
             kv_p99_s: float) -> LayoutEstimate:
    """All analytical figures of one layout, priced by `dep` (the perf model bound to its deployment)."""
    p50, _ = prefill_alone_s(dep, max(1, int(stats.prompt_p50)))
    slo_prompt = max(1, int(stats.percentile_prompt(slo.percentile)))
    t_alone, pbound = prefill_alone_s(dep, slo_prompt)
    ctx = int(stats.prompt_mean + stats.output_mean / 2)
    model = dep.deployment.model  # windowed layers cap a sequence's KV: fewer tokens of capacity per sequence
    seq_tokens = kv_request_tokens(model, range(model.num_layers), stats.prompt_mean + stats.output_mean)
    t1_cost = dep.step_cost(BatchShape.decode(1, ctx))
    bstar = _max_decode_batch(dep, ctx, TPOT_MARGIN * slo.tpot_s, kv_cap, seq_tokens)
    t_b = decode_step_s(dep, bstar, ctx) if bstar else t1_cost.total_s
    s_p = _per_request_prefill_s(dep, stats.prompt_mean)
    cv2 = service_cv2(dep, stats.prompt_bins)
    mu_d = bstar / (stats.output_mean * t_b) if bstar else 0.0
    budget = slo.ttft_s - t_alone - kv_p99_s

    def prefill_ok(rho: float) -> bool:
        return _wait_quantile(rho, s_p, slo.percentile, cv2) <= budget

    mu_p = _max_load(prefill_ok) / s_p if budget > 0 else 0.0
    mu_mix = _mixed_capacity(dep, stats, slo, s_p, t_alone, ctx, kv_cap, seq_tokens, cv2)
    return LayoutEstimate(
        layout, kv_cap, p50, t_alone, pbound, t1_cost.total_s, t1_cost.bound, bstar, t_b, s_p, kv_p99_s,
        mu_p, mu_d, mu_mix, ttft_ok=t_alone <= slo.ttft_s, tpot_ok=t1_cost.total_s <= slo.tpot_s,
        prefill_service_cv2=cv2)


def _mixed_capacity(dep: StepPricer, stats: LengthStats, slo: PlanSLOSpec, s_p: float, t_alone: float,
                    ctx: int, kv_cap: int, seq_tokens: float, cv2: float) -> float:
    def ok(lam: float) -> bool:
        rho_p = lam * s_p
        if rho_p >= MIXED_PREFILL_UTILISATION:
            return False
        batch = max(1, math.ceil(lam * stats.output_mean * slo.tpot_s))
        if batch > MAX_SEQS or batch * seq_tokens > kv_cap:
            return False
        if decode_step_s(dep, batch, ctx) / (1 - rho_p) > TPOT_MARGIN * slo.tpot_s:
            return False
        return t_alone + _wait_quantile(rho_p, s_p, slo.percentile, cv2) <= slo.ttft_s

    hi = MIXED_PREFILL_UTILISATION / s_p
    return _max_load(lambda x: ok(x * hi), hi=1.0) * hi


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms"


def latency_reason(est: LayoutEstimate, stats: LengthStats, slo: PlanSLOSpec) -> str:
    """Why one replica of this layout cannot meet the SLO, however many replicas are bought."""
    parts = []
    if not est.ttft_ok:
        prompt = int(stats.percentile_prompt(slo.percentile))
        parts.append(f"the p{slo.percentile} prompt ({prompt:,} tokens) alone takes {_ms(est.ttft_alone_slo_s)} to "
                     f"prefill ({est.prefill_bound}-bound) > TTFT target {_ms(slo.ttft_s)}")
    if not est.tpot_ok:
        parts.append(f"one decode step at batch 1 takes {_ms(est.tpot_floor_s)} ({est.decode_bound}-bound) > "
                     f"TPOT target {_ms(slo.tpot_s)}")
    return "one replica cannot meet the SLO at any load (more replicas will not help): " + "; ".join(parts)


def suggestions(est: LayoutEstimate, all_est: list[LayoutEstimate], stats: LengthStats, slo: PlanSLOSpec) -> str:
    """What would help this layout, pointing at layouts that do better."""
    out = []
    lay = est.layout
    if not est.ttft_ok:
        better = [e for e in all_est if e.ttft_ok]
        more_tp = [e for e in better if e.layout.accelerator == lay.accelerator and e.layout.gpus > lay.gpus]
        if more_tp:
            b = min(more_tp, key=lambda e: e.layout.gpus)
            out.append(f"more TP ({b.layout.label}: {_ms(b.ttft_alone_slo_s)})")
        faster = [e for e in better if e.layout.accelerator != lay.accelerator]
        if faster:
            b = min(faster, key=lambda e: e.ttft_alone_slo_s)
            out.append(f"a faster card ({b.layout.label}: {_ms(b.ttft_alone_slo_s)})")
        frac = slo.ttft_s / est.ttft_alone_slo_s
        out.append(f"a shorter context (prompts under ~{int(stats.percentile_prompt(slo.percentile) * frac):,} "
                   f"tokens prefill within the target on this layout)")
    if not est.tpot_ok:
        better = [e for e in all_est if e.tpot_ok]
        if better:
            b = min(better, key=lambda e: e.tpot_floor_s)
            out.append(f"a layout with less weight per card or more bandwidth ({b.layout.label}: "
                       f"{_ms(b.tpot_floor_s)} per step)")
        out.append("lower-precision weights (fp8/int4 halve/quarter the bytes read per step)")
    if est.ttft_ok and est.tpot_ok is False:
        out.append("disaggregation does not lower the batch-1 decode floor")
    return "would help: " + "; ".join(out) if out else ""


def no_layout_meets_latency(all_est: list[LayoutEstimate], stats: LengthStats, slo: PlanSLOSpec) -> InfeasibleError:
    """The SLO is below the physical minimum of every candidate: say by how much and what would help."""
    best_ttft = min(all_est, key=lambda e: e.ttft_alone_slo_s)
    best_tpot = min(all_est, key=lambda e: e.tpot_floor_s)
    parts = []
    if best_ttft.ttft_alone_slo_s > slo.ttft_s:
        prompt = int(stats.percentile_prompt(slo.percentile))
        parts.append(f"TTFT target {_ms(slo.ttft_s)} is below the physical minimum: the fastest layout "
                     f"({best_ttft.layout.label}) prefills the p{slo.percentile} prompt ({prompt:,} tokens) alone in "
                     f"{_ms(best_ttft.ttft_alone_slo_s)}; raise the target, shorten prompts, or allow a faster card")
    if best_tpot.tpot_floor_s > slo.tpot_s:
        parts.append(f"TPOT target {_ms(slo.tpot_s)} is below the physical minimum: the fastest layout "
                     f"({best_tpot.layout.label}) needs {_ms(best_tpot.tpot_floor_s)} per decode step at batch 1; "
                     "raise the target, allow fp8/int4 weights, or a card with more memory bandwidth")
    if not parts:
        parts.append("no single layout meets both targets: the layouts fast enough to prefill are too slow to "
                     f"decode and vice versa (best TTFT {best_ttft.layout.label}, best TPOT "
                     f"{best_tpot.layout.label}); a disaggregated plan with different layouts per stage may")
    return InfeasibleError("no plan can meet the SLO: " + "; ".join(parts))


def run(search: Search) -> None:
    """Latency floors and capacities of every fitting layout; InfeasibleError when none can meet the SLO."""
    spec, hw, enum = search.spec, search.hw, search.enumeration
    if enum is None or not enum.fitting:
        raise nothing_fits(hw, spec)
    for lay, f in enum.fitting:
        dep = hw.deployment(lay, spec.kv_dtype)
        link = kv_link(spec, hw.gpus[lay.accelerator], lay)
        kv99 = kv_transfer_s(math.ceil(search.stats.prompt_p99), dep, dep, link)
        search.estimates[lay] = estimate(priced(search, dep, lay.accelerator), lay, f.kv_capacity_tokens, search.stats, spec.slo, kv99)
        search.fits[lay] = fit_line(hw, lay, f, spec.kv_dtype)
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


def latency_line(e: LayoutEstimate, spec: PlanningSpec, stats: LengthStats) -> str:
    """The explanation's latency-floor step for one layout."""
    pct = spec.slo.percentile
    return (f"latency floor: one replica prefills the median prompt ({stats.prompt_p50:,.0f} tokens) in "
            f"{e.ttft_alone_p50_s * 1e3:.0f} ms and the p{pct} prompt ({stats.percentile_prompt(pct):,.0f}) in "
            f"{e.ttft_alone_slo_s * 1e3:.0f} ms (TTFT target {spec.slo.ttft_s * 1e3:.0f} ms); a decode step takes "
            f"{e.tpot_floor_s * 1e3:.1f} ms at batch 1 and stays under {TPOT_MARGIN * spec.slo.tpot_s * 1e3:.0f} ms up to "
            f"{e.decode_batch} sequences ({e.decode_bound}-bound at batch 1)")
