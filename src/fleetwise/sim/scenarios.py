"""Acceptance scenarios: run routing policies against round-robin on named fleet situations.

Owns the scenario file format (a plan + workload + faults + SLO in one YAML, see
docs/scenarios.md), running every (scenario, policy, seed) through `simulate`, the per-seed
figures, the across-seed statistics (`fleetwise.sim.scenario_stats`), the results document
`scenarios.json`, its Markdown rendering and the pass rule. Argument handling and the rich
table live in `fleetwise.cli.scenarios_cmd`.

Seeds: seed k generates the workload with seed k (for a trace workload: replays the window
starting `seed_stride_s * k` into the trace) and seeds the policy with k, so every policy sees
exactly the same requests and faults per seed and differences are paired.

Pass rule (`pass_rule`): the default policy beats round-robin on P99 TTFT with the 95% CI of
the paired difference below zero in `heterogeneous`, `cache-mix`, `long-short`, `slowdown` and
`hot-tenant`, and in every scenario its mean goodput is at least 95% of round-robin's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from fleetwise.core.request import Request
from fleetwise.errors import SpecError
from fleetwise.routing.registry import DEFAULT_POLICY, policy_names
from fleetwise.sim.results import request_metrics
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.sim.scenario_stats import mean_ci, paired_ci
from fleetwise.spec.base import Spec, read_document, validate
from fleetwise.spec.faults import FaultScenario
from fleetwise.spec.plan import PlanSpec
from fleetwise.spec.routing import deep_merge
from fleetwise.spec.slo import SLOSpec
from fleetwise.spec.workload import TraceArrival, WorkloadSpec
from fleetwise.workload.generate import generate

__all__ = [
    "BASELINE",
    "GOODPUT_TOLERANCE",
    "METRICS",
    "SCENARIO_NAMES",
    "SCHEMA_VERSION",
    "TTFT_RULE_SCENARIOS",
    "Scenario",
    "ScenarioSpec",
    "aggregate",
    "default_scenario_dir",
    "load_scenario",
    "load_scenarios",
    "pass_rule",
    "render_markdown",
    "run_one",
    "run_scenarios",
]

SCHEMA_VERSION = "fleetwise-scenarios/1"
BASELINE = "round-robin"
SCENARIO_NAMES = (
    "heterogeneous", "cache-mix", "long-short", "slowdown", "rolling-upgrade", "hot-tenant",
    "stale-control-plane",
)
TTFT_RULE_SCENARIOS = ("heterogeneous", "cache-mix", "long-short", "slowdown", "hot-tenant")
"""Scenarios where the default policy must beat round-robin on P99 TTFT (CI excluding zero)."""
GOODPUT_TOLERANCE = 0.05
"""The default policy's mean goodput may be at most this fraction below round-robin's."""
METRICS = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "goodput_rps", "slo_attainment")
"""Per-seed figures every run records (and the statistics cover)."""
QUEUE_POINTS = 64
"""Per-replica queue-length series are thinned to at most this many points."""


class ScenarioSpec(Spec):
    """One scenario file: a fleet, its traffic, what goes wrong, and the SLO goodput counts."""

    name: str
    """Scenario name (the file is `<name>.yaml`)."""
    description: str = ""
    """One or two sentences: what the scenario exercises and why a policy should win."""
    plan: PlanSpec
    """The fleet; its `routing` is replaced by each policy under test."""
    workload: WorkloadSpec
    """The traffic. A relative trace path is resolved against the repo root, then the file's folder."""
    fallback_workload: WorkloadSpec | None = None
    """Used (with a printed note) when `workload` replays a trace file that is absent."""
    faults: FaultScenario = Field(default_factory=FaultScenario)
    """Faults applied to every run (same times for every seed and policy)."""
    slo: SLOSpec = Field(default_factory=lambda: SLOSpec(ttft_max_s=2.0, tpot_max_s=0.1))
    """Targets a request must meet to count toward goodput and SLO attainment."""
    feedback_delay_s: float = Field(default=0.0, ge=0)
    """Router view refresh period (0: every request routed on a fresh view); see `SimOptions`."""
    seed_stride_s: float = Field(default=0.0, ge=0)
    """Trace workloads: seed k replays from `arrival.start_s + k * seed_stride_s` (trace time)."""
    small: dict[str, Any] = Field(default_factory=dict)
    """Overrides deep-merged onto this document by `--small` (fewer requests, shorter faults)."""


