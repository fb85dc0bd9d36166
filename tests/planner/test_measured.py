"""Measured throughput as an input: a load test's result replaces the simulated goodput."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetwise.errors import SpecError
from fleetwise.planner.api import plan
from fleetwise.planner.loadtest import load_measurement
from fleetwise.planner.report import to_json
from fleetwise.planner.state import PlanOptions
from fleetwise.spec.planning import MeasuredThroughput, PlanSLOSpec

SLO = PlanSLOSpec(ttft_s=1.0, tpot_s=0.05, percentile=90, attainment=0.9)


def _guidellm(tmp_path: Path) -> Path:
    def bench(rate: float, ttft_p90_ms: float, itl_p90_ms: float) -> dict[str, object]:
        pct = {"p50": 0.5, "p90": 1.0, "p99": 2.0}
        return {"metrics": {
            "requests_per_second": {"successful": {"mean": rate}},
            "time_to_first_token_ms": {"successful": {"percentiles": {k: ttft_p90_ms * f for k, f in pct.items()}}},
            "inter_token_latency_ms": {"successful": {"percentiles": {k: itl_p90_ms * f for k, f in pct.items()}}}}}
    p = tmp_path / "guidellm.json"
    p.write_text(json.dumps({"benchmarks": [bench(0.1, 200, 20), bench(0.15, 600, 30), bench(0.3, 1800, 40)]}))
    return p


def test_guidellm_sweep_gives_the_highest_rate_meeting_the_slo(tmp_path) -> None:
    m = load_measurement(MeasuredThroughput(path=str(_guidellm(tmp_path)), accelerator="h100-sxm"), "measured.0")
    assert m.tool == "guidellm" and [p.rate_rps for p in m.points] == [0.1, 0.15, 0.3]
    assert m.points[1].ttft_s["p90"] == pytest.approx(0.6)
    assert m.goodput_rps(SLO) == 0.15  # 0.3 req/s misses TTFT p90 (1.8 s)
    assert m.goodput_rps(SLO.model_copy(update={"ttft_s": 2.0})) == 0.3


def test_aiperf_and_fleetwise_results(tmp_path) -> None:
    a = tmp_path / "profile_export_aiperf.json"
    a.write_text(json.dumps({"request_throughput": {"unit": "requests/sec", "avg": 4.2},
                             "time_to_first_token": {"unit": "ms", "p50": 300.0, "p90": 900.0, "p99": 1500.0},
                             "inter_token_latency": {"unit": "ms", "p50": 20.0, "p90": 40.0, "p99": 60.0}}))
    m = load_measurement(MeasuredThroughput(path=str(a), accelerator="h100-sxm"), "measured.0")
    assert (m.tool, m.goodput_rps(SLO)) == ("aiperf", 4.2)
    f = tmp_path / "loadgen.json"
    f.write_text(json.dumps({"requests": 200, "ttft_s": {"p50": 0.1, "p90": 0.4, "p99": 0.9},
                             "tpot_s": {"p50": 0.02, "p90": 0.06, "p99": 0.08}}))
    with pytest.raises(SpecError, match=r"measured\.1\.rate_rps: .* set rate_rps"):
        load_measurement(MeasuredThroughput(path=str(f), accelerator="h100-sxm"), "measured.1")
    m = load_measurement(MeasuredThroughput(path=str(f), accelerator="h100-sxm", rate_rps=3.0), "measured.1")
    assert m.goodput_rps(SLO) == 0.0  # TPOT p90 60 ms > 50 ms
    assert m.goodput_rps(SLO, role="prefill") == 3.0  # a prefill replica is judged on TTFT only


def test_plan_sizes_from_the_measurement_and_says_so(tmp_path, spec_factory) -> None:
    path = _guidellm(tmp_path)
    spec = spec_factory(measured=[{"path": str(path), "accelerator": "h100-sxm", "tp": 1}])
    doc = to_json(plan(spec, PlanOptions(workers=1)))
    best = doc["plans"][0]
    assert [(p["tp"], p["replicas"], p["serving_replicas"]) for p in best["pools"]] == [(1, 3, 2)]
    assert best["headroom"]["mixed"]["goodput_per_replica_rps"] == 0.15
    line = next(s for s in best["explanation"] if s.startswith("effective goodput"))
    assert line.startswith("effective goodput: one mixed replica of h100-sxm bf16 TP=1 PP=1 sustains 0.15 req/s "
                           f"within the SLO, measured, not simulated: guidellm result {path} (0.10 req/s: TTFT p90 ")
    assert "the highest rate meeting the SLO is 0.15 req/s" in line
