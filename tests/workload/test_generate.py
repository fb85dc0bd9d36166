"""generate(): determinism, bounds, arrival and length laws, shared prefixes, sessions, tenants, traces."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwise.core.request import Request
from fleetwise.errors import SpecError
from fleetwise.spec.base import validate
from fleetwise.spec.workload import WorkloadSpec
from fleetwise.workload.generate import generate
from fleetwise.workload.traces import trace_stats

FIXED_LENGTHS = {"kind": "independent", "input": {"kind": "fixed", "tokens": 700},
                 "output": {"kind": "fixed", "tokens": 50}}


def make_spec(**over: Any) -> WorkloadSpec:
    data: dict[str, Any] = {"arrival": {"kind": "poisson", "rate_rps": 10.0}, "num_requests": 200,
                            "lengths": FIXED_LENGTHS}
    data.update(over)
    return validate(WorkloadSpec, {k: v for k, v in data.items() if v is not None}, "test")


def check_chained(reqs: list[Request]) -> None:
    """Equal id at position i means equal first i+1 ids; one id per 512 tokens, partial block included."""
    prefix_of: dict[int, tuple[int, ...]] = {}
    for r in reqs:
        assert len(r.block_hashes) == -(-r.prompt_tokens // r.hash_block_tokens)
        for i, h in enumerate(r.block_hashes):
            assert prefix_of.setdefault(h, r.block_hashes[: i + 1]) == r.block_hashes[: i + 1]


# --- determinism and ordering -------------------------------------------------------------


RICH = {
    "prefix": {"system_prompts": {"count": 3, "tokens": 1200, "fraction": 0.6, "zipf_s": 1.0},
               "sessions": {"mean_turns": 3, "think_time_s": 5.0}},
    "tenants": [{"name": "hot", "weight": 1, "prefix_tokens": 1024}, {"name": "cold", "weight": 1}],
    "model_version_pin": {"version": "v2", "fraction": 0.25},
    "lengths": {"kind": "independent", "input": {"kind": "lognormal", "median_tokens": 300, "sigma": 1.0},
                "output": {"kind": "uniform", "low_tokens": 10, "high_tokens": 400}},
}


def test_same_seed_same_list_other_seed_other_list() -> None:
    spec = make_spec(**RICH)
    a, b, c = generate(spec, 11), generate(spec, 11), generate(spec, 12)
    assert a == b and a != c


def test_sorted_with_ids_in_order_and_exact_count() -> None:
    reqs = generate(make_spec(**RICH), 3)
    assert len(reqs) == 200 and [r.request_id for r in reqs] == [str(i) for i in range(200)]
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(reqs, reqs[1:], strict=False))
    check_chained(reqs)


def test_duration_bound_keeps_every_arrival_inside() -> None:
    reqs = generate(make_spec(num_requests=None, duration_s=50.0), 5)
    assert max(r.arrival_s for r in reqs) < 50.0 and len(reqs) == 489  # seeded Poisson(500) draw
    longer = generate(make_spec(num_requests=1000), 5)  # same stream, so the same first arrivals
    assert [r.arrival_s for r in reqs] == [r.arrival_s for r in longer if r.arrival_s < 50.0]
    both = generate(make_spec(num_requests=100, duration_s=50.0), 5)
    assert len(both) == 100


def test_duration_bound_with_sessions_is_complete() -> None:
    # Drawing more sessions than needed must not add requests inside the window.
    spec = make_spec(num_requests=None, duration_s=30.0, prefix={"sessions": {"mean_turns": 4, "think_time_s": 20}})
    reqs = generate(spec, 2)
    longer = generate(make_spec(num_requests=None, duration_s=400.0,
                                prefix={"sessions": {"mean_turns": 4, "think_time_s": 20}}), 2)
    assert max(r.arrival_s for r in reqs) < 30.0
    assert len(reqs) == sum(r.arrival_s < 30.0 for r in longer)


def test_adding_tenants_does_not_shift_arrivals_or_lengths() -> None:
    lengths = RICH["lengths"]
    plain = generate(make_spec(lengths=lengths), 9)
    tagged = generate(make_spec(lengths=lengths, tenants=[{"name": "a", "weight": 1}, {"name": "b", "weight": 3}],
                                model_version_pin={"version": "v", "fraction": 0.5}), 9)
    key = [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in plain]
    assert key == [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in tagged]
    assert {r.tenant for r in tagged} == {"a", "b"} and {r.tenant for r in plain} == {"default"}


# --- arrival laws -------------------------------------------------------------------------


@pytest.mark.parametrize("arrival,cv", [
    ({"kind": "poisson", "rate_rps": 50.0}, 1.0),
    ({"kind": "gamma", "rate_rps": 50.0, "cv": 3.0}, 3.0),
    ({"kind": "gamma", "rate_rps": 50.0, "cv": 0.5}, 0.5),
], ids=["poisson", "gamma-bursty", "gamma-smooth"])
def test_arrival_rate_and_burstiness(arrival: dict, cv: float) -> None:
    s = trace_stats(generate(make_spec(arrival=arrival, num_requests=100_000), 1))
    assert s.rate_rps == pytest.approx(50.0, rel=0.03)
    assert s.interarrival_cv == pytest.approx(cv, rel=0.03)


# --- lengths ------------------------------------------------------------------------------


def test_fixed_and_uniform_lengths() -> None:
    reqs = generate(make_spec(lengths={"kind": "independent", "input": {"kind": "fixed", "tokens": 700},
                                       "output": {"kind": "uniform", "low_tokens": 3, "high_tokens": 5}}), 1)
    assert {r.prompt_tokens for r in reqs} == {700} and {r.output_tokens for r in reqs} == {3, 4, 5}


def test_lognormal_median_p99_and_clipping() -> None:
    spec = make_spec(num_requests=50_000, lengths={
        "kind": "independent", "output": {"kind": "fixed", "tokens": 1},
        "input": {"kind": "lognormal", "median_tokens": 1000, "p99_tokens": 8000, "max_tokens": 6000,
                  "min_tokens": 100}})
    x = np.array([r.prompt_tokens for r in generate(spec, 4)])
    assert np.median(x) == pytest.approx(1000, rel=0.03)
    assert x.max() == 6000 and x.min() >= 100
    z99 = NormalDist().inv_cdf(0.99)
    tail = 1 - NormalDist().cdf(math.log(6) / (math.log(8) / z99))  # P(X > 6000) of that law: 0.0225
    assert np.mean(x == 6000) == pytest.approx(tail, abs=0.002)


def test_empirical_lengths_keep_pairs(tmp_path: Path) -> None:
    rows = [(100, 7), (2000, 3), (50, 900)]
    p = tmp_path / "stats.csv"
    p.write_text("num_prefill_tokens,num_decode_tokens\n" + "".join(f"{a},{b}\n" for a, b in rows))
    reqs = generate(make_spec(num_requests=300, lengths={"kind": "empirical", "path": str(p),
                                                          "max_output_tokens": 800}), 2)
    pairs = Counter((r.prompt_tokens, r.output_tokens) for r in reqs)
    assert set(pairs) == {(100, 7), (2000, 3), (50, 800)}
    assert min(pairs.values()) > 70


# --- prefix sharing -----------------------------------------------------------------------


def test_system_prompts_give_shared_leading_ids_and_zipf_popularity() -> None:
    spec = make_spec(num_requests=20_000, prefix={"system_prompts": {"count": 4, "tokens": 1100,
                                                                     "fraction": 0.5, "zipf_s": 1.0}})
    reqs = generate(spec, 6)
    check_chained(reqs)
    with_sys = [r for r in reqs if r.prompt_tokens == 1800]
    assert {r.prompt_tokens for r in reqs} == {700, 1800}  # the prompt is prepended to the user part
    assert len(with_sys) / len(reqs) == pytest.approx(0.5, abs=0.02)
    # 1100 tokens = 2 full blocks shared; the third block mixes system and user tokens: unique
    leading = Counter(r.block_hashes[:2] for r in with_sys)
    assert len(leading) == 4
    counts = sorted(leading.values(), reverse=True)
    assert counts[0] / counts[1] == pytest.approx(2.0, rel=0.1)  # weights 1, 1/2, 1/3, 1/4
    assert len({r.block_hashes[2] for r in with_sys}) == len(with_sys)
    plain_ids = [h for r in reqs if r.prompt_tokens == 700 for h in r.block_hashes]
    assert len(set(plain_ids)) == len(plain_ids)  # no sharing outside the system prompts


def test_hot_tenant_with_its_own_prefix() -> None:
    spec = make_spec(num_requests=10_000, tenants=[{"name": "hot", "weight": 1, "prefix_tokens": 2048},
                                                    {"name": "rest", "weight": 1}])
    reqs = generate(spec, 8)
    hot = [r for r in reqs if r.tenant == "hot"]
    assert len(hot) / len(reqs) == pytest.approx(0.5, abs=0.02)
    assert {r.block_hashes[:4] for r in hot} == {(0, 1, 2, 3)} and {r.prompt_tokens for r in hot} == {2748}
    assert all(r.block_hashes[0] not in (0, 1, 2, 3) for r in reqs if r.tenant == "rest")
    assert trace_stats(reqs).prefix_reuse_fraction == pytest.approx(0.5 * 2048 / (0.5 * 2748 + 0.5 * 700), rel=0.02)


def test_sessions_extend_the_previous_turn() -> None:
    spec = make_spec(num_requests=3000, prefix={"sessions": {"mean_turns": 4, "think_time_s": 3.0},
                                               "system_prompts": {"tokens": 600}})
    reqs = generate(spec, 10)
    check_chained(reqs)
    by_session: dict[int | None, list[Request]] = {}
    for r in reqs:
        by_session.setdefault(r.session_id, []).append(r)
    assert None not in by_session and len(by_session) < len(reqs)
    for turns in by_session.values():
        for prev, cur in zip(turns, turns[1:], strict=False):
            assert cur.prompt_tokens == prev.prompt_tokens + prev.output_tokens + 700
            full = prev.prompt_tokens // 512
            assert cur.block_hashes[:full] == prev.block_hashes[:full]
            assert cur.block_hashes[full] != prev.block_hashes[full]  # previous partial block grew
            assert cur.arrival_s > prev.arrival_s
    firsts = [t[0] for t in by_session.values()]
    assert {r.prompt_tokens for r in firsts} <= {1300}


def test_fixed_turns_and_max_context() -> None:
    spec = make_spec(num_requests=400, prefix={"sessions": {"mean_turns": 5, "turns_distribution": "fixed",
                                                            "think_time_s": 0.0, "max_context_tokens": 2300}})
    reqs = generate(spec, 1)
    assert max(r.prompt_tokens for r in reqs) <= 2300
    # turns: 700, 1450, 2200, then 2950 > 2300 ends the session
    # no think time: a session's turns arrive together, so the cut at 400 splits at most one session
    sizes = Counter(Counter(r.session_id for r in reqs).values())
    assert len(reqs) == 400 and sizes[3] == 133 and sum(sizes.values()) == 134
    assert {r.prompt_tokens for r in reqs} == {700, 1450, 2200}


def test_unfillable_sessions_are_a_spec_error() -> None:
    spec = make_spec(prefix={"sessions": {"mean_turns": 2, "max_context_tokens": 100}})
    with pytest.raises(SpecError, match="max_context_tokens"):
        generate(spec, 0)


def test_model_version_pin_fraction() -> None:
    reqs = generate(make_spec(num_requests=20_000, model_version_pin={"version": "v2", "fraction": 0.3}), 1)
    assert {r.model_version for r in reqs} == {"v2", None}
    assert sum(r.model_version == "v2" for r in reqs) / len(reqs) == pytest.approx(0.3, abs=0.015)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), sys_tokens=st.integers(1, 3000), turns=st.floats(1, 5),
       user=st.integers(1, 2000), frac=st.floats(0, 1))
def test_block_ids_are_always_chained(seed: int, sys_tokens: int, turns: float, user: int, frac: float) -> None:
    spec = make_spec(num_requests=60, lengths={"kind": "independent", "input": {"kind": "uniform", "low_tokens": 1,
                                                                                 "high_tokens": user},
                                               "output": {"kind": "fixed", "tokens": 40}},
                     prefix={"system_prompts": {"count": 2, "tokens": sys_tokens, "fraction": frac},
                             "sessions": {"mean_turns": turns, "think_time_s": 1.0}},
                     tenants=[{"name": "t", "weight": 1, "prefix_tokens": 513, "prefix_fraction": 0.5},
                              {"name": "u", "weight": 1}])
    reqs = generate(spec, seed)
    assert len(reqs) == 60
    check_chained(reqs)


# --- trace arrivals -----------------------------------------------------------------------


def _mooncake(tmp_path: Path) -> Path:
    rows = [{"timestamp": 1000 * i, "input_length": 600 + i, "output_length": 5, "hash_ids": [0, 100 + i]}
            for i in range(10)]
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_trace_arrival_with_trace_lengths(tmp_path: Path) -> None:
    spec = make_spec(arrival={"kind": "trace", "path": str(_mooncake(tmp_path)), "time_scale": 0.5, "start_s": 2},
                     lengths=None, num_requests=5, tenants=[{"name": "a", "weight": 1}])
    reqs = generate(spec, 0)
    assert [(r.arrival_s, r.prompt_tokens, r.block_hashes) for r in reqs] == [
        (0.5 * i, 602 + i, (0, 102 + i)) for i in range(5)]
    assert {r.tenant for r in reqs} == {"a"}


def test_trace_arrival_with_synthetic_lengths_and_no_bound_replays_every_row(tmp_path: Path) -> None:
    spec = make_spec(arrival={"kind": "trace", "path": str(_mooncake(tmp_path)), "max_requests": 7},
                     num_requests=None)
    reqs = generate(spec, 0)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [(1.0 * i, 700, 50) for i in range(7)]
    more = generate(make_spec(arrival={"kind": "trace", "path": str(_mooncake(tmp_path))}, num_requests=50), 0)
    assert len(more) == 10  # num_requests beyond the trace's rows: every row


def test_trace_arrival_with_synthetic_lengths_and_duration(tmp_path: Path) -> None:
    spec = make_spec(arrival={"kind": "trace", "path": str(_mooncake(tmp_path)), "rate_rps": 2.0},
                     num_requests=None, duration_s=3.0, prefix={"system_prompts": {"tokens": 512}})
    reqs = generate(spec, 0)
    assert [r.arrival_s for r in reqs] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert {r.prompt_tokens for r in reqs} == {1212} and {r.block_hashes[0] for r in reqs} == {0}
    check_chained(reqs)


@pytest.mark.parametrize("arrival", [{"kind": "poisson", "rate_rps": 1e-9}, {"kind": "gamma", "rate_rps": 1e-9, "cv": 1.5}])
def test_a_rate_that_spreads_the_requests_over_more_than_a_year_is_refused(arrival: dict) -> None:
    with pytest.raises(SpecError, match=r"^arrival: the 5 requests span [0-9.e+]+ s, more than a run may \(3.16e\+07 s, "
                                        r"one year\); raise the rate \(arrival.rate_rps, --rate\) or lower the time scale "
                                        r"\(time_scale, --arrival-stretch\), or keep fewer requests$"):
        generate(make_spec(arrival=arrival, num_requests=5), 0)


def test_a_trace_rescaled_past_a_year_is_refused(tmp_path: Path) -> None:
    spec = make_spec(arrival={"kind": "trace", "path": str(_mooncake(tmp_path)), "time_scale": 1000.0},
                     lengths=None, num_requests=None)
    assert generate(spec, 0)[-1].arrival_s == 9000.0
    p = tmp_path / "far.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 5, "output_length": 5}\n'
                 '{"timestamp": 100000000, "input_length": 5, "output_length": 5}\n')
    with pytest.raises(SpecError, match=r"^arrival: the 2 requests span 1e\+08 s, more than a run may"):
        generate(make_spec(arrival={"kind": "trace", "path": str(p), "time_scale": 1000.0}, lengths=None,
                           num_requests=None), 0)
