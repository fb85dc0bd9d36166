"""The one sampler of each declared distribution: length distributions, length mixes, arrival gaps.

Owns turning a `LengthDist`, a `LengthsSpec` or a synthetic arrival of `fleetwise.spec.workload`
into numpy draws from generators the caller names. `generate` (the simulator's and the load
generator's requests) and the planner's length mix both draw through these functions, each from
its own named streams, so one distribution never has two implementations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetwise.core.rng import RngStreams
from fleetwise.errors import SpecError
from fleetwise.spec.workload import (
    EmpiricalLengths,
    FixedLength,
    GammaArrival,
    IndependentLengths,
    LengthDist,
    LengthsSpec,
    PoissonArrival,
    PresetLengths,
    QuantileLength,
    UniformLength,
)
from fleetwise.workload.traces import read_length_stats

UNBOUNDED_TOKENS = np.iinfo(np.int64).max // 4
"""Upper clip of a log-normal without `max_tokens`: no clip in practice, and no int64 overflow."""


@dataclass(frozen=True)
class LengthStreams:
    """Names of the random streams input lengths, output lengths and joint (input, output) rows come from."""

    input: str = "workload.input_tokens"
    output: str = "workload.output_tokens"
    pairs: str = "workload.lengths"


def draw_lengths(dist: LengthDist, rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` token counts (int64) drawn from `dist`."""
    if isinstance(dist, FixedLength):
        return np.full(n, dist.tokens, dtype=np.int64)
    if isinstance(dist, UniformLength):
        return rng.integers(dist.low_tokens, dist.high_tokens + 1, size=n, dtype=np.int64)
    if isinstance(dist, QuantileLength):
        ps = np.array([p for p, _ in dist.points]) / 100.0
        ts = np.array([t for _, t in dist.points], dtype=np.float64)
        return np.maximum(1, np.rint(np.interp(rng.random(n), ps, ts))).astype(np.int64)
    mu, sigma = dist.mu_sigma()
    x = np.rint(rng.lognormal(mu, sigma, size=n))
    hi = dist.max_tokens if dist.max_tokens is not None else UNBOUNDED_TOKENS
    return np.clip(x, dist.min_tokens, hi).astype(np.int64)


def draw_request_lengths(lengths: LengthsSpec, streams: RngStreams, n: int,
                         names: LengthStreams = LengthStreams()) -> tuple[np.ndarray, np.ndarray]:
    """(input tokens, output tokens) of `n` requests from synthetic `lengths` (not `trace` lengths)."""
    if isinstance(lengths, PresetLengths):
        lengths = lengths.resolve()
    if isinstance(lengths, IndependentLengths):
        return (draw_lengths(lengths.input, streams.get(names.input), n),
                draw_lengths(lengths.output, streams.get(names.output), n))
    assert isinstance(lengths, EmpiricalLengths), f"not synthetic lengths: {lengths.kind}"
    inp, out = _empirical_table(lengths.path)
    idx = streams.get(names.pairs).integers(0, len(inp), size=n)
    u, o = np.maximum(inp[idx], 1), np.maximum(out[idx], 1)
    if lengths.max_input_tokens is not None:
        u = np.minimum(u, lengths.max_input_tokens)
    if lengths.max_output_tokens is not None:
        o = np.minimum(o, lengths.max_output_tokens)
    return u, o


def _empirical_table(path: str) -> tuple[np.ndarray, np.ndarray]:
    inp, out = read_length_stats(path)
    if len(inp) == 0:
        raise SpecError(f"lengths.path: {path} has no rows; give a length-statistics CSV with data")
    return inp, out


def draw_gaps(arrival: PoissonArrival | GammaArrival, rate_rps: float, rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` inter-arrival gaps, seconds, of `arrival`'s process at mean rate `rate_rps` (exponential or Gamma)."""
    if isinstance(arrival, PoissonArrival):
        return rng.exponential(1.0 / rate_rps, size=n)
    shape = 1.0 / (arrival.cv * arrival.cv)  # mean shape*scale = 1/rate, CV = 1/sqrt(shape)
    return rng.gamma(shape, 1.0 / (rate_rps * shape), size=n)
