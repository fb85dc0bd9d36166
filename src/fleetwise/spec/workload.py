"""`WorkloadSpec`: what clients send and when (arrival process x lengths x prefix sharing x tenants).

Owns the declared shape of a workload and its validation. Does not draw any numbers: the
generator in `fleetwise.workload.generate` turns a spec and a seed into `Request`s, and the trace
loaders in `fleetwise.workload.traces` read the files a `trace` arrival or an `empirical` length
distribution points at.

Semantics worth knowing (docs/workloads.md has the long form):
- Arrival rates are in requests per second. With multi-turn sessions the arrival process
  starts *sessions*; each session then issues its turns, so the request rate is about
  `rate_rps * mean turns`.
- Input lengths are the *user* part of a prompt. A shared system prompt (global or a tenant's
  own) is prepended to it, and in a session every turn's prompt is the previous turn's prompt
  and output plus the new user tokens.
- Block hashes follow Mooncake's chained `hash_ids`: one id per `hash_block_tokens` tokens
  (the last, partial block included), equal id at position i means equal first i+1 blocks.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Annotated, Literal

from pydantic import Field, model_validator

from fleetwise.errors import SpecError, quote
from fleetwise.spec.base import Spec
from fleetwise.spec.limits import (
    MAX_DURATION_S,
    MAX_FACTOR,
    MAX_RATE_RPS,
    MAX_REQUESTS,
    MAX_SESSION_TURNS,
    MAX_TOKENS,
    MIN_FACTOR,
)

_Z99 = NormalDist().inv_cdf(0.99)
LOGNORMAL_MAX_SIGMA = 4.0
"""Largest log-normal sigma: at 4 the p99 is already 11,000x the median (measured prompt lengths
have sigma near 1); beyond it draws overflow any token count."""


# ---------------------------------------------------------------------------------------------
# Arrivals
# ---------------------------------------------------------------------------------------------


class PoissonArrival(Spec):
    """Memoryless arrivals: exponential inter-arrival times (CV 1)."""

    kind: Literal["poisson"] = "poisson"
    rate_rps: float = Field(gt=0, le=MAX_RATE_RPS)
    """Mean arrivals per second (sessions per second when sessions are enabled)."""


class GammaArrival(Spec):
    """Bursty (cv > 1) or smooth (cv < 1) arrivals: Gamma inter-arrival times."""

    kind: Literal["gamma"] = "gamma"
    rate_rps: float = Field(gt=0, le=MAX_RATE_RPS)
    """Mean arrivals per second (sessions per second when sessions are enabled)."""
    cv: float = Field(gt=0, le=MAX_FACTOR)
    """Coefficient of variation of inter-arrival times (burstiness); 1 is Poisson."""


TRACE_COLUMN_ROLES = ("arrival", "prompt", "output")
"""What a column mapping names: the arrival time, the prompt length and the output length columns."""
TRACE_COLUMNS_EXAMPLE = "arrival=ts,prompt=input_tokens,output=output_tokens"
"""A `--trace-columns` value that errors quote as the form to follow."""
MAX_COLUMN_NAME = 200
"""Longest column (JSON field) name a mapping may give."""
ARRIVAL_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
"""Units a numeric arrival column may be in (`TraceColumns.arrival_unit`), as seconds per unit."""
ArrivalUnit = Literal["auto", "s", "ms", "us", "ns"]
MAX_UNIT_TEXT = 20
"""Characters of an unknown `arrival_unit` an error quotes."""


class TraceColumns(Spec):
    """A trace's own column (JSON field) names for the arrival, prompt and output: read any CSV or
    JSONL trace (`--trace-columns arrival=...,prompt=...,output=...`; `fleetwise.workload.columns`)."""

    arrival: str = Field(min_length=1, max_length=MAX_COLUMN_NAME)
    """Arrival times: seconds (any origin) or timestamps (ISO 8601 or `2024-05-01 12:00:03.25`)."""
    prompt: str = Field(min_length=1, max_length=MAX_COLUMN_NAME)
    """Prompt length in tokens."""
    output: str = Field(min_length=1, max_length=MAX_COLUMN_NAME)
    """Output length in tokens."""
    arrival_unit: ArrivalUnit = "auto"
    """Unit of numeric arrivals (`s`, `ms`, `us`, `ns`); `auto`: epoch times are read in the unit
    their magnitude gives (years 2000-2100), other numbers as seconds (`fleetwise.workload.columns`)."""

    @staticmethod
    def parse(text: str, flag: str = "--trace-columns") -> TraceColumns:
        """From `arrival=NAME,prompt=NAME,output=NAME[,arrival_unit=UNIT]` (any order)."""
        found: dict[str, str] = {}
        for part in text.split(","):
            key, sep, name = part.partition("=")
            key, name = key.strip(), name.strip()
            if key == "arrival_unit" and name not in ARRIVAL_UNITS and name != "auto":
                raise SpecError(f"{flag}: arrival_unit={name[:MAX_UNIT_TEXT]}: one of {', '.join(ARRIVAL_UNITS)} (or auto: "
                                "epoch times by their magnitude, other numbers as seconds)")
            if not sep or key not in (*TRACE_COLUMN_ROLES, "arrival_unit") or not name or len(name) > MAX_COLUMN_NAME:
                raise SpecError(f"{flag}={quote(text)}: expected "
                                f"{','.join(r + '=COLUMN' for r in TRACE_COLUMN_ROLES)} (names of at most "
                                f"{MAX_COLUMN_NAME} characters), e.g. {flag} {TRACE_COLUMNS_EXAMPLE}")
            if key in found:
                raise SpecError(f"{flag}={quote(text)}: {key} is given twice")
            found[key] = name
        missing = [r for r in TRACE_COLUMN_ROLES if r not in found]
        if missing:
            raise SpecError(f"{flag}={quote(text)}: missing {', '.join(missing)}; e.g. {flag} {TRACE_COLUMNS_EXAMPLE}")
        return TraceColumns(**found)  # type: ignore[arg-type]  # arrival_unit was checked above

    def names(self) -> tuple[str, str, str]:
        """(arrival, prompt, output) column names, in that order."""
        return self.arrival, self.prompt, self.output


class TraceArrival(Spec):
    """Replay the arrival times (and by default the lengths) of a trace file."""

    kind: Literal["trace"] = "trace"
    path: str
    """Trace file: Azure CSV, Mooncake JSONL, BurstGPT CSV or a length-statistics CSV."""
    format: str | None = Field(default=None, min_length=1, max_length=64)
    """A registered trace format (`fleetwise.workload.formats`: azure, burstgpt, length_stats,
    mooncake); detected from the header (column or field names) when unset."""
    time_scale: float = Field(default=1.0, ge=MIN_FACTOR, le=MAX_FACTOR)
    """Multiply the trace's inter-arrival times by this (0.5 replays twice as fast)."""
    rate_rps: float | None = Field(default=None, gt=0, le=MAX_RATE_RPS)
    """Rescale timestamps so the mean rate is this; excludes `time_scale`. Required for
    length-statistics files, which have no timestamps (arrivals are then Poisson)."""
    start_s: float = Field(default=0.0, ge=0, le=MAX_DURATION_S)
    """Skip the trace's first seconds (in trace time, from its first request)."""
    max_requests: int | None = Field(default=None, gt=0, le=MAX_REQUESTS)
    """Keep at most this many requests (after `start_s`)."""
    columns: TraceColumns | None = None
    """The file's own column names, for a trace in no registered format (instead of `format`)."""

    @model_validator(mode="after")
    def _check(self) -> TraceArrival:
        if self.columns is not None and self.format is not None:
            raise ValueError(f"give either format ({self.format!r}) or columns, not both: columns read a file in "
                             "no registered format")
        if self.rate_rps is not None and self.time_scale != 1.0:
            raise ValueError(
                f"give either time_scale ({self.time_scale}) or rate_rps ({self.rate_rps}), not both: "
                "rate_rps already fixes the time scale"
            )
        return self


