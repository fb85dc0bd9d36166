"""Acceptance scenarios: run routing policies against round-robin on named fleet situations.

Owns running every (scenario, policy, seed) through `simulate`, the per-seed figures and the
results document `scenarios.json`. The pieces, one module each, re-exported here: the file
format and loading (`scenario_spec`), the names and numbers (`scenario_constants`), the
across-seed statistics (`scenario_stats`), `aggregate` and the pass rule (`scenario_verdict`),
table rows and Markdown (`scenario_render`). Argument handling and the rich table live in
`fleetwise.cli.scenarios_cmd`.

Seeds: seed k generates the workload with seed k (for a trace workload: replays the window
starting `seed_stride_s * k` into the trace) and seeds the policy with k, so every policy sees
exactly the same requests and faults per seed and differences are paired.

Pass rule (`pass_rule`): the default policy beats round-robin on P99 TTFT with the 95% CI of
the paired difference below zero in the scenarios of `TTFT_RULE_SCENARIOS`, and in every
scenario its mean goodput is at least 95% of round-robin's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetwise.errors import SpecError
from fleetwise.routing.registry import DEFAULT_POLICY, policy_names
from fleetwise.sim.columns import NAN
from fleetwise.sim.results import request_metrics
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.sim.scenario_constants import (
    BASELINE,
    GOODPUT_TOLERANCE,
    METRICS,
    QUEUE_POINTS,
    SCENARIO_NAMES,
    SCHEMA_VERSION,
    TTFT_RULE_SCENARIOS,
)
from fleetwise.sim.scenario_render import TABLE_COLUMNS, Row, render_markdown, table_rows
from fleetwise.sim.scenario_spec import (
    TRACE_LOADS,
    Scenario,
    ScenarioSpec,
    default_scenario_dir,
    load_scenario,
    load_scenarios,
    offered_tokens_per_s,
)
from fleetwise.sim.scenario_verdict import aggregate, pass_rule
from fleetwise.spec.plan import PlanSpec
from fleetwise.spec.routing import RoutingSpec

__all__ = [
    "BASELINE",
    "GOODPUT_TOLERANCE",
    "METRICS",
    "SCENARIO_NAMES",
    "SCHEMA_VERSION",
    "TTFT_RULE_SCENARIOS",
    "TRACE_LOADS",
    "Scenario",
    "ScenarioSpec",
    "aggregate",
    "default_scenario_dir",
    "load_scenario",
    "load_scenarios",
    "offered_tokens_per_s",
    "pass_rule",
    "QUEUE_POINTS",
    "TABLE_COLUMNS",
    "Row",
    "table_rows",
    "Job",
    "with_baseline",
    "render_markdown",
    "run_one",
    "run_scenarios",
]


@dataclass(frozen=True)
class Job:
    """One (scenario, policy, seed) simulation; picklable, so a process pool can run it."""

    scenario: Scenario
    policy: str
    """A policy name, or a variant's label (then `routing` is set)."""
    seed: int
    routing: RoutingSpec | None = None
    """A variant's routing (None: the preset named `policy`)."""


def run_one(job: Job) -> dict[str, Any]:
    """Simulate one job and return its per-seed record (see docs/scenarios.md)."""
    sc = job.scenario.spec
    plan = sc.plan.model_copy(update={"routing": job.routing if job.routing is not None else job.policy})
    reqs, over_context = job.scenario.requests_and_counts(job.seed)
    opts = SimOptions(seed=job.seed, slo=sc.slo, feedback_delay_s=sc.feedback_delay_s)
    res = simulate(plan, reqs, sc.faults, opts)
    s = res.summary
    return {
        "seed": job.seed,
        "ttft_p50_s": s["ttft_s"]["p50"],
        "ttft_p99_s": s["ttft_s"]["p99"],
        "tpot_p50_s": s["tpot_s"]["p50"],
        "tpot_p99_s": s["tpot_s"]["p99"],
        "goodput_rps": s["goodput_rps"],
        "slo_attainment": s["slo_attainment"],
        "requests": s["requests_total"],
        "completed": s["requests_completed"],
        "failed": s["requests_failed"],
        "failure_reasons": s["failure_reasons"],
        "duration_s": s["duration_s"],
        "over_context": {k: over_context[k] for k in ("truncated", "skipped")},
        "per_replica": _per_replica(plan, res.records, s["per_replica"]),
        "per_tenant": per_tenant(res.records),
        "router": {k: s["router"].get(k) for k in ("decisions", "rejected", "by_reason", "by_worker", "safe_mode")},
    }


def per_tenant(rec: Any) -> dict[str, dict[str, Any]]:
    """Per tenant: requests, completed, TTFT p50/p99, TPOT p99 and E2E p50 of its completed
    requests (did a hot tenant hurt the others?)."""
    ttft, tpot, e2e, done = request_metrics(rec, NAN)
    tenants = np.array([r.tenant for r in rec.requests])
    out = {}
    for t in sorted(set(tenants.tolist())):
        mine = tenants == t
        ok = mine & done
        out[t] = {"requests": int(mine.sum()), "completed": int(ok.sum()),
                  "ttft_p50_s": _q(ttft[ok], 50), "ttft_p99_s": _q(ttft[ok], 99),
                  "tpot_p99_s": _q_or_null(tpot[ok & np.isfinite(tpot)], 99), "e2e_p50_s": _q(e2e[ok], 50)}
    return out


