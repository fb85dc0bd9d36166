"""Phase 6, disaggregation: colocate or split, and the claims a PD plan rests on.

Owns the colocated-vs-PD comparison at equal GPU count (the verdict and its terms) and, for a
PD plan that met the SLO (each one the checks phase checks), its claims measured in simulation by what each claims: prefill and
decode apart (interference removed), the KV hand-off bounded, the two pools balanced at the
target rate and under a shifted input/output ratio, and the faults the headroom asks for (a
prefill crash; a rolling upgrade of both pools, by the procedure that keeps compatible pairs: in
matched slices, else both pools at once). A failed claim demotes the plan (ranking), naming by
how much it failed. Does not size or rank.
"""

from __future__ import annotations

from typing import Any

from fleetwise.planner.executor import Executor
from fleetwise.planner.goodput import kv_link_rates
from fleetwise.planner.layout import Layout
from fleetwise.planner.results import Claims
from fleetwise.planner.simulate import FleetRun, FleetShape, PoolShape, SimVerdict, requests_for, run_fleet
from fleetwise.planner.state import Candidate, Context, Search
from fleetwise.planner.workload import LengthMix
from fleetwise.spec.faults import FaultScenario, ReplicaCrash, RollingUpgrade
from fleetwise.spec.planning import PlanSLOSpec

APART_TAIL = 1.5
"""Decode steps free of prompt chunks show as a short TPOT tail: p99 within 1.5x of p50 (a prompt
chunk in a decode step stretches it several-fold)."""


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


def _shift_run(ctx: Context, full: FleetShape, factor: float) -> FleetRun:
    """The balance claim's run under a shifted input/output ratio: the target rate, seed 0."""
    return FleetRun(_shifted(ctx.mix, factor), full, ctx.spec.workload.rate_rps, 0)


def _fault_run(ctx: Context, full: FleetShape, scen: FaultScenario) -> FleetRun:
    """A fault claim's run under one procedure: the target rate, seed 1."""
    return FleetRun(ctx.mix, full, ctx.spec.workload.rate_rps, 1, scen)


def claim_runs(ctx: Context, full: FleetShape) -> list[FleetRun]:
    """The runs `check_claims` makes when each fault claim holds with its first procedure."""
    return ([_shift_run(ctx, full, f) for f in (MIX_SHIFT, 1 / MIX_SHIFT)]
            + [_fault_run(ctx, full, procs[0][1]) for _, procs in _fault_scenarios(ctx, full)])