ArrivalSpec = Annotated[PoissonArrival | GammaArrival | TraceArrival, Field(discriminator="kind")]


# ---------------------------------------------------------------------------------------------
# Lengths
# ---------------------------------------------------------------------------------------------


class _Clipped(Spec):
    min_tokens: int = Field(default=1, ge=1, le=MAX_TOKENS)
    """Clip drawn lengths to at least this many tokens."""
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    """Clip drawn lengths to at most this many tokens (None: no upper clip)."""

    @model_validator(mode="after")
    def _check_clip(self) -> _Clipped:
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) is below min_tokens ({self.min_tokens})")
        return self


class FixedLength(Spec):
    """Every request has the same length."""

    kind: Literal["fixed"] = "fixed"
    tokens: int = Field(ge=1, le=MAX_TOKENS)
    """The length, in tokens."""


class UniformLength(Spec):
    """Integer lengths drawn uniformly from [low_tokens, high_tokens] (both inclusive)."""

    kind: Literal["uniform"] = "uniform"
    low_tokens: int = Field(ge=1, le=MAX_TOKENS)
    """Smallest length."""
    high_tokens: int = Field(ge=1, le=MAX_TOKENS)
    """Largest length."""

    @model_validator(mode="after")
    def _check(self) -> UniformLength:
        if self.high_tokens < self.low_tokens:
            raise ValueError(f"high_tokens ({self.high_tokens}) is below low_tokens ({self.low_tokens})")
        return self


