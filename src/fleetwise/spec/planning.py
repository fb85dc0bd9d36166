"""`PlanningSpec`: the input of `fleetwise plan` (SPEC.yaml), validated once at the edge.

Owns the declared question: which model, which accelerators may be used (how many, at what
price, in which node shape), the traffic (a trace or length distributions with a rate and a
burstiness), the SLOs, the precisions to consider, the headroom policy and the search limits.
Does not resolve catalog names or compute anything: the planner (`fleetwise.planner`) does.
`planning_json_schema()` exports the JSON Schema kept in docs/schema/planning-spec.schema.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from fleetwise.errors import UnknownNameError
from fleetwise.spec.base import Spec, load_document, validate
from fleetwise.spec.dtypes import KvDtype, WeightDtype
from fleetwise.spec.failure_domains import FailureDomainSpec
from fleetwise.spec.inputs import MAX_GPUS, MAX_RATE_RPS, MAX_REQUESTS, MAX_SEEDS, MAX_TOKENS
from fleetwise.spec.routing import PRESETS

SCHEMA_PATH = Path("docs/schema/planning-spec.schema.json")


# ---- length distributions ------------------------------------------------------------------
class FixedLengths(Spec):
    """Every request has the same number of tokens."""

    kind: Literal["fixed"] = "fixed"
    tokens: int = Field(gt=0, le=MAX_TOKENS)
    """Tokens per request."""


class LognormalLengths(Spec):
    """Lognormal token counts, clipped to [min_tokens, max_tokens]."""

    kind: Literal["lognormal"] = "lognormal"
    median_tokens: float = Field(gt=0, le=MAX_TOKENS)
    """Median of the distribution (exp(mu))."""
    sigma: float = Field(default=0.8, ge=0)
    """Standard deviation of log(tokens)."""
    min_tokens: int = Field(default=1, gt=0, le=MAX_TOKENS)
    """Lower clip."""
    max_tokens: int = Field(default=32768, gt=0, le=MAX_TOKENS)
    """Upper clip."""


class UniformLengths(Spec):
    """Token counts uniform on [min_tokens, max_tokens]."""

    kind: Literal["uniform"] = "uniform"
    min_tokens: int = Field(gt=0, le=MAX_TOKENS)
    """Smallest value."""
    max_tokens: int = Field(gt=0, le=MAX_TOKENS)
    """Largest value."""


class EmpiricalLengths(Spec):
    """Piecewise-linear quantile function: `points` are (percentile 0..100, tokens), increasing."""

    kind: Literal["empirical"] = "empirical"
    points: list[tuple[float, int]] = Field(min_length=2)
    """(percentile, tokens) pairs; the first percentile must be 0 and the last 100."""

    @model_validator(mode="after")
    def _check(self) -> EmpiricalLengths:
        ps = [p for p, _ in self.points]
        ts = [t for _, t in self.points]
        if ps[0] != 0 or ps[-1] != 100 or ps != sorted(ps) or ts != sorted(ts) or ts[0] < 1:
            raise ValueError("points must run from percentile 0 to 100 with tokens >= 1, both non-decreasing")
        return self


LengthDist = Annotated[
    FixedLengths | LognormalLengths | UniformLengths | EmpiricalLengths, Field(discriminator="kind")
]

# Quantiles of ShareGPT (sharegpt_8k_filtered_stats_llama2_tokenizer.csv, 30,731 conversations).
SHAREGPT_PROMPT = EmpiricalLengths(points=[
    (0, 1), (5, 29), (10, 74), (20, 382), (30, 777), (40, 1203), (50, 1730), (60, 2401), (70, 3235),
    (80, 4278), (90, 5696), (95, 6563), (99, 7433), (100, 8141)])
SHAREGPT_OUTPUT = EmpiricalLengths(points=[
    (0, 2), (5, 44), (10, 84), (20, 181), (30, 271), (40, 346), (50, 415), (60, 493), (70, 581),
    (80, 683), (90, 834), (95, 920), (99, 998), (100, 1024)])
# Quantiles of arXiv summarisation (arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv).
ARXIV_PROMPT = EmpiricalLengths(points=[
    (0, 1), (5, 748), (10, 1242), (20, 1802), (30, 2150), (40, 2453), (50, 2730), (60, 2996), (70, 3249),
    (80, 3490), (90, 3702), (95, 3813), (99, 3933), (100, 4054)])
ARXIV_OUTPUT = EmpiricalLengths(points=[
    (0, 5), (5, 60), (10, 78), (20, 104), (30, 125), (40, 145), (50, 167), (60, 192), (70, 222),
    (80, 268), (90, 372), (95, 736), (99, 3271), (100, 4056)])
LENGTH_PRESETS: dict[str, tuple[EmpiricalLengths, EmpiricalLengths]] = {
    "sharegpt": (SHAREGPT_PROMPT, SHAREGPT_OUTPUT),
    "arxiv-summarization": (ARXIV_PROMPT, ARXIV_OUTPUT),
}


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


class TraceSource(Spec):
    """A request trace replayed at the target rate (lengths and arrival pattern kept)."""

    path: str
    """Azure LLM inference CSV, Mooncake JSONL or a length-statistics CSV."""
    format: Literal["auto", "azure", "mooncake", "burstgpt", "length_stats"] = "auto"
    """File format; `auto` decides from the header."""


class PlanWorkloadSpec(Spec):
    """The traffic to serve: a length mix (preset, distributions or a trace) at a target rate."""

    rate_rps: float = Field(gt=0, le=MAX_RATE_RPS)
    """Target mean arrival rate, requests per second."""
    burstiness_cv: float = Field(default=1.0, gt=0)
    """Coefficient of variation of inter-arrival gaps (Gamma arrivals; 1 = Poisson). Ignored for traces."""
    preset: Literal["sharegpt", "arxiv-summarization"] | None = None
    """Built-in length mix (quantiles of the public length-statistics files)."""
    prompt_tokens: LengthDist | None = None
    """Prompt length distribution (with output_tokens, instead of a preset)."""
    output_tokens: LengthDist | None = None
    """Output length distribution."""
    trace: TraceSource | None = None
    """Replay a trace instead: its lengths and arrival pattern, rescaled to rate_rps."""

    @model_validator(mode="after")
    def _one_source(self) -> PlanWorkloadSpec:
        dists = self.prompt_tokens is not None or self.output_tokens is not None
        given = [n for n, on in (("preset", self.preset), ("trace", self.trace), ("prompt_tokens", dists)) if on]
        if len(given) != 1:
            raise ValueError(
                "give exactly one length source: `preset`, `trace`, or `prompt_tokens` + `output_tokens`"
                f" (got {given or 'none'})"
            )
        if dists and (self.prompt_tokens is None or self.output_tokens is None):
            raise ValueError("prompt_tokens and output_tokens go together; set both")
        return self


class PlanSLOSpec(Spec):
    """Service-level objectives: latency targets at a percentile and the attainment required."""

    ttft_s: float = Field(gt=0)
    """Time-to-first-token target, seconds, at `percentile`."""
    tpot_s: float = Field(gt=0)
    """Time-per-output-token target (after the first token), seconds, at `percentile`."""
    percentile: Literal[50, 90, 99] = 90
    """Percentile at which the targets apply (90 means p90 TTFT <= ttft_s and p90 TPOT <= tpot_s)."""
    attainment: float = Field(default=0.9, gt=0, le=1)
    """Fraction of requests that must meet both targets."""


class HeadroomSpec(Spec):
    """Capacity kept above the measured need; each term is reported separately."""

    failures_to_survive: int = Field(default=1, ge=0)
    """Replicas per pool that may fail at once with the SLO still met (N+k)."""
    cold_start_s: float = Field(default=120.0, ge=0)
    """Seconds a new or restarted replica needs before it serves."""
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
    sample_requests: int = Field(default=400, ge=50, le=MAX_REQUESTS)
    """Requests per simulation run."""
    max_pp: int = Field(default=4, gt=0)
    """Largest pipeline degree considered."""
    disaggregation: Literal["auto", "off", "only"] = "auto"
    """`auto` compares colocated and prefill/decode plans; `off` colocated only; `only` PD only."""
    heterogeneous: bool = True
    """Try prefill and decode pools on different accelerator types when several are allowed."""
    bisect_steps: int = Field(default=7, gt=0)
    """Bisection steps when measuring a replica's effective goodput in the simulator."""


