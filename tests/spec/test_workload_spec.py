"""WorkloadSpec: YAML loading per arrival kind, validation messages, log-normal parameter solving."""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetwise.errors import SpecError
from fleetwise.spec.base import load_document, validate
from fleetwise.spec.workload import (
    EmpiricalLengths,
    GammaArrival,
    IndependentLengths,
    LognormalLength,
    PoissonArrival,
    TraceArrival,
    WorkloadSpec,
)

Z99 = NormalDist().inv_cdf(0.99)

POISSON_YAML = """
arrival: {kind: poisson, rate_rps: 4.0}
num_requests: 1000
lengths:
  kind: independent
  input: {kind: lognormal, median_tokens: 1000, sigma: 0.8, max_tokens: 8192}
  output: {kind: fixed, tokens: 128}
prefix:
  system_prompts: {count: 4, tokens: 1024, fraction: 0.5, zipf_s: 1.0}
  sessions: {mean_turns: 3, think_time_s: 20, max_context_tokens: 32768}
tenants:
  - {name: hot, weight: 0.5, prefix_tokens: 2048}
  - {name: rest, weight: 0.5}
model_version_pin: {version: v2, fraction: 0.1}
"""

GAMMA_YAML = """
arrival: {kind: gamma, rate_rps: 10, cv: 3}
duration_s: 600
lengths: {kind: empirical, path: stats.csv, max_input_tokens: 4096}
"""