class LognormalLength(_Clipped):
    """Log-normal lengths, given by their median or mean and by sigma or the p99, rounded to ints."""

    kind: Literal["lognormal"] = "lognormal"
    median_tokens: float | None = Field(default=None, gt=0, le=MAX_TOKENS)
    """Median length (exp(mu)); give this or mean_tokens."""
    mean_tokens: float | None = Field(default=None, gt=0, le=MAX_TOKENS)
    """Mean length (exp(mu + sigma^2/2)); give this or median_tokens."""
    sigma: float | None = Field(default=None, gt=0, le=LOGNORMAL_MAX_SIGMA)
    """Standard deviation of log(length); give this or p99_tokens."""
    p99_tokens: float | None = Field(default=None, gt=0, le=MAX_TOKENS)
    """99th percentile of the length (before clipping); give this or sigma."""

    @model_validator(mode="after")
    def _check(self) -> LognormalLength:
        if (self.median_tokens is None) == (self.mean_tokens is None):
            raise ValueError("give exactly one of median_tokens and mean_tokens")
        if (self.sigma is None) == (self.p99_tokens is None):
            raise ValueError("give exactly one of sigma and p99_tokens")
        self.mu_sigma()
        return self

    def mu_sigma(self) -> tuple[float, float]:
        """(mu, sigma) of log(length), solved from whichever pair of figures was given.

        median+p99: sigma = ln(p99/median)/z99. mean+p99: ln(p99/mean) = z99*s - s^2/2, the
        smaller root s = z99 - sqrt(z99^2 - 2 ln(p99/mean)).
        """
        if self.sigma is not None:
            s = self.sigma
            mu = math.log(self.median_tokens) if self.median_tokens else math.log(self.mean_tokens or 1) - s * s / 2
            return mu, s
        p99 = float(self.p99_tokens or 0)
        if self.median_tokens is not None:
            if p99 <= self.median_tokens:
                raise ValueError(f"p99_tokens ({p99}) must exceed median_tokens ({self.median_tokens})")
            s = math.log(p99 / self.median_tokens) / _Z99
            return math.log(self.median_tokens), s
        mean = float(self.mean_tokens or 0)
        d = math.log(p99 / mean) if p99 > 0 else 0.0
        if d <= 0 or _Z99 * _Z99 < 2 * d:
            raise ValueError(
                f"no log-normal has mean {mean} and p99 {p99}: p99/mean must lie in (1, "
                f"{math.exp(_Z99 * _Z99 / 2):.1f}); give sigma instead"
            )
        s = _Z99 - math.sqrt(_Z99 * _Z99 - 2 * d)
        return math.log(mean) - s * s / 2, s


class QuantileLength(Spec):
    """Lengths drawn from a piecewise-linear quantile function: `points` are (percentile 0..100, tokens)."""

    kind: Literal["quantiles"] = "quantiles"
    points: list[tuple[float, int]] = Field(min_length=2)
    """(percentile, tokens) pairs, both non-decreasing, from percentile 0 to 100, tokens >= 1."""

    @model_validator(mode="after")
    def _check(self) -> QuantileLength:
        ps = [p for p, _ in self.points]
        ts = [t for _, t in self.points]
        if ps[0] != 0 or ps[-1] != 100 or ps != sorted(ps) or ts != sorted(ts) or ts[0] < 1 or ts[-1] > MAX_TOKENS:
            raise ValueError("points must run from percentile 0 to 100 with tokens in [1, MAX_TOKENS], "
                             "both non-decreasing")
        return self


LengthDist = Annotated[FixedLength | UniformLength | LognormalLength | QuantileLength, Field(discriminator="kind")]


def longest_tokens(dist: LengthDist) -> int | None:
    """The largest length, in tokens, `dist` can draw; None when it has no upper bound."""
    if isinstance(dist, FixedLength):
        return dist.tokens
    if isinstance(dist, UniformLength):
        return dist.high_tokens
    if isinstance(dist, QuantileLength):
        return dist.points[-1][1]
    return dist.max_tokens


