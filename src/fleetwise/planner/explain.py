"""Plain-language reasons with numbers: why a layout cannot meet the SLO and what would help.

Owns the latency verdict of step 2 ("can one replica meet TTFT and TPOT at all? If not, more
replicas will not help") and the suggestions derived from the other layouts the search saw (more
TP, a faster card, lower precision, a shorter context, disaggregation). Does not compute figures.
"""

from __future__ import annotations

from fleetwise.errors import InfeasibleError
from fleetwise.planner.estimate import LayoutEstimate
from fleetwise.planner.workload import LengthStats
from fleetwise.spec.planning import PlanSLOSpec


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
