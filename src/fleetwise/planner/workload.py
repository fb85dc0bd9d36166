"""The planner's view of the traffic: request samples at a given rate, length statistics, burstiness.

Owns turning a `PlanWorkloadSpec` (a `WorkloadSpec` at a target rate) into a length mix and
`Request` lists for the simulator at any rate (the goodput bisection replays the same length mix
at many rates), and the statistics the analytical estimate needs. Lengths and gaps are drawn by
`fleetwise.workload.sample`, from the planner's own named streams. Does not simulate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fleetwise.core.request import Request
from fleetwise.core.rng import RngStreams
from fleetwise.errors import SpecError
from fleetwise.spec.planning import PlanWorkloadSpec
from fleetwise.spec.workload import IndependentLengths, LengthsSpec, PresetLengths, TraceArrival
from fleetwise.workload.context import limit_lengths
from fleetwise.workload.formats import get_format
from fleetwise.workload.sample import LengthStreams, draw_gaps, draw_request_lengths
from fleetwise.workload.traces import read_trace, replay_arrivals


@dataclass(frozen=True)
class LengthMix:
    """Prompt/output token pairs (the mix to replay) and the arrival gaps' shape (unit mean)."""

    prompt: np.ndarray
    output: np.ndarray
    unit_gaps: np.ndarray
    """Inter-arrival gaps scaled to mean 1; multiply by 1/rate."""
    source: str
    over_context: dict[str, int] | None = None
    """Trace lengths fitted to the model's context: {max_context_tokens, truncated, skipped}."""

    @property
    def stats(self) -> LengthStats:
        return LengthStats.of(self.prompt, self.output, self.unit_gaps)


PROMPT_BINS = 40
"""Equal-probability bins of the prompt-length distribution kept for the service-time moments
(40: each bin 2.5% of requests, so the p99 tail's weight is in the second moment)."""


@dataclass(frozen=True)
class LengthStats:
    """Percentiles and means of the mix, as the analytical estimate uses them."""

    prompt_mean: float
    prompt_p50: float
    prompt_p90: float
    prompt_p99: float
    prompt_max: int
    output_mean: float
    output_p50: float
    output_p99: float
    output_max: int
    interarrival_cv: float
    prompt_bins: tuple[float, ...] = ()
    """The prompt-length distribution as PROMPT_BINS equal-probability bins (each bin's midpoint
    quantile): what the P:D queueing model prices service times over (M/G/1)."""

    @staticmethod
    def of(prompt: np.ndarray, output: np.ndarray, gaps: np.ndarray) -> LengthStats:
        pp = np.percentile(prompt, [50, 90, 99])
        op = np.percentile(output, [50, 99])
        cv = float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0 else 1.0
        bins = tuple(float(x) for x in np.percentile(prompt, (np.arange(PROMPT_BINS) + 0.5) * 100 / PROMPT_BINS))
        return LengthStats(float(prompt.mean()), float(pp[0]), float(pp[1]), float(pp[2]), int(prompt.max()),
                           float(output.mean()), float(op[0]), float(op[1]), int(output.max()), cv, bins)

    def percentile_prompt(self, pct: int) -> float:
        return {50: self.prompt_p50, 90: self.prompt_p90, 99: self.prompt_p99}[pct]


Z99 = 2.326
"""99th percentile of the standard normal (2.3263...), to 3 places: the burst factor's counting-noise bound."""

PLANNER_STREAMS = LengthStreams(input="planner.prompt", output="planner.output", pairs="planner.lengths")
"""The planner's own random streams for lengths (arrival gaps come from `planner.arrivals`)."""


