"""Infeasible questions come back with an explanation, never an empty answer."""

from __future__ import annotations

import pytest

from fleetwise.errors import InfeasibleError
from fleetwise.planner.api import plan, plan_or_raise
from fleetwise.planner.report import to_json


def test_no_hardware_holds_the_model(spec_factory):
    spec = spec_factory(model="moe-2.8t-a104b", accelerators=[{"name": "l40s"}], weight_dtypes=["bf16", "fp8"])
    doc = to_json(plan(spec))
    assert doc["plans"] == []
    assert doc["infeasible"].startswith("no allowed hardware holds moe-2.8t-a104b")
    assert "raise search.max_gpus" in doc["infeasible"]
    assert any("does not fit" in r["reason"] for r in doc["rejected"])


def test_tpot_below_the_physical_minimum(spec_factory):
    spec = spec_factory(slo={"tpot_s": 0.001})
    doc = to_json(plan(spec))
    assert doc["plans"] == []
    assert "TPOT target 1.0 ms is below the physical minimum" in doc["infeasible"]
    assert "per decode step at batch 1" in doc["infeasible"]
    assert all("one replica cannot meet the SLO at any load" in r["reason"] for r in doc["rejected"])


def test_ttft_below_the_physical_minimum_names_what_would_help(spec_factory):
    spec = spec_factory(slo={"ttft_s": 0.001})
    with pytest.raises(InfeasibleError, match="TTFT target 1.0 ms is below the physical minimum"):
        plan_or_raise(spec)
    doc = to_json(plan(spec))
    assert any("a shorter context" in r["reason"] for r in doc["rejected"])


def test_a_plan_over_the_gpu_limit_names_the_count_that_lifts_it(spec_factory):
    # One TP1 replica carries 0.2 req/s, but two failure spares make 3 GPUs > max_gpus 2 (TP2: 6):
    # the answer names the smallest fleet and the limit that would admit it, not a generic hint.
    spec = spec_factory(headroom={"failures_to_survive": 2}, search={"max_gpus": 2})
    doc = to_json(plan(spec))
    assert doc["plans"] == []
    assert doc["infeasible"] == (
        "no plan meets the SLO within the GPU limits: the smallest fleet sized from the simulated goodputs, "
        "colocated h100-sxm bf16 TP=1 PP=1, needs 3 GPUs with its headroom (3 h100-sxm); raise search.max_gpus "
        "from 2 to 3 to plan it (it is then checked in simulation), or relax the SLO")
    assert {"candidate": "colocated h100-sxm bf16 TP=1 PP=1",
            "reason": "needs 3 GPUs with headroom > search.max_gpus=2"} in doc["rejected"]


def test_a_card_cap_below_the_search_limit_is_the_one_named(spec_factory):
    spec = spec_factory(accelerators=[{"name": "h100-sxm", "price_per_hour_usd": 3.0, "max_gpus": 2}],
                        headroom={"failures_to_survive": 2})
    doc = to_json(plan(spec))
    assert doc["infeasible"].endswith(
        "needs 3 GPUs with its headroom (3 h100-sxm); raise accelerators[h100-sxm].max_gpus from 2 to 3 to plan it "
        "(it is then checked in simulation), or relax the SLO")
