"""`PlanningSpec`: the input of `fleetwise plan` (SPEC.yaml), validated once at the edge.

Owns the declared question: which model, which accelerators may be used (how many, at what
price, in which node shape), the traffic (the simulator's `WorkloadSpec` at a target rate), the
SLOs, the precisions to consider, the headroom policy and the search limits.
Does not resolve catalog names or compute anything: the planner (`fleetwise.planner`) does.
`planning_json_schema()` exports the JSON Schema kept in docs/schema/planning-spec.schema.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from fleetwise.errors import UnknownNameError
from fleetwise.spec.base import Spec, load_document, on_off, validate
from fleetwise.spec.dtypes import KvDtype, WeightDtype
from fleetwise.spec.failure_domains import FailureDomainSpec
from fleetwise.spec.limits import MAX_GPUS, MAX_RATE_RPS, MAX_REQUESTS, MAX_SEEDS
from fleetwise.spec.output import strict_json_dumps
from fleetwise.spec.routing import PRESETS
from fleetwise.spec.slo import PlanSLOSpec
from fleetwise.spec.workload import PrefixSpec, TraceArrival, WorkloadSpec

SCHEMA_PATH = Path("docs/schema/planning-spec.schema.json")
SAMPLE_REQUESTS_MIN = 50
"""Fewest requests one planner simulation run replays (`search.sample_requests`): fewer give no
percentile worth a verdict (p90 of 50 already rests on 5 requests)."""


# ---- sections --------------------------------------------------------------------------------
class AcceleratorChoice(Spec):
    """One accelerator type the plan may use, with what is available and what it costs."""

    name: str
    """Catalog name (see `fleetwise catalog gpus`), e.g. `h100-sxm`."""
    max_gpus: int | None = Field(default=None, gt=0)
    """GPUs of this type available; None means limited only by search.max_gpus."""
    price_per_hour_usd: float | None = Field(default=None, ge=0)
    """Price per GPU-hour; None uses the catalog default."""
    gpus_per_node: int | None = Field(default=None, gt=0)
    """GPUs in one scale-up (NVLink/xGMI) domain; None uses the catalog figure."""
    intra_node_bytes_per_s: float | None = Field(default=None, gt=0)
    """Scale-up link bandwidth per GPU, one direction; None uses the catalog figure."""
    network_bytes_per_s: float | None = Field(default=None, gt=0)
    """Scale-out network bandwidth per GPU (used across nodes and for KV transfer); None: catalog."""


class PlanWorkloadSpec(WorkloadSpec):
    """The traffic to serve: the simulator's `WorkloadSpec` (arrival shape and lengths) at a target rate.

    The planner replays the same length mix at many rates, so the rate is its own field and the
    arrival only gives the shape: `poisson` (the default), `gamma` with its `cv`, or a `trace`
    whose gaps are rescaled to `rate_rps`. The planner draws `search.sample_requests` requests
    itself and sizes for independent requests (no shared prefixes, sessions, tenants or pins).
    """

    rate_rps: float = Field(gt=0, le=MAX_RATE_RPS)
    """Target mean arrival rate, requests per second (the arrival's own rate_rps is set to it)."""
    over_context: Literal["reject", "truncate", "skip"] = "reject"
    """Trace lengths: what a request whose prompt + output exceeds the model's context (or with an
    empty prompt or output) does: `reject` the spec naming it, `truncate` it to fit, or `skip` it;
    the plan document counts them (`workload.over_context`). Drawn lengths are checked whole."""

    @model_validator(mode="before")
    @classmethod
    def _at_rate(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _from_length_source_form(data)
        arrival = data.get("arrival", {"kind": "poisson"})
        rate = data.get("rate_rps")
        if isinstance(arrival, dict) and rate is not None:
            given = arrival.get("rate_rps")
            if given is not None and given != rate:
                raise ValueError(f"arrival.rate_rps ({given}) differs from rate_rps ({rate}); the planner's "
                                 "target rate is workload.rate_rps: remove arrival.rate_rps")
            if arrival.get("kind") == "trace" and arrival.get("time_scale", 1.0) != 1.0:
                raise ValueError("arrival.time_scale: the planner replays a trace at rate_rps; remove time_scale")
            arrival = {**arrival, "rate_rps": rate}
        return {**data, "arrival": arrival}

    @model_validator(mode="after")
    def _check(self) -> PlanWorkloadSpec:  # replaces WorkloadSpec's bound check: the planner picks the count
        if not isinstance(self.arrival, TraceArrival) and self.trace_lengths:
            raise ValueError("lengths: give the request lengths, e.g. `{kind: preset, name: sharegpt}`, or "
                             "`independent`/`empirical` lengths; `trace` lengths come only with arrival.kind=trace")
        unused = [name for name, on in (
            ("num_requests", self.num_requests is not None), ("duration_s", self.duration_s is not None),
            ("prefix", self.prefix != PrefixSpec()), ("tenants", bool(self.tenants)),
            ("model_version_pin", self.model_version_pin is not None),
            ("client_max_tokens", self.client_max_tokens is not None)) if on]
        if unused:
            raise ValueError(f"{unused[0]}: the planner draws search.sample_requests independent requests and "
                             f"sizes for their lengths alone; remove {', '.join(unused)}")
        return self


OLD_LOGNORMAL_DEFAULTS = {"sigma": 0.8, "min_tokens": 1, "max_tokens": 32768}
"""Defaults of the former planning `lognormal` form, kept so its files draw the same lengths."""


def _old_dist(d: Any) -> Any:
    """One former planning length distribution as a `LengthDist` mapping."""
    if not isinstance(d, dict):
        return d
    kind = d.get("kind")
    if kind == "uniform":
        renamed = {"min_tokens": "low_tokens", "max_tokens": "high_tokens"}
        return {renamed.get(k, k): v for k, v in d.items()}
    if kind == "lognormal":
        return {**OLD_LOGNORMAL_DEFAULTS, **d}
    if kind == "empirical":
        return {**d, "kind": "quantiles"}
    return d


def _from_length_source_form(data: dict[str, Any]) -> dict[str, Any]:
    """Rewrite the former planning workload form (`preset`, `prompt_tokens` + `output_tokens`, `trace`,
    `burstiness_cv`) as WorkloadSpec fields, so existing SPEC.yaml files keep working."""
    old = [k for k in ("preset", "prompt_tokens", "output_tokens", "trace", "burstiness_cv") if k in data]
    if not old:
        return data
    new = [k for k in ("arrival", "lengths") if k in data]
    if new:
        raise ValueError(f"{old[0]}: the former form cannot be mixed with `{new[0]}`; move {', '.join(old)} into "
                         "`lengths`/`arrival` (docs/planner.md)")
    out = {k: v for k, v in data.items() if k not in old}
    sources: list[str] = [k for k in ("preset", "trace", "prompt_tokens") if k in data]
    if "output_tokens" in data and "prompt_tokens" not in data:
        sources.append("output_tokens")
    if len(sources) != 1:
        raise ValueError("give exactly one length source: `lengths: {kind: preset, name: sharegpt}`, "
                         f"`lengths: {{kind: independent, input: ..., output: ...}}` or `arrival: {{kind: trace, path: ...}}`"
                         f" (got {sources or 'none'})")
    if "preset" in data:
        out["lengths"] = {"kind": "preset", "name": data["preset"]}
    elif "trace" in data:
        trace = data["trace"]
        if isinstance(trace, dict):
            trace = {k: v for k, v in trace.items() if not (k == "format" and v == "auto")}
            out["arrival"] = {**trace, "kind": "trace"}
        else:
            out["arrival"] = trace
    else:
        if "prompt_tokens" not in data or "output_tokens" not in data:
            raise ValueError("prompt_tokens and output_tokens go together; set both (or write "
                             "`lengths: {kind: independent, input: ..., output: ...}`)")
        out["lengths"] = {"kind": "independent", "input": _old_dist(data["prompt_tokens"]),
                          "output": _old_dist(data["output_tokens"])}
    if "burstiness_cv" in data and "trace" not in data:
        cv = data["burstiness_cv"]
        out["arrival"] = {"kind": "poisson"} if cv == 1 else {"kind": "gamma", "cv": cv}
    return out


class HeadroomSpec(Spec):
    """Capacity kept above the measured need; each term is reported separately."""

    failures_to_survive: int = Field(default=1, ge=0)
    """Replicas per pool that may fail at once with the SLO still met (N+k)."""
    cold_start_s: float = Field(default=120.0, ge=0)
    """Seconds a new or restarted replica needs before it serves, besides reading its weights (the
    planner adds that from the catalog: each card's share of the weights / its storage read rate)."""
    rate_growth_per_min: float = Field(default=0.0, ge=0)
    """Fraction of the rate by which load can grow per minute while a new replica starts (0: no ramp)."""
    upgrade_batch_replicas: int = Field(default=1, ge=0)
    """Replicas per pool taken out together during a rolling upgrade."""
    failures_during_upgrade: bool = False
    """Also survive failures_to_survive failures during an upgrade (the two terms then add)."""
    burst_factor: float | None = Field(default=None, ge=1)
    """Peak-to-mean rate to provision for; None derives it from the workload's arrivals."""
    burst_window_s: float = Field(default=60.0, gt=0)
    """Window over which the derived burst factor compares peak (p99) and mean rates."""


class SearchSpec(Spec):
    """Limits of the search and of the simulation that checks it."""

    max_gpus: int = Field(default=64, gt=0, le=MAX_GPUS)
    """Most GPUs a plan may use, all pools together."""
    top_k: int = Field(default=3, gt=0)
    """Plans reported."""
    refine_top: int = Field(default=6, gt=0)
    """Candidates (after the analytical estimate) checked in the simulator over all seeds."""
    seeds: int = Field(default=3, gt=0, le=MAX_SEEDS)
    """Seeds per refined plan (attainment CI comes from their spread)."""
    sample_requests: int = Field(default=400, ge=SAMPLE_REQUESTS_MIN, le=MAX_REQUESTS)
    """Requests per simulation run."""
    max_pp: int = Field(default=4, gt=0)
    """Largest pipeline degree considered."""
    disaggregation: Annotated[Literal["auto", "off", "only"], on_off(on="auto", off="off")] = "auto"
    """`auto` compares colocated and prefill/decode plans; `off` colocated only; `only` PD only. YAML
    booleans are read as on/off: `off`/`false`/`no` unquoted is `off`, `on`/`true`/`yes` is `auto`."""
    heterogeneous: bool = True
    """Try prefill and decode pools on different accelerator types when several are allowed."""
    bisect_steps: int = Field(default=7, gt=0)
    """Bisection steps when measuring a replica's effective goodput in the simulator."""


class MoEPlanningSpec(Spec):
    """MoE-specific assumptions."""

    expert_imbalance: float = Field(default=1.3, ge=1)
    """Busiest expert-parallel rank's load over the mean, assumed when no `expert_load` is given. The
    default 1.3 (30% skew) is an assumption, not a measurement: no public max/mean figure was found
    to cite (docs/perf-model.md, "Sources of the MoE constants"); every MoE plan states it."""
    expert_load: str | None = None
    """Measured expert load: a JSON of per-layer expert token counts (vLLM's expert-parallel load
    balancer's `expert_load_pass`/`expert_load_window`, or any layers x experts counts). When given, each
    layout's imbalance comes from it for its EP degree (`fleetwise.perf.expert_load`) and
    `expert_imbalance` is not used."""


class KVLinkSpec(Spec):
    """Link prefill replicas use to hand KV caches to decode replicas."""

    bandwidth_bytes_per_s: float = Field(gt=0)
    """Usable one-direction bandwidth per GPU NIC; a replica moves its KV shards over one NIC each."""
    latency_s: float = Field(default=20e-6, ge=0)
    """Per-transfer latency."""


class MeasuredThroughput(Spec):
    """A load test of one real replica of a layout: its result replaces the simulated goodput."""

    path: str
    """Result JSON: aiperf's `profile_export_aiperf.json`, guidellm's benchmarks JSON (a rate sweep),
    or fleetwise's own load-test / simulation summary (`ttft_s`, `tpot_s` in seconds)."""
    accelerator: str
    """Catalog name of the card the replica ran on."""
    tp: int = Field(default=1, gt=0)
    pp: int = Field(default=1, gt=0)
    weight_dtype: WeightDtype = "bf16"
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    """The replica's role in the test (a colocated replica is `mixed`)."""
    rate_rps: float | None = Field(default=None, gt=0)
    """Offered rate of the test, for result files that do not record it (fleetwise's load test)."""


class MeasuredService(Spec):
    """Service rates measured on a running fleet (`fleetwise calibrate --from-metrics`): every step
    on `accelerator` takes `step_time_factor` times the perf model's time."""

    accelerator: str
    """Catalog name of the card the measured replicas ran on."""
    step_time_factor: float = Field(gt=0)
    """Measured step time over modelled step time (1.3: the replicas are 30% slower than the model)."""
    ci95: tuple[float, float]
    """95% confidence interval of the factor."""
    source: str = ""
    """Where it was measured (metrics sources, replicas, requests)."""
    role: Literal["prefill", "decode"] | None = None
    """The pool role it was measured on, when a fleet's prefill and decode pools on this card were
    measured apart: that role's pools (and, in the analytical phase, prompt or decode-only steps)
    take it; None: every pool on the card."""


class PlanningSpec(Spec):
    """SPEC.yaml of `fleetwise plan`: the deployment question."""

    name: str = "plan"
    """Label used in reports."""
    model: str
    """Catalog model name, or a path to a Hugging Face config.json."""
    accelerators: list[AcceleratorChoice] = Field(min_length=1)
    """Accelerator types the plan may use."""
    workload: PlanWorkloadSpec
    """Traffic to serve."""
    slo: PlanSLOSpec
    """Targets to meet."""
    weight_dtypes: list[WeightDtype] = Field(default_factory=lambda: ["bf16", "fp8"], min_length=1)  # type: ignore[arg-type]
    """Weight precisions to consider (bf16, fp8, int4)."""
    kv_dtype: KvDtype = "bf16"
    """KV-cache precision."""
    kv_link: KVLinkSpec | None = None
    """KV hand-off link for PD plans; None uses the prefill accelerator's network per GPU x TP."""
    headroom: HeadroomSpec = Field(default_factory=HeadroomSpec)
    """Capacity above the measured need."""
    search: SearchSpec = Field(default_factory=SearchSpec)
    """Search limits."""
    moe: MoEPlanningSpec = Field(default_factory=MoEPlanningSpec)
    """MoE assumptions (ignored for dense models)."""
    routing_policy: str | None = None
    """Routing policy the fleet will run, which every simulation of the search uses; None: the
    gateway's default (`fleetwise-default`)."""
    measured: list[MeasuredThroughput] = Field(default_factory=list)
    """Load-test results of real replicas; each replaces the simulated goodput of its layout."""
    measured_service: list[MeasuredService] = Field(default_factory=list)
    """Step-time corrections measured on a running fleet (`fleetwise plan --measured`): every
    simulation of a layout on that accelerator runs its steps this much slower or faster."""
    profile: str | None = None
    """Perf profile JSON (`fleetwise calibrate`) that prices every step, in the estimate and in the
    simulator alike; None uses the default, uncalibrated factors. `fleetwise plan --profile` overrides."""
    failure_domains: FailureDomainSpec = Field(default_factory=FailureDomainSpec)
    """Re-prefill, migration and lease decisions the simulated candidates run with (docs/failure-domains.md)."""

    @model_validator(mode="after")
    def _unique(self) -> PlanningSpec:
        names = [a.name for a in self.accelerators]
        if len(set(names)) != len(names):
            raise ValueError(f"accelerators lists a name twice ({names}); give each type once")
        if len(set(self.weight_dtypes)) != len(self.weight_dtypes):
            raise ValueError(f"weight_dtypes repeats a value ({self.weight_dtypes})")
        if self.routing_policy is not None and self.routing_policy not in PRESETS:
            raise ValueError(f"routing_policy: {UnknownNameError('routing policy', self.routing_policy, PRESETS)}")
        return self

    def measured_for(self, accelerator: str, role: str | None = None) -> MeasuredService | None:
        """The measurement a `role` pool on `accelerator` takes: the last `measured_service` entry
        for that card and role, else for the card (role None), else None."""
        cards = [m for m in reversed(self.measured_service) if m.accelerator == accelerator]
        return next((m for m in cards if m.role is not None and m.role == role),
                    next((m for m in cards if m.role is None), None))

    def step_time_factor(self, accelerator: str, role: str | None = None) -> float:
        """Measured step time over modelled of a `role` pool on `accelerator` (`measured_for`; 1.0 when none)."""
        m = self.measured_for(accelerator, role)
        return 1.0 if m is None else m.step_time_factor


def load_planning_spec(path: str | Path) -> PlanningSpec:
    """Read and validate a SPEC.yaml (SpecError with field, value and fix on a bad field)."""
    return load_document(PlanningSpec, path)


def planning_spec_from_dict(data: dict[str, Any], where: str = "spec") -> PlanningSpec:
    """Validate an in-memory document."""
    return validate(PlanningSpec, data, where)


def planning_json_schema() -> dict[str, Any]:
    """The JSON Schema of SPEC.yaml (what docs/schema/planning-spec.schema.json holds)."""
    schema = PlanningSpec.model_json_schema()
    for arrival in ("PoissonArrival", "GammaArrival"):  # the planner sets their rate (PlanWorkloadSpec)
        d = schema["$defs"][arrival]
        d["required"] = [f for f in d.get("required", []) if f != "rate_rps"] or None
        if d["required"] is None:
            del d["required"]
        d["properties"]["rate_rps"]["description"] = "In a planning spec: optional, set from workload.rate_rps."
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://fleetwise.dev/schema/planning-spec.schema.json"
    return schema


def planning_schema_text() -> str:
    """The schema as the file stores it (sorted keys, 2-space indent, final newline)."""
    return strict_json_dumps(planning_json_schema(), indent=2, sort_keys=True) + "\n"


def write_planning_schema(path: str | Path = SCHEMA_PATH) -> Path:
    """Write the schema file; returns its path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(planning_schema_text(), encoding="utf-8")
    return p