@dataclass(frozen=True)
class Scenario:
    """A loaded scenario: the validated spec, where it came from, and any note for the user."""

    spec: ScenarioSpec
    path: str
    notes: tuple[str, ...] = ()
    workload_source: str = "generated"
    """`generated`, `trace:<path>` (the scenario's trace) or `override:<path>` (--trace)."""

    @property
    def name(self) -> str:
        return self.spec.name

    def requests(self, seed: int) -> list[Request]:
        """The requests of seed `seed` (deterministic)."""
        wl = self.spec.workload
        if isinstance(wl.arrival, TraceArrival) and self.spec.seed_stride_s > 0:
            arrival = wl.arrival.model_copy(update={"start_s": wl.arrival.start_s + seed * self.spec.seed_stride_s})
            wl = wl.model_copy(update={"arrival": arrival})
        reqs = generate(wl, seed)
        if not reqs:
            raise SpecError(f"{self.path}: seed {seed}: the workload produced no requests "
                            "(check num_requests/duration_s, or the trace window of this seed)")
        return reqs


def repo_root() -> Path:
    """The checkout this package is installed from (src/fleetwise/sim -> repo)."""
    return Path(__file__).resolve().parents[3]


def default_scenario_dir() -> Path:
    """`examples/scenarios` of the current directory if it exists, else of the checkout."""
    here = Path("examples") / "scenarios"
    return here if here.is_dir() else repo_root() / "examples" / "scenarios"


def _resolve_trace(path: str, base: Path) -> Path | None:
    p = Path(path)
    if p.is_absolute():
        return p if p.is_file() else None
    for root in (base.parent.parent, repo_root(), base, Path.cwd()):
        if (root / p).is_file():
            return (root / p).resolve()
    return None


def load_scenario(path: str | Path, small: bool = False, trace: str | None = None,
                  trace_rate_rps: float | None = None, trace_requests: int | None = None,
                  seeds: int = 5) -> Scenario:
    """Read a scenario file; `small` applies its `small:` overrides; `trace` replaces its workload.

    With `trace`, seed k replays the k-th of `seeds` consecutive windows of the file (each
    `trace_requests` long, default: an equal share of the file), rescaled to `trace_rate_rps`
    when given.
    """
    p = Path(path)
    data = read_document(p)
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    if small:
        data = deep_merge(data, data.get("small") or {})
    spec = validate(ScenarioSpec, data, str(p))
    notes: list[str] = []
    source = "generated"
    if trace is not None:
        spec, source = _with_trace(spec, trace, trace_rate_rps, trace_requests, seeds)
    elif isinstance(ta := spec.workload.arrival, TraceArrival):
        found = _resolve_trace(ta.path, p.parent)
        if found is not None:
            arrival = ta.model_copy(update={"path": str(found)})
            spec = spec.model_copy(update={"workload": spec.workload.model_copy(update={"arrival": arrival})})
            source = f"trace:{ta.path}"
        elif spec.fallback_workload is not None:
            notes.append(f"{spec.name}: trace {ta.path} not found; using the generated "
                         "fallback_workload instead")
            spec = spec.model_copy(update={"workload": spec.fallback_workload, "seed_stride_s": 0.0})
        else:
            raise SpecError(f"{p}: workload.arrival.path={ta.path!r}: trace file not found "
                            "(relative paths are resolved against the repo root and the scenario's folder)")
    spec.plan.check(where=str(p))
    return Scenario(spec, str(p), tuple(notes), source)


def _with_trace(spec: ScenarioSpec, trace: str, rate_rps: float | None, max_requests: int | None,
                seeds: int) -> tuple[ScenarioSpec, str]:
    from fleetwise.workload.traces import read_trace

    table = read_trace(trace)
    n = max(1, len(table) // max(seeds, 1)) if max_requests is None else max_requests
    stride = 0.0
    if table.arrival_s is not None and len(table) > 1:
        t = table.arrival_s - table.arrival_s[0]
        k = min(n, len(t) - 1)
        stride = float(t[k]) if seeds > 1 else 0.0
    arrival = TraceArrival(path=str(Path(trace).resolve()), format=table.format, rate_rps=rate_rps,  # type: ignore[arg-type]
                           max_requests=n)
    wl = WorkloadSpec(arrival=arrival, lengths=None)
    return spec.model_copy(update={"workload": wl, "seed_stride_s": stride}), f"override:{trace}"


def load_scenarios(names: Iterable[str] | None = None, directory: str | Path | None = None,
                   **kwargs: Any) -> list[Scenario]:
    """Load the named scenarios (default: all of `SCENARIO_NAMES`) from `directory`."""
    d = Path(directory) if directory is not None else default_scenario_dir()
    wanted = list(names) if names else list(SCENARIO_NAMES)
    out = []
    for name in wanted:
        path = d / f"{name}.yaml"
        if not path.is_file():
            known = sorted(q.stem for q in d.glob("*.yaml"))
            raise SpecError(f"scenario {name!r}: no file {path}; known scenarios: {', '.join(known) or 'none'}")
        out.append(load_scenario(path, **kwargs))
    return out


# ---- one run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One (scenario, policy, seed) simulation; picklable, so a process pool can run it."""

    scenario: Scenario
    policy: str
    seed: int


def run_one(job: Job) -> dict[str, Any]:
    """Simulate one job and return its per-seed record (see docs/scenarios.md)."""
    sc = job.scenario.spec
    plan = sc.plan.model_copy(update={"routing": job.policy})
    reqs = job.scenario.requests(job.seed)
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
        "per_replica": _per_replica(plan, res.records, s["per_replica"]),
        "router": {k: s["router"].get(k) for k in ("decisions", "rejected", "by_reason", "by_worker", "safe_mode")},
    }


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
        })
    return out


