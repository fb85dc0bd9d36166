"""Phase 4 of planning, sizing: replica counts from effective goodput, plus each headroom term, shown.

Owns the arithmetic from a measured per-replica goodput G (requests/s at which one replica still
meets the SLO under the target mix) to a replica count:

    load      = rate * burst / G                       (fractional replicas at peak)
    ramp      = load * rate_growth_per_min * cold_start_s / 60
                                                        (growth while a new replica cold-starts)
    serving   = ceil(load + ramp)                      (at least 1)
    failures  = failures_to_survive                    (N+k: survive k replica losses)
    upgrade   = upgrade_batch - failures               (a rolling-upgrade batch out at once; it
                or upgrade_batch when failures_during_upgrade   overlaps the failure spare unless
                                                        both must hold together), at least 0
    total     = serving + failures + upgrade

and the P:D split for disaggregated pools, where each pool is sized from its own stage goodput;
then the candidates themselves (colocated, PD, heterogeneous PD), each with the explanation steps
that produced it. Does not measure anything.
"""

from __future__ import annotations

import math

from fleetwise.perf.expert_load import ASSUMED_IMBALANCE_NOTE
from fleetwise.perf.kv import handoff_extra_s, kv_shards
from fleetwise.planner.goodput import kv_link_rates
from fleetwise.planner.latency import latency_line, profile_line
from fleetwise.planner.layout import Layout, Rejection
from fleetwise.planner.results import Sizing, size_pool
from fleetwise.planner.simulate import FleetShape, PoolShape
from fleetwise.planner.state import Candidate, Search
from fleetwise.spec.engine_defaults import BLOCK_SIZE
from fleetwise.spec.kv_format import declared_format, kv_compat


def pd_ratio_text(prefill: Sizing, decode: Sizing) -> str:
    """`P:D` with the load each pool carries."""
    return (f"P:D = {prefill.serving}:{decode.serving} serving replicas "
            f"(prefill load {prefill.load_replicas:.2f}, decode load {decode.load_replicas:.2f} replicas)")


def _goodput_line(search: Search, role: str, lay: Layout) -> str:
    e = search.estimates[lay]
    mu = {"mixed": e.mu_mixed_rps, "prefill": e.mu_prefill_rps, "decode": e.mu_decode_rps}[role]
    judged = {"mixed": "TTFT and TPOT", "prefill": "TTFT (decode pool oversized)",
              "decode": "TPOT and TTFT (prefill pool oversized, so TTFT holds the decode admission wait)"}[role]
    if (role, lay) in search.measured:
        return (f"effective goodput: one {role} replica of {lay.label} sustains {search.goodput[(role, lay)]:.2f} "
                f"req/s within the SLO, {search.measured[(role, lay)]}; the analytical estimate was {mu:.2f} req/s")
    return (f"effective goodput: one {role} replica of {lay.label} sustains "
            f"{search.goodput[(role, lay)]:.2f} req/s of the target mix within the SLO ({judged}), bisected in the "
            f"simulator; the analytical estimate was {mu:.2f} req/s")


def _moe_line(search: Search, lay: Layout) -> str | None:
    m = search.hw.model
    if m.moe is None:
        return None
    from fleetwise.perf.types import BatchShape

    dep = search.hw.deployment(lay, search.spec.kv_dtype)
    e = search.estimates[lay]
    cost = search.perf.step_cost(BatchShape.decode(max(1, e.decode_batch), int(search.stats.prompt_mean)), dep)
    load = search.hw.expert_load
    source = f"measured from {load}" if load else ASSUMED_IMBALANCE_NOTE
    stage = lay.parallelism.ep_stage
    if stage == 1:
        where = (f"every GPU holds a slice of every expert (TP={lay.tp}), so no GPU waits on a busier one"
                 if lay.tp > 1 else "every expert on the one GPU, so no expert load imbalance between GPUs")
    else:
        where = (f"each layer's experts over the {stage} GPUs of its pipeline stage" if stage != lay.ep
                 else f"over the replica's {lay.gpus} GPUs")
        where += f"; expert load imbalance {search.hw.imbalance_for(lay):.2f} (busiest rank over mean, {source})"
    step = (f"spends {cost.ep_comm_s * 1e3:.2f} ms in all-to-all of {cost.total_s * 1e3:.1f} ms" if stage > 1
            else f"takes {cost.total_s * 1e3:.1f} ms, with no all-to-all")
    return (f"MoE: {m.moe.num_experts} experts, {m.moe.experts_per_token} per token; EP={lay.ep}, {where}; "
            f"at batch {e.decode_batch} a decode step {step}")