def check_claims(ctx: Context, full: FleetShape, colocated_tpot_p99_s: float | None,
                 base: SimVerdict) -> Claims:
    """Each claim measured by what it claims: interference removed, KV transfer bounded, pools
    balanced at the target rate and under a shifted input/output ratio, a prefill crash and a
    rolling upgrade of both pools survived (`_fault_claims`)."""
    slo, rate = ctx.spec.slo, ctx.spec.workload.rate_rps
    key = f"p{slo.percentile}"
    res: list[dict[str, object]] = []
    tail = base.tpot["p99"] / base.tpot["p50"] if base.tpot["p50"] > 0 else 1.0
    apart = tail <= APART_TAIL
    ref = (f"; the best colocated plan's TPOT p99 at the same rate is {colocated_tpot_p99_s * 1e3:.1f} ms"
           if colocated_tpot_p99_s else "")
    ev = (f"decode TPOT p99/p50 = {base.tpot['p99'] * 1e3:.1f}/{base.tpot['p50'] * 1e3:.1f} ms = {tail:.2f} "
          f"(bound {APART_TAIL:g}: no prompt chunk stretches a decode step){ref}")
    res.append({"claim": "prefill and decode run apart", "holds": apart, "evidence": ev,
                "short_by": "" if apart else f"TPOT p99/p50 {tail:.2f} is {tail - APART_TAIL:.2f} over the "
                                             f"{APART_TAIL:g} bound"})
    kv99 = base.kv_transfer.get("p99_s", 0.0)
    kv_ok = kv99 <= KV_SHARE * slo.ttft_s
    res.append({"claim": "KV transfer cost stays bounded", "holds": kv_ok,
                "evidence": f"transfer p99 {kv99 * 1e3:.1f} ms = {kv99 / slo.ttft_s:.0%} of the TTFT target "
                            f"(bound: {KV_SHARE:.0%})",
                "short_by": "" if kv_ok else f"transfer p99 {kv99 * 1e3:.0f} ms is "
                                             f"{(kv99 - KV_SHARE * slo.ttft_s) * 1e3:.0f} ms over the "
                                             f"{KV_SHARE * slo.ttft_s * 1e3:.0f} ms bound"})
    runs = 0
    pq, dw = base.waits.get("prefill_queue", 0.0), base.waits.get("decode_wait", 0.0)
    bound = BALANCE_WAIT_SHARE * slo.ttft_s
    util = ", ".join(f"{r} {u:.0%}" for r, u in sorted(base.utilization.items()))
    shifts = []
    for f in (MIX_SHIFT, 1 / MIX_SHIFT):
        v = _shift_run(ctx, full, f).verdict(ctx.spec, ctx.prices)
        runs += 1
        shifts.append((f, v))
    bal = pq <= bound and dw <= bound and all(v.passed for _, v in shifts)
    shift_ev = "; ".join(f"prompts x{f:.2f}/outputs /{f:.2f}: attainment {v.attainment:.1%}, TTFT {key} "
                         f"{v.ttft[key] * 1e3:.0f} ms, TPOT {key} {v.tpot[key] * 1e3:.1f} ms "
                         f"({'meets' if v.passed else 'MISSES'} the SLO)" for f, v in shifts)
    res.append({"claim": "the two pools' queues balance", "holds": bal,
                "evidence": f"at {rate:g} req/s: prefill queue {key} {pq * 1e3:.0f} ms, decode admission wait {key} "
                            f"{dw * 1e3:.0f} ms (each bound {bound * 1e3:.0f} ms = {BALANCE_WAIT_SHARE:.0%} of TTFT), "
                            f"utilisation {util or 'n/a'}; under a shifted input/output ratio: {shift_ev}",
                "short_by": "" if bal else _balance_shortfall(pq, dw, bound, shifts, slo)})
    fault_res, fault_runs = _fault_claims(ctx, full)
    return Claims(res + fault_res, runs + fault_runs)


def _balance_shortfall(pq: float, dw: float, bound: float, shifts: list[tuple[float, SimVerdict]],
                       slo: PlanSLOSpec) -> str:
    """By how much the pools fail to balance: each queue over its bound, each shifted mix's miss."""
    out = [f"{name} {w * 1e3:.0f} ms is {(w - bound) * 1e3:.0f} ms over the {bound * 1e3:.0f} ms bound"
           for name, w in (("prefill queue", pq), ("decode admission wait", dw)) if w > bound]
    out += [f"prompts x{f:.2f}: {shortfall(v, slo)}" for f, v in shifts if not v.passed]
    return "; ".join(out)


def shortfall(v: SimVerdict, slo: PlanSLOSpec) -> str:
    """By how much a run misses the SLO: each figure past its target and the gap ("" when none is)."""
    key = f"p{slo.percentile}"
    out = []
    if v.attainment < slo.attainment:
        out.append(f"attainment {v.attainment:.1%} is {(slo.attainment - v.attainment) * 100:.1f} points under the "
                   f"{slo.attainment:.0%} required")
    for name, got, target in (("TTFT", v.ttft[key], slo.ttft_s), ("TPOT", v.tpot[key], slo.tpot_s)):
        if got > target:
            out.append(f"{name} {key} {got * 1e3:.1f} ms is {(got - target) * 1e3:.1f} ms over the "
                       f"{target * 1e3:g} ms target")
    return "; ".join(out)


