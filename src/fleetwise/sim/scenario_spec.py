"""The scenario file format (a plan + workload + faults + SLO in one YAML, see docs/scenarios.md)
and loading it, with the `small:` overrides and trace replacement."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from fleetwise.core.request import Request
from fleetwise.errors import SpecError
from fleetwise.sim.scenario_constants import SCENARIO_NAMES
from fleetwise.spec.base import Spec, read_document, top_mapping, validate
from fleetwise.spec.faults import FaultScenario, version_skew_warnings
from fleetwise.spec.plan import PlanSpec
from fleetwise.spec.routing import DEFAULT_POLICY, PRESETS, RoutingSpec, deep_merge
from fleetwise.spec.slo import SLOSpec
from fleetwise.spec.workload import TraceArrival, TraceColumns, WorkloadSpec
from fleetwise.workload.context import apply_context_limit, plan_context_tokens
from fleetwise.workload.generate import generate

TRACE_LOADS = ("recorded", "scenario")
"""How `--trace` windows are timed: as recorded (or at `--trace-rate`), or each scaled to the
scenario's own offered token load."""


UNTIMED_RATE_RPS = 1.0
"""Poisson rate drawn for a trace without timestamps before `--trace-load scenario` rescales it
(any rate: only the window's time scale changes, by one factor)."""


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
    tenant_regions: dict[str, str] = Field(default_factory=dict)
    """Tenant -> region: every request of the tenant names that region (its clients are there and
    its data must stay there; the router keeps it in the region while a replica there is up)."""
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Extra runs beside the policies under test: label -> `RoutingSpec` fields deep-merged onto
    `{policy: fleetwise-default}` (e.g. another safe-mode action). Reported side by side, paired
    against round-robin like a policy; the pass rule judges the default policy only."""

    @field_validator("variants")
    @classmethod
    def _routing_variants(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for label, fields in v.items():
            if label in PRESETS:
                raise ValueError(f"variants.{label}: a label must differ from every policy name; "
                                 "name the variant by what it changes, e.g. 'safe-mode off'")
            variant_routing(fields)
        return v

    @model_validator(mode="after")
    def _regions_exist(self) -> ScenarioSpec:
        tenants = {t.name for t in self.workload.tenants}
        regions = sorted({p.region for p in self.plan.pools})
        for tenant, region in self.tenant_regions.items():
            if tenant not in tenants:
                raise ValueError(f"tenant_regions.{tenant}: no such tenant in workload.tenants "
                                 f"({', '.join(sorted(tenants)) or 'none'}); name one of them")
            if region not in regions:
                raise ValueError(f"tenant_regions.{tenant}={region!r}: no pool is in that region; "
                                 f"regions of the plan: {', '.join(regions)}")
        return self


def variant_routing(fields: dict[str, Any]) -> RoutingSpec:
    """The routing of a scenario variant: `fields` deep-merged onto the default policy's spec."""
    return RoutingSpec.model_validate(deep_merge({"policy": DEFAULT_POLICY}, fields))


@dataclass(frozen=True)
class Scenario:
    """A loaded scenario: the validated spec, where it came from, and any note for the user."""

    spec: ScenarioSpec
    path: str
    notes: tuple[str, ...] = ()
    workload_source: str = "generated"
    """`generated`, `trace:<path>` (the scenario's trace) or `override:<path>` (--trace)."""
    over_context: str = "reject"
    """What a request beyond the plan's context (or an empty one) does: `OVER_CONTEXT_POLICIES`."""
    target_tokens_per_s: float | None = None
    """When set, each seed's requests are stretched or compressed in time so that their offered
    load (prompt + output tokens per second over the window) equals this (`--trace-load scenario`)."""

    @property
    def name(self) -> str:
        return self.spec.name

    def variants(self) -> dict[str, RoutingSpec]:
        """Label -> routing of each variant run of this scenario (see `ScenarioSpec.variants`)."""
        return {label: variant_routing(fields) for label, fields in self.spec.variants.items()}

    def requests(self, seed: int) -> list[Request]:
        """The requests of seed `seed` (deterministic), fitted to the plan's context."""
        return self.requests_and_counts(seed)[0]

    def requests_and_counts(self, seed: int) -> tuple[list[Request], dict[str, int]]:
        """The requests of seed `seed` and the over-context counts {max_context_tokens, truncated,
        skipped}; `reject` raises SpecError naming the first request that does not fit."""
        wl = self.spec.workload
        if isinstance(wl.arrival, TraceArrival) and self.spec.seed_stride_s > 0:
            arrival = wl.arrival.model_copy(update={"start_s": wl.arrival.start_s + seed * self.spec.seed_stride_s})
            wl = wl.model_copy(update={"arrival": arrival})
        reqs = generate(wl, seed)
        if self.spec.tenant_regions:
            home = self.spec.tenant_regions
            reqs = [replace(r, region=home[r.tenant]) if r.tenant in home else r for r in reqs]
        if not reqs:
            raise SpecError(f"{self.path}: seed {seed}: the workload produced no requests "
                            "(check num_requests/duration_s, or the trace window of this seed)")
        if self.target_tokens_per_s is not None:
            reqs = at_token_load(reqs, self.target_tokens_per_s)
        where = self.workload_source.removeprefix("override:") if self.workload_source.startswith("override:") \
            else self.path
        reqs, counts = apply_context_limit(reqs, plan_context_tokens(self.spec.plan), self.over_context,
                                           f"{where}: seed {seed}")
        if not reqs:
            raise SpecError(f"{where}: seed {seed}: --over-context={self.over_context} skipped every request; "
                            f"none fits the model's context of {counts['max_context_tokens']:,} tokens")
        return reqs, counts