class IndependentLengths(Spec):
    """Input and output lengths drawn independently, each from its own distribution."""

    kind: Literal["independent"] = "independent"
    input: LengthDist
    """User prompt tokens per request (a shared system prompt is added on top)."""
    output: LengthDist
    """Generated tokens per request."""


class EmpiricalLengths(Spec):
    """(input, output) pairs resampled jointly from a length-statistics CSV, keeping their correlation."""

    kind: Literal["empirical"] = "empirical"
    path: str
    """CSV with columns num_prefill_tokens,num_decode_tokens (sarathi-serve/Vidur stats files)."""
    max_input_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    """Clip inputs to at most this many tokens."""
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    """Clip outputs to at most this many tokens."""


class TraceLengths(Spec):
    """Take input, output and (Mooncake) hash_ids from the `trace` arrival's file."""

    kind: Literal["trace"] = "trace"


# Quantiles of ShareGPT (sharegpt_8k_filtered_stats_llama2_tokenizer.csv, 30,731 conversations).
SHAREGPT_PROMPT = QuantileLength(points=[
    (0, 1), (5, 29), (10, 74), (20, 382), (30, 777), (40, 1203), (50, 1730), (60, 2401), (70, 3235),
    (80, 4278), (90, 5696), (95, 6563), (99, 7433), (100, 8141)])
SHAREGPT_OUTPUT = QuantileLength(points=[
    (0, 2), (5, 44), (10, 84), (20, 181), (30, 271), (40, 346), (50, 415), (60, 493), (70, 581),
    (80, 683), (90, 834), (95, 920), (99, 998), (100, 1024)])
# Quantiles of arXiv summarisation (arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv).
ARXIV_PROMPT = QuantileLength(points=[
    (0, 1), (5, 748), (10, 1242), (20, 1802), (30, 2150), (40, 2453), (50, 2730), (60, 2996), (70, 3249),
    (80, 3490), (90, 3702), (95, 3813), (99, 3933), (100, 4054)])
ARXIV_OUTPUT = QuantileLength(points=[
    (0, 5), (5, 60), (10, 78), (20, 104), (30, 125), (40, 145), (50, 167), (60, 192), (70, 222),
    (80, 268), (90, 372), (95, 736), (99, 3271), (100, 4056)])
LENGTH_PRESETS: dict[str, IndependentLengths] = {
    "sharegpt": IndependentLengths(input=SHAREGPT_PROMPT, output=SHAREGPT_OUTPUT),
    "arxiv-summarization": IndependentLengths(input=ARXIV_PROMPT, output=ARXIV_OUTPUT),
}
"""Built-in length mixes: input and output quantiles of the public length-statistics files."""

LengthPresetName = Literal["sharegpt", "arxiv-summarization"]


class PresetLengths(Spec):
    """A built-in length mix (`LENGTH_PRESETS`): independent input and output quantiles of a public dataset."""

    kind: Literal["preset"] = "preset"
    name: LengthPresetName
    """`sharegpt` (chat) or `arxiv-summarization` (long prompts, short answers)."""

    def resolve(self) -> IndependentLengths:
        """The preset's input and output distributions."""
        return LENGTH_PRESETS[self.name]


LengthsSpec = Annotated[IndependentLengths | EmpiricalLengths | PresetLengths | TraceLengths, Field(discriminator="kind")]


# ---------------------------------------------------------------------------------------------
# Prefix sharing, tenants, versions
# ---------------------------------------------------------------------------------------------


class SystemPromptSpec(Spec):
    """A pool of shared system prompts; a request that uses one gets its tokens prepended."""

    count: int = Field(default=1, ge=1, le=MAX_REQUESTS)
    """Distinct system prompts."""
    tokens: int = Field(ge=1, le=MAX_TOKENS)
    """Tokens per system prompt."""
    fraction: float = Field(default=1.0, ge=0, le=1)
    """Fraction of requests (sessions) that carry a system prompt."""
    zipf_s: float = Field(default=0.0, ge=0, le=MAX_FACTOR)
    """Popularity exponent: prompt i (0-based) is picked with weight 1/(i+1)^zipf_s; 0 is uniform."""