def _band_line(search: Search, lay: Layout) -> str | None:
    """The latency floor's uncertainty: bands from the profile's held-out residuals, against the SLO."""
    if not search.perf.profile.residuals:
        return None
    from fleetwise.perf.types import BatchShape
    from fleetwise.perf.uncertainty import threshold_note
    from fleetwise.planner.latency import TPOT_MARGIN

    dep, e, slo, st = search.hw.deployment(lay, search.spec.kv_dtype), search.estimates[lay], search.spec.slo, search.stats
    pre = search.perf.step_time_band(BatchShape.prefill(1, max(1, int(st.percentile_prompt(slo.percentile)))), dep)
    ctx = max(1, int(st.prompt_mean + st.output_mean / 2))
    dec = search.perf.step_time_band(BatchShape.decode(max(1, e.decode_batch), ctx), dep)
    return (f"uncertainty (held-out errors of the {pre.points} nearest calibrated shapes): "
            f"{threshold_note(f'the p{slo.percentile} prompt alone', pre, slo.ttft_s, 'TTFT target')}; "
            f"{threshold_note(f'a decode step at batch {e.decode_batch}', dec, TPOT_MARGIN * slo.tpot_s, 'TPOT budget')}")


def _base_steps(search: Search, role: str, lay: Layout) -> list[str]:
    steps = [profile_line(search), search.fits[lay], latency_line(search.estimates[lay], search.spec, search.stats),
             _goodput_line(search, role, lay)]
    extra = [_moe_line(search, lay), _band_line(search, lay)]
    return steps + [x for x in extra if x]


def fleet_cost(search: Search, fleet: FleetShape, spare: dict[str, int]) -> float:
    """Dollars per hour of a fleet plus `spare` replicas per role."""
    return sum((p.replicas + spare.get(p.role, 0)) * p.layout.gpus * search.hw.price(p.layout.accelerator)
               for p in fleet.pools)


def spares(sizings: dict[str, Sizing]) -> dict[str, int]:
    """Headroom replicas per role (failure spares and the upgrade batch)."""
    return {r: s.failures + s.upgrade for r, s in sizings.items()}


def _colocated(search: Search, lay: Layout) -> Candidate | None:
    g = search.goodput.get(("mixed", lay), 0.0)
    if g <= 0:
        return None
    w = search.spec.workload
    s = size_pool("mixed", g, w.rate_rps, search.burst, search.spec.headroom, search.ctx.load_s(lay))
    fleet = FleetShape((PoolShape("mixed", lay, s.serving),))
    steps = _base_steps(search, "mixed", lay) + [s.explain(search.spec.headroom)]
    return Candidate(f"colocated {lay.label}", "colocated", fleet, {"mixed": s}, steps)


def _pd_steps(search: Search, p: Layout, d: Layout, sp: Sizing, sd: Sizing) -> list[str]:
    st, ep, ed = search.stats, search.estimates[p], search.estimates[d]
    an_p = search.spec.workload.rate_rps * search.burst / ep.mu_prefill_rps if ep.mu_prefill_rps else math.inf
    an_d = search.spec.workload.rate_rps * search.burst / ed.mu_decode_rps if ed.mu_decode_rps else math.inf
    kv99 = search.hw.model.kv_bytes(st.prompt_p99, search.spec.kv_dtype)
    return [
        (f"P:D from the queueing model: input/output tokens {st.prompt_mean:,.0f}/{st.output_mean:,.0f} = "
         f"{st.prompt_mean / st.output_mean:.1f}; prefill service {ep.prefill_s_per_request * 1e3:.0f} ms per mean "
         f"prompt (M/G/1 queue, service-time C^2 {ep.prefill_service_cv2:.2f} over the prompt lengths, TTFT budget after the p{search.spec.slo.percentile} prefill and a KV transfer p99 of "
         f"{ep.kv_transfer_p99_s * 1e3:.1f} ms = {kv99 / 1e9:.2f} GB) gives {ep.mu_prefill_rps:.2f} "
         f"req/s per prefill replica; decode batch {ed.decode_batch} at {ed.tpot_at_batch_s * 1e3:.1f} ms per step "
         f"for {st.output_mean:.0f} tokens gives {ed.mu_decode_rps:.2f} req/s per decode replica; analytical "
         f"load {an_p:.2f}:{an_d:.2f}"),
        f"P:D measured in simulation: {pd_ratio_text(sp, sd)}",
    ]