def _q(x: np.ndarray, q: float) -> float:
    return round(float(np.percentile(x, q)), 9) if x.size else 0.0


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
    jobs = [Job(sc, p, k) for sc in scenarios for p in pols for k in range(seeds)]
    runner = mapper or (lambda fn, js: map(fn, js))
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {sc.name: {p: [] for p in pols} for sc in scenarios}
    for job, rec in zip(jobs, runner(run_one, jobs), strict=True):
        runs[job.scenario.name][job.policy].append(rec)
        if on_done is not None:
            on_done(job, rec)
    doc: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "default_policy": DEFAULT_POLICY,
        "baseline_policy": BASELINE,
        "policies": pols,
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
    }


def aggregate(doc: dict[str, Any]) -> dict[str, Any]:
    """Per scenario and policy: each metric's mean and 95% CI over seeds, and the paired
    difference against round-robin (`vs_baseline`: policy minus round-robin, same seeds)."""
    base = doc.get("baseline_policy", BASELINE)
    out: dict[str, Any] = {}
    for name, by_pol in doc["scenarios"].items():
        out[name] = {}
        ref = _by_seed(by_pol.get(base, []))
        for pol, runs in by_pol.items():
            mine = _by_seed(runs)
            st: dict[str, Any] = {m: mean_ci([r[m] for r in mine.values()]).to_dict() for m in METRICS}
            common = sorted(set(mine) & set(ref))
            if pol != base and common:
                st["vs_baseline"] = {m: paired_ci([mine[k][m] for k in common], [ref[k][m] for k in common]).to_dict()
                                     for m in METRICS}
                g_ref = np.mean([ref[k]["goodput_rps"] for k in common])
                g = np.mean([mine[k]["goodput_rps"] for k in common])
                st["goodput_ratio"] = round(float(g / g_ref), 6) if g_ref > 0 else None
            out[name][pol] = st
    return out


