"""The planning workload is the simulator's WorkloadSpec at a target rate, drawn by the workload package."""

from __future__ import annotations

import numpy as np
import pytest

from fleetwise.core.rng import RngStreams
from fleetwise.errors import SpecError
from fleetwise.planner.workload import PLANNER_STREAMS, build_mix
from fleetwise.spec.base import validate
from fleetwise.spec.planning import PlanWorkloadSpec
from fleetwise.spec.workload import (
    LENGTH_PRESETS,
    GammaArrival,
    IndependentLengths,
    LognormalLength,
    PoissonArrival,
    PresetLengths,
    QuantileLength,
    TraceArrival,
    UniformLength,
    WorkloadSpec,
)
from fleetwise.workload.generate import generate
from fleetwise.workload.sample import draw_gaps, draw_lengths


def plan_workload(data: dict) -> PlanWorkloadSpec:
    return validate(PlanWorkloadSpec, data, "spec.workload")


def test_it_is_a_workload_spec_whose_arrival_runs_at_the_target_rate():
    w = plan_workload({"rate_rps": 7.5, "arrival": {"kind": "gamma", "cv": 2.0},
                       "lengths": {"kind": "preset", "name": "sharegpt"}})
    assert isinstance(w, WorkloadSpec)
    assert w.arrival == GammaArrival(rate_rps=7.5, cv=2.0)
    assert plan_workload({"rate_rps": 3, "lengths": {"kind": "preset", "name": "sharegpt"}}).arrival == \
        PoissonArrival(rate_rps=3)


@pytest.mark.parametrize("old,new", [
    ({"preset": "sharegpt", "burstiness_cv": 1.0}, {"arrival": {"kind": "poisson"},
                                                    "lengths": {"kind": "preset", "name": "sharegpt"}}),
    ({"preset": "arxiv-summarization", "burstiness_cv": 2.0},
     {"arrival": {"kind": "gamma", "cv": 2.0}, "lengths": {"kind": "preset", "name": "arxiv-summarization"}}),
    ({"prompt_tokens": {"kind": "uniform", "min_tokens": 10, "max_tokens": 20},
      "output_tokens": {"kind": "lognormal", "median_tokens": 100}},
     {"lengths": {"kind": "independent", "input": {"kind": "uniform", "low_tokens": 10, "high_tokens": 20},
                  "output": {"kind": "lognormal", "median_tokens": 100, "sigma": 0.8, "min_tokens": 1,
                             "max_tokens": 32768}}}),
    ({"prompt_tokens": {"kind": "empirical", "points": [[0, 1], [100, 9]]}, "output_tokens": {"kind": "fixed", "tokens": 4}},
     {"lengths": {"kind": "independent", "input": {"kind": "quantiles", "points": [[0, 1], [100, 9]]},
                  "output": {"kind": "fixed", "tokens": 4}}}),
    ({"trace": {"path": "t.csv", "format": "auto"}}, {"arrival": {"kind": "trace", "path": "t.csv"}}),
    ({"trace": {"path": "t.jsonl", "format": "mooncake"}},
     {"arrival": {"kind": "trace", "path": "t.jsonl", "format": "mooncake"}}),
], ids=["preset-poisson", "preset-gamma", "uniform-lognormal", "empirical", "trace-auto", "trace-format"])
def test_the_former_form_reads_as_the_same_spec(old, new):
    assert plan_workload({"rate_rps": 2, **old}) == plan_workload({"rate_rps": 2, **new})


def test_presets_are_the_length_presets_and_the_names_match():
    w = plan_workload({"rate_rps": 1, "preset": "sharegpt"})
    assert isinstance(w.lengths, PresetLengths)
    assert w.lengths.resolve() is LENGTH_PRESETS["sharegpt"]
    assert set(PresetLengths.model_fields["name"].annotation.__args__) == set(LENGTH_PRESETS)  # type: ignore[union-attr]


@pytest.mark.parametrize("data,msg", [
    ({"lengths": {"kind": "preset", "name": "sharegpt"}, "prefix": {"sessions": {"mean_turns": 3}}},
     "spec.workload: prefix: the planner draws search.sample_requests independent requests"),
    ({"lengths": {"kind": "preset", "name": "sharegpt"}, "num_requests": 10}, "num_requests: the planner draws"),
    ({"lengths": {"kind": "preset", "name": "sharegpt"}, "arrival": {"kind": "poisson", "rate_rps": 4}},
     "arrival.rate_rps (4) differs from rate_rps (2)"),
    ({"preset": "sharegpt", "lengths": {"kind": "preset", "name": "sharegpt"}},
     "preset: the former form cannot be mixed with `lengths`"),
    ({"preset": "sharegpt", "trace": {"path": "t.csv"}}, "give exactly one length source"),
    ({"prompt_tokens": {"kind": "fixed", "tokens": 3}}, "prompt_tokens and output_tokens go together"),
    ({"arrival": {"kind": "trace", "path": "t.csv", "time_scale": 2.0}}, "arrival.time_scale: the planner replays"),
    ({"lengths": {"kind": "trace"}}, "lengths: give the request lengths"),
    ({"lengths": {"kind": "independent", "input": {"kind": "quantiles", "points": [[0, 5], [100, 2]]},
                  "output": {"kind": "fixed", "tokens": 1}}}, "points must run from percentile 0 to 100"),
], ids=["sessions", "num_requests", "rate-twice", "mixed-forms", "two-sources", "half-pair", "time-scale",
        "trace-lengths", "quantiles-decreasing"])
