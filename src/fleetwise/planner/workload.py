"""The planner's view of the traffic: request samples at a given rate, length statistics, burstiness.

Owns turning a `PlanWorkloadSpec` (preset, distributions or trace) into `Request` lists for the
simulator, seeded by named streams, at any rate (the goodput bisection replays the same length
mix at many rates), and the statistics the analytical estimate needs. Does not simulate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fleetwise.core.request import Request
from fleetwise.core.rng import RngStreams
from fleetwise.spec.planning import (
    LENGTH_PRESETS,
    EmpiricalLengths,
    FixedLengths,
    LengthDist,
    LognormalLengths,
    PlanWorkloadSpec,
    UniformLengths,
)


@dataclass(frozen=True)
class LengthMix:
    """Prompt/output token pairs (the mix to replay) and the arrival gaps' shape (unit mean)."""

    prompt: np.ndarray
    output: np.ndarray
    unit_gaps: np.ndarray
    """Inter-arrival gaps scaled to mean 1; multiply by 1/rate."""
    source: str

    @property
    def stats(self) -> LengthStats:
        return LengthStats.of(self.prompt, self.output, self.unit_gaps)


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

    @staticmethod
    def of(prompt: np.ndarray, output: np.ndarray, gaps: np.ndarray) -> LengthStats:
        pp = np.percentile(prompt, [50, 90, 99])
        op = np.percentile(output, [50, 99])
        cv = float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0 else 1.0
        return LengthStats(float(prompt.mean()), float(pp[0]), float(pp[1]), float(pp[2]), int(prompt.max()),
                           float(output.mean()), float(op[0]), float(op[1]), int(output.max()), cv)

    def percentile_prompt(self, pct: int) -> float:
        return {50: self.prompt_p50, 90: self.prompt_p90, 99: self.prompt_p99}[pct]


def _draw(dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(dist, FixedLengths):
        return np.full(n, dist.tokens, dtype=np.int64)
    if isinstance(dist, UniformLengths):
        return rng.integers(dist.min_tokens, dist.max_tokens + 1, size=n)
    if isinstance(dist, LognormalLengths):
        x = np.exp(rng.normal(math.log(dist.median_tokens), dist.sigma, size=n))
        return np.clip(np.rint(x), dist.min_tokens, dist.max_tokens).astype(np.int64)
    assert isinstance(dist, EmpiricalLengths)
    ps = np.array([p for p, _ in dist.points]) / 100.0
    ts = np.array([t for _, t in dist.points], dtype=np.float64)
    return np.maximum(1, np.rint(np.interp(rng.random(n), ps, ts))).astype(np.int64)


def _gamma_gaps(cv: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-mean Gamma gaps with coefficient of variation `cv` (shape 1/cv^2)."""
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, 1.0 / shape, size=n)


def build_mix(spec: PlanWorkloadSpec, n: int, seed: int = 0) -> LengthMix:
    """`n` requests' lengths and unit arrival gaps from the spec, reproducible from `seed`."""
    streams = RngStreams(seed)
    if spec.trace is not None:
        return _mix_from_trace(spec, n, seed)
    prompt_d: LengthDist
    output_d: LengthDist
    if spec.preset is not None:
        prompt_d, output_d = LENGTH_PRESETS[spec.preset]
        source = f"preset {spec.preset}"
    else:
        assert spec.prompt_tokens is not None and spec.output_tokens is not None
        prompt_d, output_d = spec.prompt_tokens, spec.output_tokens
        source = f"prompt {prompt_d.kind}, output {output_d.kind}"
    prompt = _draw(prompt_d, n, streams.get("planner.prompt"))
    output = _draw(output_d, n, streams.get("planner.output"))
    gaps = _gamma_gaps(spec.burstiness_cv, n, streams.get("planner.arrivals"))
    return LengthMix(prompt, output, gaps / gaps.mean(), source)


def _mix_from_trace(spec: PlanWorkloadSpec, n: int, seed: int) -> LengthMix:
    from fleetwise.workload.traces import load_trace

    assert spec.trace is not None
    fmt = None if spec.trace.format == "auto" else spec.trace.format
    reqs = load_trace(spec.trace.path, format=fmt, rate_rps=1.0, max_requests=n, seed=seed)
    prompt = np.array([r.prompt_tokens for r in reqs], dtype=np.int64)
    output = np.array([max(1, r.output_tokens) for r in reqs], dtype=np.int64)
    t = np.array([r.arrival_s for r in reqs])
    gaps = np.diff(t, prepend=0.0)[1:] if len(t) > 1 else np.ones(1)
    gaps = np.append(gaps, gaps.mean() if len(gaps) else 1.0)
    mean = gaps.mean() if gaps.mean() > 0 else 1.0
    return LengthMix(prompt, output, gaps / mean, f"trace {spec.trace.path}")


def requests_at(mix: LengthMix, rate_rps: float, count: int | None = None) -> list[Request]:
    """The mix's first `count` requests arriving at mean rate `rate_rps` (same lengths at every rate);
    the sample's gaps are rescaled to mean exactly 1/rate, so a short run is offered the target rate."""
    n = len(mix.prompt) if count is None else min(count, len(mix.prompt))
    gaps = mix.unit_gaps[:n]
    if n > 1 and gaps[: n - 1].mean() > 0:
        gaps = gaps / gaps[: n - 1].mean()  # the sample itself arrives at exactly `rate_rps` on average
    gaps = gaps / rate_rps
    t = np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n else np.zeros(0)
    p, o, ts = mix.prompt.tolist(), mix.output.tolist(), t.tolist()
    return [Request(str(i), ts[i], int(p[i]), int(o[i])) for i in range(n)]


def burst_factor(mix: LengthMix, rate_rps: float, window_s: float) -> float:
    """p99 over windows of the arrival count, divided by the mean count (>= 1).

    With few requests per window this is dominated by counting noise (Poisson: about
    1 + 2.33/sqrt(rate*window)), which is also what a fleet must absorb at that rate.
    """
    t = np.cumsum(mix.unit_gaps) / rate_rps
    if t[-1] < 2 * window_s:
        mean = rate_rps * window_s
        z99 = 2.326
        return max(1.0, 1.0 + z99 * mix.stats.interarrival_cv / math.sqrt(max(mean, 1e-9)))
    counts = np.bincount((t // window_s).astype(np.int64))[:-1]
    return max(1.0, float(np.percentile(counts, 99) / counts.mean()))