def _per_replica(plan: PlanSpec, rec: Any, reps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ttft, _, e2e, done = request_metrics(rec)
    worker = np.frombuffer(rec.worker, dtype=np.int64)
    accel = {p.name: p.accelerator for p in plan.pools}
    out = []
    for i, r in enumerate(reps):
        mine = done & (worker == i)
        t = ttft[mine]
        q_t, q_v = r["queue_length"]["t_s"], r["queue_length"]["value"]
        step = max(1, -(-len(q_t) // QUEUE_POINTS))
        out.append({
            "name": r["name"],
            "pool": r["pool"],
            "accelerator": accel.get(r["pool"], ""),
            "requests": r["requests"],
            "completed": int(mine.sum()),
            "prefix_hit_rate": r["prefix_hit_rate"],
            "ttft_p50_s": _q(t, 50),
            "ttft_p99_s": _q(t, 99),
            "e2e_p50_s": _q(e2e[mine], 50),
            "queue_mean": round(float(np.mean(q_v)), 6) if q_v else 0.0,
            "queue_max": int(max(q_v)) if q_v else 0,
            "queue_length": {"t_s": q_t[::step], "value": q_v[::step]},
            "decisions": r.get("decisions", {}),
        })
    return out


def _q(x: np.ndarray, q: float) -> float:
    return round(float(np.percentile(x, q)), 9) if x.size else 0.0


def _q_or_null(x: np.ndarray, q: float) -> float | None:
    """`_q`, None when there is no sample (an undefined statistic: TPOT of one-token outputs only)."""
    return _q(x, q) if x.size else None


# ---- many runs -------------------------------------------------------------------------------

Mapper = Callable[[Callable[[Job], dict[str, Any]], Sequence[Job]], Iterable[dict[str, Any]]]


def with_baseline(policies: Iterable[str] | None) -> list[str]:
    """The requested policies (default: the default policy) with round-robin added, checked."""
    known = policy_names()
    out = []
    for p in list(policies or [DEFAULT_POLICY]) + [BASELINE]:
        if p not in known:
            raise SpecError(f"unknown policy {p!r}; known: {', '.join(known)}")
        if p not in out:
            out.append(p)
    return out


def run_scenarios(scenarios: Sequence[Scenario], policies: Iterable[str] | None = None, seeds: int = 5,
                  mapper: Mapper | None = None, small: bool = False,
                  on_done: Callable[[Job, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run every scenario x policy (round-robin always included) x seed; the results document.

    `mapper(fn, jobs)` runs the jobs (default: in this process, in order); results are
    assembled by job, so a parallel mapper gives the same document.
    """
    if seeds < 1:
        raise SpecError(f"--seeds={seeds}: need at least one seed (five or more for meaningful intervals)")
    pols = with_baseline(policies)
    for sc in scenarios:  # a request beyond the context is refused before any run (`reject`)
        if sc.over_context == "reject":
            for k in range(seeds):
                sc.requests(k)
    variants = {sc.name: sc.variants() for sc in scenarios}
    jobs = [Job(sc, p, k) for sc in scenarios for p in pols for k in range(seeds)]
    jobs += [Job(sc, label, k, rs) for sc in scenarios for label, rs in variants[sc.name].items() for k in range(seeds)]
    runner = mapper or (lambda fn, js: map(fn, js))
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        sc.name: {p: [] for p in [*pols, *variants[sc.name]]} for sc in scenarios}
    for job, rec in zip(jobs, runner(run_one, jobs), strict=True):
        runs[job.scenario.name][job.policy].append(rec)
        if on_done is not None:
            on_done(job, rec)
    doc: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "default_policy": DEFAULT_POLICY,
        "baseline_policy": BASELINE,
        "policies": list(dict.fromkeys([*pols, *(v for vs in variants.values() for v in vs)])),
        "variants": {name: {label: rs.model_dump(mode="json", exclude_defaults=True) | {"policy": rs.policy}
                            for label, rs in vs.items()} for name, vs in variants.items() if vs},
        "seeds": list(range(seeds)),
        "small": small,
        "scenarios": runs,
        "info": {sc.name: _info(sc) for sc in scenarios},
    }
    doc["stats"] = aggregate(doc)
    doc["verdicts"] = pass_rule(doc)
    doc["passed"] = all(not v.startswith("FAIL") for v in doc["verdicts"])
    return doc


def _info(sc: Scenario) -> dict[str, Any]:
    s = sc.spec
    return {
        "description": s.description,
        "file": sc.path,
        "workload_source": sc.workload_source,
        "notes": list(sc.notes),
        "replicas": [f"{p.replicas}x {p.model} on {p.accelerator} ({p.name}, tp={p.parallelism.tp})"
                     for p in s.plan.pools],
        "slo": s.slo.model_dump(exclude_none=True),
        "faults": [f.model_dump() for f in s.faults.faults],
        "feedback_delay_s": s.feedback_delay_s,
        "over_context": sc.over_context,
        "trace_tokens_per_s": sc.target_tokens_per_s,
    }