def build_mix(spec: PlanWorkloadSpec, n: int, seed: int = 0, max_context_tokens: int | None = None) -> LengthMix:
    """`n` requests' lengths and unit arrival gaps from the spec, reproducible from `seed`, drawn by the
    workload package's samplers from the planner's own streams. Trace lengths are fitted to
    `max_context_tokens` (when given) per `spec.over_context`."""
    streams = RngStreams(seed)
    a = spec.arrival
    if isinstance(a, TraceArrival):
        if a.format is not None:
            get_format(a.format, "workload.arrival.format")
        table = replay_arrivals(read_trace(a.path, a.format, a.columns), rate_rps=1.0, start_s=a.start_s,
                                max_requests=min(n, a.max_requests or n), seed=seed,
                                rate_field=f"workload.rate_rps={spec.rate_rps:g}")
        assert table.arrival_s is not None
        t = table.arrival_s
        gaps = _trace_gaps(t)
        if spec.trace_lengths:
            prompt, output = table.prompt_tokens.astype(np.int64), table.output_tokens.astype(np.int64)
            counts = None
            if max_context_tokens is not None:
                keep, prompt, output, counts = limit_lengths(
                    prompt, output, max_context_tokens, spec.over_context, f"workload.arrival.path={a.path}",
                    "set workload.over_context: truncate|skip")
                if not keep.any():
                    raise SpecError(f"workload.over_context={spec.over_context}: every trace request was skipped; "
                                    f"none fits the model's context of {max_context_tokens:,} tokens")
                gaps = gaps if keep.all() else _trace_gaps(t[keep])  # a skipped request's gap joins the next
            mean = gaps.mean() if gaps.mean() > 0 else 1.0
            return LengthMix(prompt, output, gaps / mean, f"trace {a.path}", counts)
        source = f"trace {a.path} arrivals"
    else:
        gaps = draw_gaps(a, 1.0, streams.get("planner.arrivals"), n)
        source = f"{a.kind} arrivals"
    assert spec.lengths is not None
    prompt, output = draw_request_lengths(spec.lengths, streams, len(gaps), PLANNER_STREAMS)
    return LengthMix(prompt, output, gaps / gaps.mean(), f"{source}, {_describe(spec.lengths)} lengths")


def _trace_gaps(t: np.ndarray) -> np.ndarray:
    """Inter-arrival gaps of trace arrival times `t` (the last one the mean, so there is one per request)."""
    gaps = np.diff(t, prepend=0.0)[1:] if len(t) > 1 else np.ones(1)
    return np.append(gaps, gaps.mean() if len(gaps) else 1.0)


def _describe(lengths: LengthsSpec) -> str:
    if isinstance(lengths, PresetLengths):
        return f"preset {lengths.name}"
    if isinstance(lengths, IndependentLengths):
        return f"input {lengths.input.kind}, output {lengths.output.kind}"
    return lengths.kind


def requests_at(mix: LengthMix, rate_rps: float, count: int | None = None,
                retime: Callable[[np.ndarray], np.ndarray] | None = None) -> list[Request]:
    """The mix's first `count` requests arriving at mean rate `rate_rps` (same lengths at every rate);
    the sample's gaps are rescaled to mean exactly 1/rate, so a short run is offered the target rate.
    `retime` maps those arrival times (s) to the ones the requests get (e.g. a burst's)."""
    n = len(mix.prompt) if count is None else min(count, len(mix.prompt))
    gaps = mix.unit_gaps[:n]
    if n > 1 and gaps[: n - 1].mean() > 0:
        gaps = gaps / gaps[: n - 1].mean()  # the sample itself arrives at exactly `rate_rps` on average
    gaps = gaps / rate_rps
    t = np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n else np.zeros(0)
    if retime is not None:
        t = retime(t)
    p, o = mix.prompt[:n].astype(np.int64).tolist(), mix.output[:n].astype(np.int64).tolist()
    return [Request(str(i), ti, pi, oi) for i, ti, pi, oi in zip(range(n), t.tolist(), p, o, strict=True)]


def burst_factor(mix: LengthMix, rate_rps: float, window_s: float) -> float:
    """p99 over windows of the arrival count, divided by the mean count (>= 1).

    With few requests per window this is dominated by counting noise (Poisson: about
    1 + 2.33/sqrt(rate*window)), which is also what a fleet must absorb at that rate.
    """
    t = np.cumsum(mix.unit_gaps) / rate_rps
    if t[-1] < 2 * window_s:
        mean = rate_rps * window_s
        return max(1.0, 1.0 + Z99 * mix.stats.interarrival_cv / math.sqrt(max(mean, 1e-9)))
    counts = np.bincount((t // window_s).astype(np.int64))[:-1]
    return max(1.0, float(np.percentile(counts, 99) / counts.mean()))