def test_what_the_planner_cannot_honour_is_refused_naming_the_field(data, msg):
    with pytest.raises(SpecError) as err:
        plan_workload({"rate_rps": 2, **data})
    assert msg in str(err.value)


def test_the_mix_is_drawn_by_the_workload_samplers_from_the_planner_streams():
    w = plan_workload({"rate_rps": 5, "arrival": {"kind": "gamma", "cv": 1.7},
                       "lengths": {"kind": "independent", "input": {"kind": "uniform", "low_tokens": 5, "high_tokens": 900},
                                   "output": {"kind": "lognormal", "median_tokens": 50, "sigma": 1.0}}})
    mix = build_mix(w, 400, seed=3)
    s = RngStreams(3)
    assert isinstance(w.lengths, IndependentLengths) and isinstance(w.arrival, GammaArrival)
    assert mix.prompt.tolist() == draw_lengths(w.lengths.input, s.get(PLANNER_STREAMS.input), 400).tolist()
    assert mix.output.tolist() == draw_lengths(w.lengths.output, s.get(PLANNER_STREAMS.output), 400).tolist()
    gaps = draw_gaps(w.arrival, 1.0, s.get("planner.arrivals"), 400)
    assert mix.unit_gaps.tolist() == (gaps / gaps.mean()).tolist()


def test_a_trace_arrival_with_synthetic_lengths_keeps_the_trace_gaps(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2024-05-01 00:00:{t:02d}.0000000,100,10\n" for t in (0, 1, 3, 6, 10)))
    w = plan_workload({"rate_rps": 2, "arrival": {"kind": "trace", "path": str(trace)},
                       "lengths": {"kind": "independent", "input": {"kind": "fixed", "tokens": 7},
                                   "output": {"kind": "fixed", "tokens": 3}}})
    assert isinstance(w.arrival, TraceArrival)
    mix = build_mix(w, 100)
    assert mix.prompt.tolist() == [7] * 5 and mix.output.tolist() == [3] * 5
    gaps = np.array([1, 2, 3, 4, 2.5])  # the last gap is the mean of the others
    assert mix.unit_gaps.tolist() == pytest.approx((gaps / gaps.mean()).tolist())


def test_the_simulator_draws_preset_and_quantile_lengths_with_the_same_sampler():
    spec = WorkloadSpec.model_validate({"arrival": {"kind": "poisson", "rate_rps": 2}, "num_requests": 300,
                                        "lengths": {"kind": "preset", "name": "arxiv-summarization"}})
    reqs = generate(spec, seed=11)
    s = RngStreams(11)
    preset = LENGTH_PRESETS["arxiv-summarization"]
    assert [r.prompt_tokens for r in reqs] == draw_lengths(preset.input, s.get("workload.input_tokens"), 300).tolist()
    assert [r.output_tokens for r in reqs] == draw_lengths(preset.output, s.get("workload.output_tokens"), 300).tolist()


def test_quantile_draws_interpolate_between_points():
    q = QuantileLength(points=[(0, 10), (50, 20), (100, 1000)])
    x = draw_lengths(q, np.random.default_rng(0), 20_000)
    assert x.min() >= 10 and x.max() <= 1000
    assert (x <= 15).mean() == pytest.approx(0.25 + 0.5 / 20 * 0.5, abs=0.02)  # 15.5 rounds down: u <= 0.2625
    assert (x <= 20).mean() == pytest.approx(0.5, abs=0.02)


def test_the_context_check_reads_the_longest_draw():
    from fleetwise.spec.workload import longest_tokens

    assert longest_tokens(UniformLength(low_tokens=3, high_tokens=9)) == 9
    assert longest_tokens(LognormalLength(median_tokens=5, sigma=1.0)) is None
    assert longest_tokens(LENGTH_PRESETS["sharegpt"].input) == 8141


def test_the_schema_lets_the_arrival_omit_the_rate_the_planner_sets():
    from fleetwise.spec.planning import planning_json_schema

    defs = planning_json_schema()["$defs"]
    assert "required" not in defs["PoissonArrival"] and defs["GammaArrival"]["required"] == ["cv"]
    assert defs["TraceArrival"]["required"] == ["path"]
    assert "rate_rps" in defs["PlanWorkloadSpec"]["required"]


@pytest.mark.parametrize(("rows", "fix"), [(3, "give a trace of at least 50 requests"),
                                           (60, "lower search.sample_requests to 60 or give a longer trace")])
def test_a_trace_shorter_than_one_simulation_run_is_refused(tmp_path, rows, fix):
    from fleetwise.planner.fit import prepare
    from fleetwise.spec.planning import PlanningSpec

    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2024-05-01 00:{t // 60:02d}:{t % 60:02d}.0000000,100,10\n" for t in range(rows)))
    spec = validate(PlanningSpec, {"model": "llama-3.1-8b", "accelerators": [{"name": "h200-sxm"}],
                                   "workload": {"rate_rps": 5, "arrival": {"kind": "trace", "path": str(trace)}},
                                   "slo": {"ttft_s": 1.0, "tpot_s": 0.05}}, "spec")
    with pytest.raises(SpecError, match=rf"^workload.arrival.path={trace}: {rows} requests to replay, fewer than the "
                                        rf"search.sample_requests=400 each simulation run replays; {fix}$"):
        prepare(spec)