class MoEPlanningSpec(Spec):
    """MoE-specific assumptions."""

    expert_imbalance: float = Field(default=1.3, ge=1)
    """Busiest expert-parallel rank's load over the mean (1.3: 30% skew, a common measured value)."""


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
    """Routing policy name for simulated plans; None uses the registry default."""
    measured: list[MeasuredThroughput] = Field(default_factory=list)
    """Load-test results of real replicas; each replaces the simulated goodput of its layout."""
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


def load_planning_spec(path: str | Path) -> PlanningSpec:
    """Read and validate a SPEC.yaml (SpecError with field, value and fix on a bad field)."""
    return load_document(PlanningSpec, path)


def planning_spec_from_dict(data: dict[str, Any], where: str = "spec") -> PlanningSpec:
    """Validate an in-memory document."""
    return validate(PlanningSpec, data, where)


def planning_json_schema() -> dict[str, Any]:
    """The JSON Schema of SPEC.yaml (what docs/schema/planning-spec.schema.json holds)."""
    schema = PlanningSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://fleetwise.dev/schema/planning-spec.schema.json"
    return schema


def planning_schema_text() -> str:
    """The schema as the file stores it (sorted keys, 2-space indent, final newline)."""
    return json.dumps(planning_json_schema(), indent=2, sort_keys=True) + "\n"


def write_planning_schema(path: str | Path = SCHEMA_PATH) -> Path:
    """Write the schema file; returns its path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(planning_schema_text(), encoding="utf-8")
    return p