def _by_seed(runs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {int(r["seed"]): r for r in runs}


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def pass_rule(doc: dict[str, Any], default_policy: str | None = None) -> list[str]:
    """Verdict lines (`PASS ...`, `FAIL ...` or `SKIP ...`) of the pass rule on a results document.

    For each scenario present: in `TTFT_RULE_SCENARIOS` the paired P99 TTFT difference (default
    minus round-robin) must have its whole 95% CI below zero; in every scenario the default's mean
    goodput must be at least `1 - GOODPUT_TOLERANCE` times round-robin's (means over the common seeds).
    """
    dflt = default_policy or doc.get("default_policy", DEFAULT_POLICY)
    base = doc.get("baseline_policy", BASELINE)
    lines = []
    for name, by_pol in doc["scenarios"].items():
        if dflt not in by_pol or base not in by_pol:
            lines.append(f"SKIP {name}: needs both {dflt} and {base} runs")
            continue
        mine, ref = _by_seed(by_pol[dflt]), _by_seed(by_pol[base])
        common = sorted(set(mine) & set(ref))
        if not common:
            lines.append(f"SKIP {name}: no seed run by both {dflt} and {base}")
            continue
        if name in TTFT_RULE_SCENARIOS:
            d = paired_ci([mine[k]["ttft_p99_s"] for k in common], [ref[k]["ttft_p99_s"] for k in common])
            ok = d.hi is not None and d.hi < 0
            lines.append(
                f"{'PASS' if ok else 'FAIL'} {name}: P99 TTFT {dflt} - {base} = {d.mean:+.3f} s "
                f"[95% CI {_fmt(d.lo)}, {_fmt(d.hi)}] over {d.n} seeds"
                + ("" if ok else (" (CI undefined: need 2+ seeds)" if d.hi is None else " (CI does not exclude zero)"
                                  if d.mean < 0 else " (not better)")))
        g = float(np.mean([mine[k]["goodput_rps"] for k in common]))
        g_ref = float(np.mean([ref[k]["goodput_rps"] for k in common]))
        ratio = g / g_ref if g_ref > 0 else (1.0 if g >= g_ref else 0.0)
        ok = ratio >= 1 - GOODPUT_TOLERANCE
        lines.append(f"{'PASS' if ok else 'FAIL'} {name}: goodput {dflt} {g:.3f} vs {base} {g_ref:.3f} req/s "
                     f"({(ratio - 1) * 100:+.1f}%, floor -{GOODPUT_TOLERANCE * 100:.0f}%)")
    return lines


# ---- rendering -------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the results table (scenario x policy), every figure already formatted."""

    scenario: str
    policy: str
    cells: dict[str, str] = field(default_factory=dict)


TABLE_COLUMNS = ("TTFT p50 s", "TTFT p99 s", "dP99 vs RR s", "TPOT p99 ms", "goodput rps", "dGoodput", "SLO att.")


def _ci(st: dict[str, Any], scale: float = 1.0, digits: int = 3) -> str:
    m, lo, hi = st["mean"], st["ci95_lo"], st["ci95_hi"]
    if lo is None or hi is None:
        return f"{m * scale:.{digits}f}"
    return f"{m * scale:.{digits}f} ±{(hi - lo) / 2 * scale:.{digits}f}"


def _interval(st: dict[str, Any]) -> str:
    lo, hi = st["ci95_lo"], st["ci95_hi"]
    ci = f" [{lo:+.3f}, {hi:+.3f}]" if lo is not None and hi is not None else ""
    return f"{st['mean']:+.3f}{ci}"


def table_rows(doc: dict[str, Any]) -> list[Row]:
    """The summary table: per scenario and policy, means ± CI half-widths and paired deltas."""
    rows = []
    for name, by_pol in doc["stats"].items():
        for pol, st in by_pol.items():
            vs = st.get("vs_baseline")
            ratio = st.get("goodput_ratio")
            rows.append(Row(name, pol, {
                "TTFT p50 s": _ci(st["ttft_p50_s"]),
                "TTFT p99 s": _ci(st["ttft_p99_s"]),
                "dP99 vs RR s": _interval(vs["ttft_p99_s"]) if vs else "-",
                "TPOT p99 ms": _ci(st["tpot_p99_s"], 1e3, 1),
                "goodput rps": _ci(st["goodput_rps"], 1.0, 2),
                "dGoodput": f"{(ratio - 1) * 100:+.1f}%" if ratio is not None else "-",
                "SLO att.": _ci(st["slo_attainment"], 100.0, 1) + "%",
            }))
    return rows


def render_markdown(doc: dict[str, Any]) -> str:
    """`scenarios.md`: the summary table, per-replica detail of seed 0, and the verdicts."""
    seeds = len(doc.get("seeds", []))
    out = [
        "# fleetwise scenarios",
        "",
        f"Default policy `{doc['default_policy']}` vs `{doc['baseline_policy']}`; {seeds} seeds"
        f"{' (small scenarios)' if doc.get('small') else ''}. Figures are means over seeds ± the half-width of "
        "the 95% t-interval; `dP99 vs RR` is the paired difference policy minus round-robin [95% CI] "
        "(negative = faster than round-robin); `dGoodput` is the ratio of mean goodputs minus 1.",
        "",
        "| scenario | policy | " + " | ".join(TABLE_COLUMNS) + " |",
        "|---|---|" + "---|" * len(TABLE_COLUMNS),
    ]
    for r in table_rows(doc):
        out.append(f"| {r.scenario} | {r.policy} | " + " | ".join(r.cells[c] for c in TABLE_COLUMNS) + " |")
    out += ["", "## Verdicts", ""] + [f"- {v}" for v in doc["verdicts"]]
    out += ["", "## Per replica (seed 0)", ""]
    for name, by_pol in doc["scenarios"].items():
        info = doc.get("info", {}).get(name, {})
        out += [f"### {name}", "", info.get("description", ""), ""]
        for note in info.get("notes", []):
            out.append(f"> note: {note}")
        out += ["| policy | replica | accelerator | requests | prefix hit | TTFT p50 s | TTFT p99 s | queue mean/max |",
                "|---|---|---|---|---|---|---|---|"]
        for pol, runs in by_pol.items():
            if not runs:
                continue
            for rep in runs[0]["per_replica"]:
                out.append(f"| {pol} | {rep['name']} | {rep['accelerator']} | {rep['requests']} | "
                           f"{rep['prefix_hit_rate']:.1%} | {rep['ttft_p50_s']:.3f} | {rep['ttft_p99_s']:.3f} | "
                           f"{rep['queue_mean']:.1f}/{rep['queue_max']} |")
        out.append("")
        for pol, runs in by_pol.items():
            if runs:
                reasons = ", ".join(f"{k} {v}" for k, v in (runs[0]["router"].get("by_reason") or {}).items())
                out.append(f"- {pol} selection reasons: {reasons}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