def _fault_claims(ctx: Context, full: FleetShape) -> tuple[list[dict[str, object]], int]:
    """Each fault claim, measured under every procedure the plan may follow; the claim holds
    with the first procedure (in `_fault_scenarios` order) whose run meets the SLO, which the
    plan then names, else fails by the best procedure's shortfall."""
    slo, key = ctx.spec.slo, f"p{ctx.spec.slo.percentile}"
    res: list[dict[str, object]] = []
    runs = 0
    for what, procedures in _fault_scenarios(ctx, full):
        tried = []
        for proc, scen in procedures:
            v = _fault_run(ctx, full, scen).verdict(ctx.spec, ctx.prices)
            runs += 1
            tried.append((proc, v))
            if v.passed:
                break
        proc, v = next(((p, v) for p, v in tried if v.passed), max(tried, key=lambda t: t[1].attainment))
        reasons = ", ".join(f"{k} {n}" for k, n in sorted(v.failure_reasons.items())) or "none"
        ev = (f"attainment {v.attainment:.1%} (required {slo.attainment:.0%}), {v.retried} request(s) routed "
              f"again, {v.failed} failed ({reasons}), TTFT {key} {v.ttft[key] * 1e3:.0f} ms, TPOT {key} "
              f"{v.tpot[key] * 1e3:.1f} ms")
        r: dict[str, object] = {"claim": f"service survives {what}", "holds": v.passed, "evidence": ev,
                                "short_by": "" if v.passed else shortfall(v, slo)}
        if len(procedures) > 1:
            r["procedure"] = proc if v.passed else None
            misses = [f"{p}: misses ({shortfall(t, slo)})" for p, t in tried if not t.passed]
            r["evidence"] = "; ".join([*misses, f"{'with' if v.passed else 'best,'} {proc}: {ev}"])
        res.append(r)
    return res, runs


def _fault_scenarios(ctx: Context, full: FleetShape) -> list[tuple[str, list[tuple[str, FaultScenario]]]]:
    """The fault claims the headroom policy makes, each with the procedures that may meet it: a
    crash when it keeps failure spares; when it plans rolling upgrades, an upgrade of both pools
    in matched slices (each version keeps a prefill and a decode replica that can pair), else
    both pools at once (the router pairs within a version; a replica of a version with no partner
    idles)."""
    rate, h = ctx.spec.workload.rate_rps, ctx.spec.headroom
    span = requests_for(rate, ctx.spec.search.sample_requests) / rate  # the run's traffic, not the whole mix
    at = round(span / 4, 3)
    crash = FaultScenario(name="prefill crash", faults=[ReplicaCrash(
        replica="prefill-0", at_s=at, restart_after_s=ctx.spec.headroom.cold_start_s)])
    back, b = min(30.0, ctx.spec.headroom.cold_start_s), max(1, h.upgrade_batch_replicas)
    matched = FaultScenario(name="upgrade", faults=[RollingUpgrade(
        pool="prefill", matched_with="decode", start_s=at, new_model_version="v2", restart_after_s=back, batch=b)])
    both = FaultScenario(name="upgrade", faults=[RollingUpgrade(
        pool=role, start_s=at, new_model_version="v2", restart_after_s=back, batch=b) for role in ("prefill", "decode")])
    out: list[tuple[str, list[tuple[str, FaultScenario]]]] = []
    if h.failures_to_survive > 0:
        out.append((f"a prefill replica crash at {at:g} s (restart after {h.cold_start_s:g} s)", [("restart", crash)]))
    if h.upgrade_batch_replicas > 0:
        n = "one replica" if b == 1 else f"{b} replicas"
        out.append(("a rolling upgrade of both pools", [
            (UPGRADE_MATCHED.format(n=n), matched), (UPGRADE_BOTH.format(n=n), both)]))
    return out


UPGRADE_MATCHED = "matched slices ({n} at a time, alternating pools by upgraded share)"
"""The P/D upgrade procedure that keeps a compatible prefill/decode pair of each version up
(`{n}`: the upgrade batch, `headroom.upgrade_batch_replicas`)."""
UPGRADE_BOTH = "both pools at once ({n} of each pool at a time)"
"""The P/D upgrade procedure that upgrades the two pools side by side."""


def _equal_cost_task(ctx: Context, fleet: FleetShape) -> SimVerdict:
    return run_fleet(ctx.spec, ctx.mix, fleet, ctx.prices, ctx.peak_rps, seed=0)


def reference_colocated(search: Search) -> Candidate | None:
    """The cheapest refined colocated plan that met the SLO (the first refined among equals): the
    equal-cost verdict splits its GPUs, and each P/D claim quotes its TPOT."""
    ok = [c for c in search.refined if c.kind == "colocated" and c.refined and c.refined.passed]
    return min(ok, key=lambda c: c.cost_per_hour, default=None)