def handoff_line(search: Search, p: Layout, d: Layout) -> tuple[bool, str | None]:
    """Whether a decode replica of layout `d` can take a prefill replica of `p`'s KV (`kv_compat`
    on the formats the two cards declare), and for a pair that is not direct, the explanation of
    what crossing costs per mean prompt (staging copies between vendors, a conversion pass)."""
    kv_dtype = search.spec.kv_dtype
    dp, dd = search.hw.deployment(p, kv_dtype), search.hw.deployment(d, kv_dtype)
    src = declared_format("v1", kv_dtype, BLOCK_SIZE, p.tp, dp.accelerator)
    dst = declared_format("v1", kv_dtype, BLOCK_SIZE, d.tp, dd.accelerator)
    c = kv_compat(src, dst)
    if not c.ok:
        return False, f"prefill {p.label} -> decode {d.label}: {c.reason}"
    if c.direct:
        return True, None
    nbytes = search.hw.model.kv_bytes(search.stats.prompt_mean, kv_dtype)
    link_bw, _ = kv_link_rates(search, p)
    wire = nbytes / (min(kv_shards(dp), kv_shards(dd)) * link_bw)
    extra = handoff_extra_s(nbytes, c, dp, dd)
    what = ([f"no device-to-device path between {src.vendor} and {dst.vendor}: each side stages the KV through "
             "host memory"] if c.cross_vendor else []) + [f"the decode side converts {x}" for x in c.conversions]
    return True, (f"KV hand-off {src.label()} -> {dst.label()}: {'; '.join(what)}: +{extra * 1e3:.1f} ms per mean "
                  f"prompt ({nbytes / 1e6:.0f} MB) on top of {wire * 1e3:.1f} ms on the link, priced in every "
                  "simulation of this plan")


def _disaggregated(search: Search, p: Layout, d: Layout) -> Candidate | None:
    gp, gd = search.goodput.get(("prefill", p), 0.0), search.goodput.get(("decode", d), 0.0)
    if gp <= 0 or gd <= 0:
        return None
    ok, crossing = handoff_line(search, p, d)
    if not ok:
        kind = "heterogeneous" if p.accelerator != d.accelerator else "disaggregated"
        search.rejected.append(Rejection(f"{kind} P[{p.label}] D[{d.label}]",
                                         f"no common KV format: {crossing}"))
        return None
    w, h = search.spec.workload, search.spec.headroom
    sp = size_pool("prefill", gp, w.rate_rps, search.burst, h, search.ctx.load_s(p))
    sd = size_pool("decode", gd, w.rate_rps, search.burst, h, search.ctx.load_s(d))
    fleet = FleetShape((PoolShape("prefill", p, sp.serving), PoolShape("decode", d, sd.serving)), *kv_link_rates(search, p))
    kind = "heterogeneous" if p.accelerator != d.accelerator else "disaggregated"
    both = _base_steps(search, "prefill", p) + _base_steps(search, "decode", d)
    steps = list(dict.fromkeys(both)) + _pd_steps(search, p, d, sp, sd) + [sp.explain(h), sd.explain(h)]
    if crossing:
        steps.append(crossing)
    return Candidate(f"{kind} P[{p.label}] D[{d.label}]", kind, fleet, {"prefill": sp, "decode": sd}, steps)


def _within_limits(search: Search, c: Candidate) -> str | None:
    return over_limits(search, c.fleet, spares(c.sizings))


def gpus_by_accelerator(fleet: FleetShape, spare: dict[str, int]) -> dict[str, int]:
    """GPUs of each accelerator in a fleet plus `spare` replicas per role."""
    per: dict[str, int] = {}
    for p in fleet.pools:
        per[p.layout.accelerator] = (per.get(p.layout.accelerator, 0)
                                     + (p.replicas + spare.get(p.role, 0)) * p.layout.gpus)
    return per


def over_limits(search: Search, fleet: FleetShape, spare: dict[str, int]) -> str | None:
    """Why a fleet plus `spare` replicas per role exceeds the GPU limits (None when it does not)."""
    per = gpus_by_accelerator(fleet, spare)
    total = sum(per.values())
    if total > search.spec.search.max_gpus:
        return f"needs {total} GPUs with headroom > search.max_gpus={search.spec.search.max_gpus}"
    for acc, n in per.items():
        if n > search.hw.max_gpus[acc]:
            return f"needs {n} {acc} GPUs > {search.hw.max_gpus[acc]} available"
    return None


def run(search: Search) -> None:
    """Colocated, PD and heterogeneous-PD candidates from the measured goodputs, each sized with
    its headroom terms; candidates over the GPU limits are rejected with the count."""
    lists = search.shortlists
    built: list[Candidate | None] = [_colocated(search, lay) for lay in lists["mixed"]]
    for p in lists["prefill"]:
        for d in lists["decode"]:
            hetero = p.accelerator != d.accelerator
            if p.weight_dtype == d.weight_dtype and (not hetero or search.spec.search.heterogeneous):
                built.append(_disaggregated(search, p, d))
    for c in built:
        if c is None:
            continue
        c.cost_per_hour = fleet_cost(search, c.fleet, spares(c.sizings))
        search.sized.append(c)
        why = _within_limits(search, c)
        if why:
            search.rejected.append(Rejection(c.key, why))
        else:
            search.candidates.append(c)