TRACE_YAML = """
arrival: {kind: trace, path: trace.jsonl, rate_rps: 2.0, start_s: 60, max_requests: 500}
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "w.yaml"
    p.write_text(text)
    return p


def test_poisson_yaml_loads_every_part(tmp_path: Path) -> None:
    w = load_document(WorkloadSpec, _write(tmp_path, POISSON_YAML))
    assert w.arrival == PoissonArrival(rate_rps=4.0)
    assert isinstance(w.lengths, IndependentLengths) and isinstance(w.lengths.input, LognormalLength)
    assert w.lengths.input.max_tokens == 8192
    assert w.prefix.system_prompts is not None and w.prefix.system_prompts.zipf_s == 1.0
    assert w.prefix.sessions is not None and w.prefix.sessions.mean_turns == 3
    assert [(t.name, t.prefix_tokens) for t in w.tenants] == [("hot", 2048), ("rest", 0)]
    assert w.model_version_pin is not None and w.model_version_pin.version == "v2"
    assert w.hash_block_tokens == 512


def test_gamma_yaml_with_empirical_lengths(tmp_path: Path) -> None:
    w = load_document(WorkloadSpec, _write(tmp_path, GAMMA_YAML))
    assert w.arrival == GammaArrival(rate_rps=10, cv=3)
    assert w.lengths == EmpiricalLengths(path="stats.csv", max_input_tokens=4096)
    assert w.num_requests is None and w.duration_s == 600


def test_trace_yaml_defaults_to_trace_lengths(tmp_path: Path) -> None:
    w = load_document(WorkloadSpec, _write(tmp_path, TRACE_YAML))
    assert isinstance(w.arrival, TraceArrival)
    assert (w.arrival.rate_rps, w.arrival.start_s, w.arrival.max_requests) == (2.0, 60, 500)
    assert w.lengths is None and w.trace_lengths


BASE = {"arrival": {"kind": "poisson", "rate_rps": 1}, "num_requests": 10,
        "lengths": {"kind": "independent", "input": {"kind": "fixed", "tokens": 10},
                    "output": {"kind": "fixed", "tokens": 10}}}

BAD = [
    ("no-bound", {**BASE, "num_requests": None}, "give num_requests or duration_s"),
    ("typo", {**BASE, "num_request": 5}, "num_request: unknown field"),
    ("negative-rate", {**BASE, "arrival": {"kind": "poisson", "rate_rps": -1}}, "arrival.poisson.rate_rps"),
    ("unknown-kind", {**BASE, "arrival": {"kind": "weibull", "rate_rps": 1}}, "arrival"),
    ("scale-and-rate", {"arrival": {"kind": "trace", "path": "t.csv", "time_scale": 2, "rate_rps": 3}},
     "either time_scale (2.0) or rate_rps (3.0)"),
    ("trace-lengths-synthetic", {**BASE, "lengths": {"kind": "trace"}}, "`trace` lengths come only with"),
    ("sessions-on-trace", {"arrival": {"kind": "trace", "path": "t.csv"},
                           "prefix": {"sessions": {"mean_turns": 2}}}, "prefix.sessions"),
    ("sysprompt-on-trace-lengths", {"arrival": {"kind": "trace", "path": "t.csv"},
                                    "prefix": {"system_prompts": {"tokens": 100}}}, "trace lengths take prompts"),
    ("uniform-reversed", {**BASE, "lengths": {"kind": "independent", "input": {"kind": "uniform", "low_tokens": 9,
                          "high_tokens": 3}, "output": {"kind": "fixed", "tokens": 1}}}, "high_tokens (3)"),
    ("lognormal-two-centres", {**BASE, "lengths": {"kind": "independent", "output": {"kind": "fixed", "tokens": 1},
                               "input": {"kind": "lognormal", "median_tokens": 5, "mean_tokens": 6, "sigma": 1}}},
     "exactly one of median_tokens and mean_tokens"),
    ("lognormal-impossible-p99", {**BASE, "lengths": {"kind": "independent", "output": {"kind": "fixed", "tokens": 1},
                                  "input": {"kind": "lognormal", "mean_tokens": 100, "p99_tokens": 90}}},
     "no log-normal has mean 100.0 and p99 90.0"),
    ("clip-reversed", {**BASE, "lengths": {"kind": "independent", "output": {"kind": "fixed", "tokens": 1},
                       "input": {"kind": "lognormal", "median_tokens": 5, "sigma": 1, "min_tokens": 9,
                                 "max_tokens": 3}}}, "max_tokens (3) is below min_tokens (9)"),
    ("duplicate-tenant", {**BASE, "tenants": [{"name": "a", "weight": 1}, {"name": "a", "weight": 2}]},
     "names must be unique"),
    ("fixed-turns-fraction", {**BASE, "prefix": {"sessions": {"mean_turns": 2.5, "turns_distribution": "fixed"}}},
     "integer mean_turns"),
    ("fraction-above-one", {**BASE, "model_version_pin": {"version": "v", "fraction": 1.5}},
     "model_version_pin.fraction"),
]


@pytest.mark.parametrize("data,needle", [(d, n) for _, d, n in BAD], ids=[i for i, _, _ in BAD])
def test_bad_specs_name_field_and_fix(data: dict, needle: str) -> None:
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(SpecError) as err:
        validate(WorkloadSpec, data, "w.yaml")
    assert needle in str(err.value) and str(err.value).startswith("w.yaml: ")


def test_missing_workload_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="file not found"):
        load_document(WorkloadSpec, tmp_path / "nope.yaml")


def test_lognormal_median_sigma_and_median_p99() -> None:
    assert LognormalLength(median_tokens=1000, sigma=0.5).mu_sigma() == (math.log(1000), 0.5)
    mu, s = LognormalLength(median_tokens=1000, p99_tokens=4000).mu_sigma()
    assert mu == math.log(1000) and s == pytest.approx(math.log(4) / Z99, rel=1e-12)
    mu, s = LognormalLength(mean_tokens=1000, sigma=0.5).mu_sigma()
    assert math.exp(mu + s * s / 2) == pytest.approx(1000, rel=1e-12)


@given(mean=st.floats(10, 1e5), ratio=st.floats(1.01, 14.0))
def test_lognormal_mean_p99_round_trips(mean: float, ratio: float) -> None:
    mu, s = LognormalLength(mean_tokens=mean, p99_tokens=mean * ratio).mu_sigma()
    assert math.exp(mu + s * s / 2) == pytest.approx(mean, rel=1e-9)
    assert math.exp(mu + Z99 * s) == pytest.approx(mean * ratio, rel=1e-9)


def test_a_retired_field_names_its_replacement_and_a_typo_stays_unknown() -> None:
    from fleetwise.spec.base import Spec

    class Inner(Spec):
        retired_fields = {"old": "write `new` instead"}
        new: int = 0

    class Outer(Spec):
        items: tuple[Inner, ...] = ()

    with pytest.raises(SpecError, match=r"^f: items\.1\.old: no longer read; write `new` instead \(got 3\)$"):
        validate(Outer, {"items": [{}, {"old": 3}]}, "f", strict=True)
    with pytest.raises(SpecError, match=r"items\.0\.od: unknown field; remove it"):
        validate(Outer, {"items": [{"od": 3}]}, "f", strict=True)