def run(search: Search, ex: Executor) -> None:
    """The equal-cost colocate-or-split verdict (each P/D plan's claims are checked with its
    headroom, `checks`)."""
    colo = reference_colocated(search)
    if colo is not None and colo.refined:
        _equal_cost(search, search.ctx, ex, colo)


def _equal_cost(search: Search, ctx: Context, ex: Executor, colo: Candidate) -> None:
    assert colo.refined is not None
    pool = colo.refined.serving.pools[0]
    lay, n = pool.layout, pool.replicas
    e = search.estimates[lay]
    if n < 2 or e.mu_prefill_rps <= 0 or e.mu_decode_rps <= 0:
        search.disaggregation = {"verdict": "colocate", "reason": f"the colocated plan has {n} serving replica(s): "
                                 "too few to split into prefill and decode pools at equal cost"}
        return
    share = (1 / e.mu_prefill_rps) / (1 / e.mu_prefill_rps + 1 / e.mu_decode_rps)
    p = min(n - 1, max(1, round(n * share)))
    pd = FleetShape((PoolShape("prefill", lay, p), PoolShape("decode", lay, n - p)), *kv_link_rates(search, lay))
    # The colocated side is the refinement's confirmation: the serving fleet at peak rate, seed 0.
    v_colo = colo.refined.confirm
    todo = [colo.refined.serving, pd] if v_colo is None else [pd]
    done = ex.map(_equal_cost_task, ctx, todo)
    search.simulations += len(todo)
    v_pd = done[-1]
    v_colo = v_colo if v_colo is not None else done[0]
    search.disaggregation = _verdict(search, lay, n, p, v_colo, v_pd)


def _verdict(search: Search, lay: Layout, n: int, p: int, vc: SimVerdict, vp: SimVerdict) -> dict[str, Any]:
    st, slo = search.stats, search.spec.slo
    model, kv_dtype = search.hw.model, search.spec.kv_dtype
    kvb = model.kv_bytes_per_token(kv_dtype)
    pd_better = (vp.attainment, vp.goodput_rps) > (vc.attainment, vc.goodput_rps)
    terms = {
        "interference_removed": f"TPOT p99 {vc.tpot['p99'] * 1e3:.1f} ms colocated -> {vp.tpot['p99'] * 1e3:.1f} ms "
                                "with decode steps free of prompt chunks",
        "kv_bytes_per_request": f"mean {model.kv_bytes(st.prompt_mean, kv_dtype) / 1e6:.0f} MB, p99 "
                                f"{model.kv_bytes(st.prompt_p99, kv_dtype) / 1e6:.0f} MB "
                                f"({kvb / 1e3:.0f} kB per prompt token)",
        "kv_transfer_p99_s": vp.kv_transfer.get("p99_s", 0.0),
        "extra_failure_surface": "each request now needs a prefill replica, a decode replica and the KV link; "
                                 "two pools each need their own failure spares",
    }
    return {
        "verdict": "disaggregate" if pd_better else "colocate",
        "pd_split": [p, n - p],
        "equal_cost": f"{n} x {lay.label}: colocated vs {p} prefill + {n - p} decode, at "
                      f"{search.spec.workload.rate_rps * search.burst:.2f} req/s (peak)",
        "colocated": {"slo_attainment": vc.attainment, "goodput_rps": vc.goodput_rps,
                      "ttft_p99_s": vc.ttft["p99"], "tpot_p99_s": vc.tpot["p99"], "passed": vc.passed},
        "disaggregated": {"slo_attainment": vp.attainment, "goodput_rps": vp.goodput_rps,
                          "ttft_p99_s": vp.ttft["p99"], "tpot_p99_s": vp.tpot["p99"], "passed": vp.passed},
        "terms": terms,
        "reason": (f"at equal cost the PD split {'beats' if pd_better else 'does not beat'} colocation: attainment "
                   f"{vp.attainment:.1%} vs {vc.attainment:.1%} (target {slo.attainment:.0%}), goodput "
                   f"{vp.goodput_rps:.2f} vs {vc.goodput_rps:.2f} req/s"),
    }