def offered_tokens_per_s(reqs: list[Request]) -> float | None:
    """Prompt + output tokens of `reqs` per second of their arrival span (None: a zero span)."""
    span = reqs[-1].arrival_s - reqs[0].arrival_s if reqs else 0.0
    return sum(r.prompt_tokens + r.output_tokens for r in reqs) / span if span > 0 else None


def at_token_load(reqs: list[Request], tokens_per_s: float) -> list[Request]:
    """`reqs` (in arrival order) with their gaps scaled so their offered load is `tokens_per_s`:
    the first arrival stays, the order and the relative burstiness are kept."""
    now = offered_tokens_per_s(reqs)
    if now is None:
        return reqs
    k, t0 = now / tokens_per_s, reqs[0].arrival_s
    return [replace(r, arrival_s=t0 + (r.arrival_s - t0) * k) for r in reqs]


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
                  seeds: int = 5, trace_columns: TraceColumns | None = None,
                  over_context: str = "reject", trace_load: str = "recorded") -> Scenario:
    """Read a scenario file; `small` applies its `small:` overrides; `trace` replaces its workload.

    With `trace`, seed k replays the k-th of `seeds` consecutive windows of the file (each
    `trace_requests` long, default: an equal share of the file), rescaled to `trace_rate_rps`
    when given. `trace_load="scenario"` instead scales each window in time to the offered token
    load of the scenario's own workload (seed 0), so every window loads the fleet alike.
    `over_context` is what a request beyond the plan's context does (`Scenario`).
    """
    p = Path(path)
    data = top_mapping(read_document(p), str(p))
    if small:
        data = deep_merge(data, data.get("small") or {})
    spec = validate(ScenarioSpec, data, str(p), strict=True)
    if trace_load not in TRACE_LOADS:
        raise SpecError(f"--trace-load={trace_load!r}: unknown; use one of {', '.join(TRACE_LOADS)}")
    if trace is None and trace_load != "recorded":
        raise SpecError(f"--trace-load={trace_load}: applies only with --trace FILE")
    if trace_load == "scenario" and trace_rate_rps is not None:
        raise SpecError("--trace-load scenario sets each window's rate itself; drop --trace-rate")
    notes: list[str] = []
    source = "generated"
    if isinstance(ta := spec.workload.arrival, TraceArrival):
        found = _resolve_trace(ta.path, p.parent)
        if found is not None:
            arrival = ta.model_copy(update={"path": str(found)})
            spec = spec.model_copy(update={"workload": spec.workload.model_copy(update={"arrival": arrival})})
            source = f"trace:{ta.path}"
        elif spec.fallback_workload is not None:
            notes.append(f"{spec.name}: trace {ta.path} not found; using the generated "
                         "fallback_workload instead")
            spec = spec.model_copy(update={"workload": spec.fallback_workload, "seed_stride_s": 0.0})
        elif trace is None:
            raise SpecError(f"{p}: workload.arrival.path={ta.path!r}: trace file not found "
                            "(relative paths are resolved against the repo root and the scenario's folder)")
    target: float | None = None
    if trace is not None:
        if trace_load == "scenario":  # the load the scenario was sized for, as prompt + output tokens/s
            target = offered_tokens_per_s(Scenario(spec, str(p), over_context=over_context).requests(0))
        notes = []
        spec, source = _with_trace(spec, trace, trace_rate_rps, trace_requests, seeds, trace_columns,
                                   untimed_rate_rps=UNTIMED_RATE_RPS if target is not None else None)
    spec.plan.check(where=str(p))
    notes += version_skew_warnings(spec.faults, spec.plan, str(p))
    return Scenario(spec, str(p), tuple(notes), source, over_context, target)


def _with_trace(spec: ScenarioSpec, trace: str, rate_rps: float | None, max_requests: int | None,
                seeds: int, columns: TraceColumns | None = None,
                untimed_rate_rps: float | None = None) -> tuple[ScenarioSpec, str]:
    from fleetwise.workload.traces import read_trace

    table = read_trace(trace, columns=columns)
    if 0 < len(table) < seeds:  # seeds past the last row would replay the same rows: a CI over copies
        raise SpecError(f"--trace {trace}: {len(table)} requests for --seeds {seeds}: each seed replays its own "
                        f"window of the trace, so {seeds} seeds need at least {seeds} requests; give --seeds "
                        f"{len(table)} or fewer, or a longer trace")
    if rate_rps is None and table.arrival_s is None:
        rate_rps = untimed_rate_rps
    n = max(1, len(table) // max(seeds, 1)) if max_requests is None else max_requests
    stride = 0.0
    if table.arrival_s is not None and len(table) > 1:
        t = table.arrival_s - table.arrival_s[0]
        k = min(n, len(t) - 1)
        stride = float(t[k]) if seeds > 1 else 0.0
    arrival = TraceArrival(path=str(Path(trace).resolve()), format=None if columns else table.format,
                           columns=columns, rate_rps=rate_rps, max_requests=n)
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