class SessionSpec(Spec):
    """Multi-turn sessions: each arrival starts a session whose turns extend the same context."""

    mean_turns: float = Field(ge=1, le=MAX_SESSION_TURNS)
    """Mean turns per session."""
    turns_distribution: Literal["geometric", "fixed"] = "geometric"
    """`geometric` on 1, 2, ... with the given mean, or `fixed` (mean_turns must be an integer)."""
    max_turns: int | None = Field(default=None, ge=1, le=MAX_SESSION_TURNS)
    """Cap on turns per session."""
    think_time_s: float = Field(default=10.0, ge=0, le=MAX_DURATION_S)
    """Mean gap between a turn's arrival and the next turn's (exponential); it includes the
    time the previous answer took, which the generator cannot know."""
    max_context_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    """End a session before a turn whose prompt would exceed this (a model's context window)."""

    @model_validator(mode="after")
    def _check(self) -> SessionSpec:
        if self.turns_distribution == "fixed" and self.mean_turns != int(self.mean_turns):
            raise ValueError(f"turns_distribution=fixed needs an integer mean_turns, got {self.mean_turns}")
        return self


class PrefixSpec(Spec):
    """Prefix sharing: shared system prompts and multi-turn sessions."""

    system_prompts: SystemPromptSpec | None = None
    """Shared system prompts (None: no global shared prefix)."""
    sessions: SessionSpec | None = None
    """Multi-turn sessions (None: every request is a single turn)."""


class TenantSpec(Spec):
    """One tenant: a share of the traffic and optionally its own shared prefix."""

    name: str = Field(min_length=1)
    """Tag put on the tenant's requests."""
    weight: float = Field(gt=0, le=1e12)
    """Relative share of requests (sessions); weights are normalised."""
    prefix_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS)
    """Tokens of this tenant's own shared prefix (0: none). When set, it replaces the global
    system prompts for this tenant's requests."""
    prefix_fraction: float = Field(default=1.0, ge=0, le=1)
    """Fraction of this tenant's requests that carry its prefix."""


class ModelVersionPin(Spec):
    """Pin a fraction of sessions to a model version (rolling-upgrade scenarios)."""

    version: str = Field(min_length=1)
    """Version tag put on pinned requests; the rest carry None (any version)."""
    fraction: float = Field(ge=0, le=1)
    """Fraction of sessions pinned."""


class WorkloadSpec(Spec):
    """A workload: arrival process x lengths x prefix sharing x tenants, bounded in count or time."""

    arrival: ArrivalSpec
    """How requests (or sessions) arrive."""
    lengths: LengthsSpec | None = None
    """Input/output lengths; None means `trace` (only with a trace arrival)."""
    num_requests: int | None = Field(default=None, gt=0, le=MAX_REQUESTS)
    """Stop after this many requests."""
    duration_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)
    """Stop at this arrival time (requests arriving at or after it are dropped)."""
    prefix: PrefixSpec = Field(default_factory=PrefixSpec)
    """Shared system prompts and multi-turn sessions."""
    tenants: list[TenantSpec] = Field(default_factory=list)
    """Tenants and their traffic shares (empty: everything is tenant `default`)."""
    model_version_pin: ModelVersionPin | None = None
    """Optional pin of some sessions to a model version."""
    hash_block_tokens: int = Field(default=512, ge=1, le=MAX_TOKENS)
    """Tokens per hashed prefix block (Mooncake uses 512)."""
    client_max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    """`max_tokens` every client sends (outputs are clipped to it); None: clients send no cap,
    so a router knows nothing of a request's output length but what it predicts."""

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        is_trace = isinstance(self.arrival, TraceArrival)
        if not is_trace and self.num_requests is None and self.duration_s is None:
            raise ValueError("give num_requests or duration_s (or both) to bound a synthetic workload")
        if not is_trace and (self.lengths is None or isinstance(self.lengths, TraceLengths)):
            raise ValueError("lengths: a synthetic arrival needs `independent`, `empirical` or `preset` lengths; "
                             "`trace` lengths come only with arrival.kind=trace")
        if is_trace and self.prefix.sessions is not None:
            raise ValueError("prefix.sessions: a trace arrival replays requests, not sessions; remove "
                             "prefix.sessions or use a poisson/gamma arrival")
        if is_trace and self.trace_lengths and (
            self.prefix.system_prompts is not None or any(t.prefix_tokens for t in self.tenants)
        ):
            raise ValueError("prefix.system_prompts/tenants[].prefix_tokens: trace lengths take prompts and "
                             "hash_ids from the file; remove the shared prefix or give synthetic lengths")
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError(f"tenants: names must be unique, got {names}")
        return self

    @property
    def trace_lengths(self) -> bool:
        """True when lengths come from the trace file."""
        return self.lengths is None or isinstance(self.lengths, TraceLengths)
