"""Results: summary format, determinism for a fixed seed, records on disk, metric helpers."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from fleetwise.core.request import Request
from fleetwise.sim.results import CSV_COLUMNS, SCHEMA_VERSION, pct, record_rows, weighted_pct
from fleetwise.sim.runner import SimOptions, simulate
from fleetwise.spec.plan import PlanSpec
from fleetwise.spec.slo import SLOSpec


def make_requests(n=300, seed=5):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.05, n))
    ins, outs = rng.integers(64, 2048, n), rng.integers(4, 200, n)
    return [Request(str(i), float(t[i]), int(ins[i]), int(outs[i]), tenant=f"t{i % 2}") for i in range(n)]


PLAN = PlanSpec(routing="power-of-two", pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b",
                                                "replicas": 3}])


def test_same_seed_same_inputs_give_identical_summary_and_records(tmp_path):
    opts = SimOptions(seed=11, slo=SLOSpec(ttft_max_s=0.2, tpot_max_s=0.02), feedback_delay_s=0.1)
    a = simulate(PLAN, make_requests(), options=opts)
    b = simulate(PLAN, make_requests(), options=opts)
    sa, sb = dict(a.summary), dict(b.summary)
    sa.pop("sim_wall_s"), sb.pop("sim_wall_s")
    assert json.dumps(sa, sort_keys=True) == json.dumps(sb, sort_keys=True)
    a.write(tmp_path / "a")
    b.write(tmp_path / "b")
    assert (tmp_path / "a/requests.csv").read_text() == (tmp_path / "b/requests.csv").read_text()


def test_summary_has_the_documented_fields():
    s = simulate(PLAN, make_requests(), options=SimOptions(seed=1, slo=SLOSpec(ttft_max_s=0.5))).summary
    assert s["schema"] == SCHEMA_VERSION and s["seed"] == 1
    for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(s[k]) == {"p50", "p90", "p99", "mean"}
        assert 0 < s[k]["p50"] <= s[k]["p90"] <= s[k]["p99"]
    assert s["requests_completed"] == 300 and s["requests_failed"] == 0
    assert 0 < s["goodput_rps"] <= s["throughput"]["requests_per_s"]
    assert 0 < s["slo_attainment"] <= 1
    assert [r["name"] for r in s["per_replica"]] == ["m-0", "m-1", "m-2"]
    assert sum(r["requests"] for r in s["per_replica"]) == 300
    for r in s["per_replica"]:
        assert 0 < r["utilization"] <= 1 and 0 <= r["kv_usage"]["mean"] <= r["kv_usage"]["max"] <= 1
        assert 0 < len(r["queue_length"]["t_s"]) <= 257
    assert s["cost"]["gpus"] == 3 and s["cost"]["usd_per_1m_output_tokens"] > 0
    assert s["kv_transfer"]["count"] == 0
    assert s["router"]["policy"] == "power-of-two"
    assert isinstance(s["sim_wall_s"], float)


def test_records_csv_has_one_row_per_request_with_consistent_times(tmp_path):
    res = simulate(PLAN, make_requests(50), options=SimOptions(seed=2))
    paths = res.write(tmp_path)
    rows = list(csv.DictReader(open(paths["records"])))
    assert list(rows[0]) == list(CSV_COLUMNS) and len(rows) == 50
    for r in rows:
        arr, first, fin = float(r["arrival_s"]), float(r["first_token_s"]), float(r["finish_s"])
        assert arr <= first <= fin
        assert float(r["ttft_s"]) == pytest.approx(first - arr, abs=1e-8)
        assert r["worker"].startswith("m-") and r["failure"] == ""
    assert json.loads(open(paths["summary"]).read())["requests_total"] == 50


def test_percentile_helpers():
    assert pct(np.arange(1, 101, dtype=float))["p50"] == pytest.approx(50.5)
    assert pct(np.empty(0)) == {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0}
    w = weighted_pct(np.array([1.0, 2.0]), np.array([9, 1]))
    assert w["p50"] == 1.0 and w["p99"] == 2.0 and w["mean"] == pytest.approx(1.1)


def test_slo_met_checks_only_set_targets():
    slo = SLOSpec(ttft_max_s=0.1)
    assert slo.met(0.1, 10.0, 100.0) and not slo.met(0.11, 0.0, 0.0)
    assert SLOSpec().met(9.0, 9.0, 9.0)


def test_tpot_of_one_token_outputs_is_undefined_not_zero():
    """TPOT needs two output tokens: a run of 1-token outputs reports it as null (not 0.0), its
    records leave the cell empty, and a TPOT target cannot be missed by a 1-token output."""
    plan = PlanSpec(pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b"}])
    reqs = [Request(str(i), 0.1 * i, 300, 1) for i in range(4)]
    res = simulate(plan, reqs, options=SimOptions(slo=SLOSpec(tpot_max_s=1e-6)))
    s = res.summary
    assert s["requests_completed"] == 4
    assert s["tpot_s"] == {"p50": None, "p90": None, "p99": None, "mean": None}
    assert s["slo_attainment"] == 1.0
    assert json.loads(json.dumps(s, allow_nan=False))["tpot_s"]["p99"] is None
    assert [row[CSV_COLUMNS.index("tpot_s")] for row in record_rows(res.records, res.replica_names)] == [""] * 4


def test_slo_met_treats_an_undefined_tpot_as_met():
    slo = SLOSpec(tpot_max_s=0.01)
    assert slo.met(0.5, math.nan, 1.0) and not slo.met(0.5, 0.02, 1.0)


def _met_rule(slo: SLOSpec, ttft: float, tpot: float, e2e: float) -> bool:
    """The documented rule for one request, written out: each set target at or above its figure, a NaN TPOT meets any."""
    return ((slo.ttft_max_s is None or ttft <= slo.ttft_max_s) and (slo.tpot_max_s is None or not tpot > slo.tpot_max_s)
            and (slo.e2e_max_s is None or e2e <= slo.e2e_max_s))


def test_slo_met_over_arrays_is_the_rule_per_request_on_edge_values():
    """Equality meets a target, just above misses it, NaN TTFT or E2E misses, NaN TPOT meets; an
    unset target is not checked; one request's floats give the same answer as the arrays."""
    edges = [0.0, 0.1, np.nextafter(0.1, 1.0), np.nextafter(0.1, 0.0), 1.0, math.inf, math.nan]
    grid = np.array([(a, b, c) for a in edges for b in edges for c in edges]).T
    for slo in (SLOSpec(), SLOSpec(ttft_max_s=0.1), SLOSpec(tpot_max_s=0.1), SLOSpec(e2e_max_s=0.1),
                SLOSpec(ttft_max_s=0.1, tpot_max_s=0.1, e2e_max_s=1.0)):
        want = [_met_rule(slo, *col) for col in grid.T]
        got = slo.met(*grid)
        assert got.dtype == np.bool_ and got.tolist() == want
        assert [bool(slo.met(*col)) for col in grid.T.tolist()] == want
    assert SLOSpec(tpot_max_s=0.1).met(1.0, math.nan, 1.0) and not SLOSpec(ttft_max_s=0.1).met(math.nan, 0.0, 0.0)


def test_summary_without_replica_series_is_the_summary_less_them():
    """`replica_series=False` drops exactly each replica's three sampled series; every other figure is the same."""
    opts = SimOptions(seed=3, slo=SLOSpec(ttft_max_s=0.2, tpot_max_s=0.02))
    full = simulate(PLAN, make_requests(120), options=opts).summary
    lean = simulate(PLAN, make_requests(120), options=SimOptions(seed=3, slo=opts.slo, replica_series=False)).summary
    series = ("queue_length", "running", "kv_usage_series")
    assert all(len(r["queue_length"]["t_s"]) > 0 for r in full["per_replica"])
    for r in full["per_replica"]:
        for k in series:
            del r[k]
    full.pop("sim_wall_s"), lean.pop("sim_wall_s")
    assert json.dumps(lean, sort_keys=True) == json.dumps(full, sort_keys=True)
