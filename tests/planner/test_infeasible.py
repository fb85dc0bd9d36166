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
