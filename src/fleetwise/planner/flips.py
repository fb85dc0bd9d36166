"""The plan's decisions re-made at the ends of the step-time bands (`fleetwise.perf.flips`).

Owns the planner's decision rules as functions of scaled step times: whether the plan's layouts
meet the latency targets (fit), which TP the cheapest candidate of the plan's kind uses, whether the
cheapest candidate is colocated or split (disaggregate), and the P:D replica counts of a split plan.
Each is re-made with every step time at the fast and at the slow end of its band (the profile's
held-out residuals for the nearest shapes; no band without them). The re-sizing at the ends is
analytic, not simulated: a replica's goodput is taken as inversely proportional to its step time, so
a pool's load scales with its band and the serving count is rounded up again. Computes nothing for a
profile without residuals.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fleetwise.perf.flips import Flip, Scale, decide_at_band_ends
from fleetwise.perf.types import BatchShape
from fleetwise.perf.uncertainty import Band
from fleetwise.planner.latency import TPOT_MARGIN

if TYPE_CHECKING:
    from fleetwise.planner.layout import Layout
    from fleetwise.planner.state import Candidate, Search

Key = tuple[str, "Layout"]
"""(phase, layout): `prefill` (the SLO-percentile prompt alone), `decode` (a step at the planned
batch) or `mixed` (that decode step plus one mean prompt as a chunk)."""
RESIZE_BASIS = ("replicas re-sized analytically with each pool's goodput inversely proportional to its step "
                "time at that end (not re-simulated)")


def _bands(search: Search, layouts: set[Layout]) -> dict[Key, Band]:
    st, slo = search.stats, search.spec.slo
    out: dict[Key, Band] = {}
    for lay in layouts:
        e = search.estimates.get(lay)
        if e is None:
            continue
        dep = search.hw.deployment(lay, search.spec.kv_dtype)
        ctx = max(1, int(st.prompt_mean + st.output_mean / 2))
        dec = BatchShape.decode(max(1, e.decode_batch), ctx)
        out[("prefill", lay)] = search.perf.step_time_band(
            BatchShape.prefill(1, max(1, int(st.percentile_prompt(slo.percentile)))), dep)
        out[("decode", lay)] = search.perf.step_time_band(dec, dep)
        out[("mixed", lay)] = search.perf.step_time_band(dec + BatchShape.prefill(1, max(1, int(st.prompt_mean))), dep)
    return out


def _meets(search: Search, c: Candidate, scale: Scale) -> str:
    """Whether every layout of `c` meets the TTFT and TPOT targets with its step times scaled."""
    slo, misses = search.spec.slo, []
    for lay in sorted({p.layout for p in c.fleet.pools}, key=lambda x: x.label):
        e = search.estimates[lay]
        if e.ttft_alone_slo_s * scale(("prefill", lay)) > slo.ttft_s:
            misses.append(f"TTFT on {lay.label}")
        if e.decode_batch < 1 or e.tpot_at_batch_s * scale(("decode", lay)) > TPOT_MARGIN * slo.tpot_s:
            misses.append(f"TPOT on {lay.label}")
    return "meets the latency targets" if not misses else "misses " + ", ".join(misses)


def _serving(c: Candidate, scale: Scale) -> dict[str, int]:
    """Serving replicas per role with each pool's load scaled by its band end."""
    pools: dict[str, Layout] = {p.role: p.layout for p in c.fleet.pools}
    return {role: max(1, math.ceil((s.load_replicas + s.ramp_replicas) * scale((role, pools[role])) - 1e-9))
            for role, s in c.sizings.items()}


def _cost(search: Search, c: Candidate, scale: Scale) -> float:
    """Dollars per hour of `c` re-sized at `scale` (serving plus its unchanged spares)."""
    serving = _serving(c, scale)
    return sum((serving[p.role] + c.sizings[p.role].failures + c.sizings[p.role].upgrade) * p.layout.gpus
               * search.hw.price(p.layout.accelerator) for p in c.fleet.pools)


def _cheapest(search: Search, pool: list[Candidate], scale: Scale) -> Candidate | None:
    ok = [c for c in pool if _meets(search, c, scale).startswith("meets")]
    return min(ok, key=lambda c: (_cost(search, c, scale), c.key)) if ok else None


def _tps(c: Candidate) -> str:
    return "/".join(f"TP={p.layout.tp}" for p in c.fleet.pools)


def plan_flips(search: Search, c: Candidate) -> list[Flip]:
    """The plan's fit, TP, disaggregation and P:D decisions at the ends of their step-time bands
    (empty when the profile carries no held-out residuals)."""
    if not search.perf.profile.residuals:
        return []
    pool = [x for x in search.candidates if all(p.layout in search.estimates for p in x.fleet.pools)]
    if c not in pool:
        pool.append(c)
    bands = _bands(search, {p.layout for x in pool for p in x.fleet.pools})
    out = [decide_at_band_ends("fit", lambda s: _meets(search, c, s), bands,
                               "TTFT floor and the planned decode step against the targets")]
    same = [x for x in pool if x.kind == c.kind and {p.layout.accelerator for p in x.fleet.pools}
            == {p.layout.accelerator for p in c.fleet.pools}]

    def tp(s: Scale) -> str:
        best = _cheapest(search, same, s)
        return _tps(best) if best else "none meets the targets"

    out.append(decide_at_band_ends("TP", tp, bands, f"cheapest {c.kind} candidate; {RESIZE_BASIS}"))
    if {x.kind == "colocated" for x in pool} == {True, False}:
        def split(s: Scale) -> str:
            best = _cheapest(search, pool, s)
            return "none meets the targets" if best is None else (
                "colocate" if best.kind == "colocated" else "disaggregate")

        out.append(decide_at_band_ends("disaggregate", split, bands, f"cheapest candidate of any kind; {RESIZE_BASIS}"))
    if "prefill" in c.sizings and "decode" in c.sizings:
        def ratio(s: Scale) -> str:
            n = _serving(c, s)
            return f"P:D {n['prefill']}:{n['decode']}"

        out.append(decide_at_band_ends("P:D", ratio, bands, f"serving replicas per pool; {RESIZE_BASIS}"))
    return out


def flips_line(flips: list[Flip]) -> str | None:
    """One explanation line for the plan (None without bands)."""
    if not flips:
        return None
    return "decisions across the step-time band: " + "; ".join(f.text() for f in flips)
