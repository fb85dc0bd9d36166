"""The planner's output: the stable JSON document (docs/planner.md).

Owns `to_json(search)` (schema `fleetwise-plan/1`): the plans, the SLO they were held to, the GPU
prices they were costed at, where the perf model is uncalibrated, and every candidate and
rejection. Numbers are rounded for stability; the document holds no wall-clock figure except
`search.wall_s`. It is rendered (terminal table, HTML page) from the document alone by
`fleetwise.report.plan_text` and `fleetwise.report.plan_report`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from fleetwise.planner.calibration import calibration, prices
from fleetwise.planner.candidates import candidate_records, pd_sweep
from fleetwise.planner.fleet import fleet_json
from fleetwise.planner.flips import flips_line, plan_flips
from fleetwise.planner.measured import provenance
from fleetwise.planner.simulate import SimVerdict, simulated_policy
from fleetwise.planner.state import Candidate, Search
from fleetwise.spec.plan import PLAN_SEARCH_SCHEMA

if TYPE_CHECKING:
    from fleetwise.planner.results import HeadroomCheck

SCHEMA = PLAN_SEARCH_SCHEMA


def _r(x: float, nd: int = 6) -> float:
    return round(float(x), nd)


def _mean(vs: list[SimVerdict], get: Any) -> float:
    return sum(get(v) for v in vs) / len(vs)


def _ci95(values: list[float]) -> list[float]:
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return [_r(m), _r(m)]
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    h = 1.96 * sd / math.sqrt(n)
    return [_r(max(0.0, m - h)), _r(min(1.0, m + h))]


def _predicted(c: Candidate) -> dict[str, Any]:
    assert c.refined is not None
    s = c.refined.seeds
    return {
        "ttft_p50_s": _r(_mean(s, lambda v: v.ttft["p50"])), "ttft_p99_s": _r(_mean(s, lambda v: v.ttft["p99"])),
        "tpot_p50_s": _r(_mean(s, lambda v: v.tpot["p50"])), "tpot_p99_s": _r(_mean(s, lambda v: v.tpot["p99"])),
        "goodput_rps": _r(_mean(s, lambda v: v.goodput_rps)),
        "slo_attainment": _r(_mean(s, lambda v: v.attainment)),
        "slo_attainment_ci95": _ci95([v.attainment for v in s]),
        "seeds": len(s),
        "kv_transfer_p99_s": _r(_mean(s, lambda v: v.kv_transfer.get("p99_s", 0.0))),
    }


def _evidence(search: Search, c: Candidate) -> list[str]:
    r = c.refined
    assert r is not None
    k = f"p{search.spec.slo.percentile}"
    out = []
    if r.confirm is not None:
        fixed = f"; corrected: {'; '.join(r.corrections)}" if r.corrections else ""
        out.append(f"confirmed in simulation: {r.serving.label} at peak {r.confirm.rate_rps:.2f} req/s -> TTFT {k} "
                   f"{r.confirm.ttft[k] * 1e3:.0f} ms, TPOT {k} {r.confirm.tpot[k] * 1e3:.1f} ms, attainment "
                   f"{r.confirm.attainment:.1%}{fixed}")
    p = _predicted(c)
    lo, hi = p["slo_attainment_ci95"]
    out.append(f"simulated over {p['seeds']} seeds at {search.spec.workload.rate_rps:g} req/s with all "
               f"{r.full.gpus} GPUs: attainment {p['slo_attainment']:.1%} (95% CI {lo:.1%}-{hi:.1%}), "
               f"TTFT p99 {p['ttft_p99_s'] * 1e3:.0f} ms, TPOT p99 {p['tpot_p99_s'] * 1e3:.1f} ms")
    slo = search.spec.slo
    out.extend(h.line(slo.percentile, slo.ttft_s, slo.tpot_s) for h in r.headroom)
    return out


def _check_json(h: HeadroomCheck, pct: int) -> dict[str, Any]:
    v, k = h.verdict, f"p{pct}"
    return {"term": h.term, "role": h.role, "requests": h.requests, "span_s": _r(h.span_s, 3),
            "attainment": _r(v.attainment, 4), f"ttft_{k}_s": _r(v.ttft[k], 4), f"tpot_{k}_s": _r(v.tpot[k], 4),
            "holds": v.passed, "added": h.added}


def _plan_json(search: Search, c: Candidate, rank: int) -> dict[str, Any]:
    assert c.refined is not None
    full = c.refined.full
    flips = plan_flips(search, c)
    rate_out = search.spec.workload.rate_rps * search.stats.output_mean * 3600 / 1e6
    d = {
        "rank": rank,
        "kind": c.kind,
        "pools": [{"role": p.role, "accelerator": p.layout.accelerator, "replicas": p.replicas, "tp": p.layout.tp,
                   "pp": p.layout.pp, "ep": p.layout.ep, "weight_dtype": p.layout.weight_dtype,
                   "kv_dtype": search.spec.kv_dtype, "gpus": p.gpus,
                   "serving_replicas": c.refined.serving.pool(p.role).replicas}
                  for p in full.pools],
        "gpus": full.gpus,
        "cost_per_hour": _r(c.cost_per_hour, 4),
        "cost_per_1m_tokens": _r(c.cost_per_hour / rate_out, 4),
        "predicted": _predicted(c),
        "routing_policy": simulated_policy(search.spec),
        "engine": {"max_num_batched_tokens": 8192, "max_num_seqs": 256},
        "headroom": {role: {"load_replicas": _r(s.load_replicas, 4), "ramp_replicas": _r(s.ramp_replicas, 4),
                            "serving": c.refined.serving.pool(role).replicas, "failures": s.failures,
                            "upgrade": s.upgrade, "burst_factor": _r(s.burst_factor, 4),
                            "added_in_simulation": sum(h.added for h in c.refined.headroom if h.role == role),
                            "goodput_per_replica_rps": _r(s.goodput_per_replica_rps, 4)}
                     for role, s in c.sizings.items()},
        "headroom_checks": [_check_json(h, search.spec.slo.percentile) for h in c.refined.headroom],
        "decision_flips": [f.as_dict() for f in flips],
        "explanation": [*c.steps, *_evidence(search, c), *provenance(search, c), *filter(None, [flips_line(flips)]),
                        f"cost: {full.gpus} GPUs -> ${c.cost_per_hour:.2f}/h, ${c.cost_per_hour / rate_out:.2f} per 1M "
                        f"output tokens at {search.spec.workload.rate_rps:g} req/s"],
    }
    if full.disaggregated:
        d["pd_ratio"] = f"{full.pool('prefill').replicas}:{full.pool('decode').replicas}"
    if c.claims is not None:
        d["claims"] = c.claims.results
        if c.claims.procedure:
            d["upgrade_procedure"] = c.claims.procedure
            d["explanation"] = [*d["explanation"], f"upgrade procedure: {c.claims.procedure} (the rolling-upgrade "  # type: ignore[misc]
                                                   "claim holds with it in simulation)"]
    if c.demoted:
        d["demoted"] = c.demoted
        d["explanation"] = [*d["explanation"], c.demoted]  # type: ignore[misc]
    return d


def to_json(search: Search) -> dict[str, Any]:
    """The stable document (see docs/planner.md)."""
    st, spec = search.stats, search.spec
    return {
        "schema": SCHEMA,
        "name": spec.name,
        "model": search.hw.model.name,
        "workload": {"rate_rps": spec.workload.rate_rps, "burst_factor": _r(search.burst, 4),
                     "burst_source": search.burst_source, "prompt_mean": _r(st.prompt_mean, 2),
                     "prompt_p50": _r(st.prompt_p50, 2), "prompt_p99": _r(st.prompt_p99, 2),
                     "output_mean": _r(st.output_mean, 2), "output_p99": _r(st.output_p99, 2),
                     "over_context": None if search.ctx.mix.over_context is None else
                     {"policy": spec.workload.over_context, **search.ctx.mix.over_context}},
        "slo": spec.slo.model_dump(),
        "prices": prices(search),
        "calibration": calibration(search),
        "plans": [_plan_json(search, c, i + 1) for i, c in enumerate(search.ranked[: search.top_k])],
        "disaggregation": search.disaggregation or None,
        "rejected": [r.as_dict() for r in search.rejected],
        "candidates": candidate_records(search),
        "pd_sweep": pd_sweep(search),
        "infeasible": search.infeasible,
        "fleet": fleet_json(search),
        "search": {"layouts_estimated": len(search.estimates), "candidates_sized": len(search.candidates),
                   "simulations": search.simulations, "wall_s": _r(search.wall_s, 2)},
    }
