"""PlanningSpec validation and the exported JSON Schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetwise.errors import SpecError
from fleetwise.planner.defaults import default_spec
from fleetwise.spec.planning import (
    SCHEMA_PATH,
    load_planning_spec,
    planning_schema_text,
    planning_spec_from_dict,
)

ROOT = Path(__file__).resolve().parents[2]
BASE = {"model": "llama-3.1-8b", "accelerators": [{"name": "h100-sxm"}],
        "workload": {"rate_rps": 1, "preset": "sharegpt"}, "slo": {"ttft_s": 1, "tpot_s": 0.05}}


def test_schema_file_is_current():
    assert (ROOT / SCHEMA_PATH).read_text(encoding="utf-8") == planning_schema_text(), (
        "docs/schema/planning-spec.schema.json is stale: run `fleetwise plan --write-schema`")


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_validate(path):
    if "model" in path.read_text(encoding="utf-8") and "accelerators" in path.read_text(encoding="utf-8"):
        load_planning_spec(path)


def test_default_spec_is_valid():
    assert default_spec().model == "llama-3.1-70b"


BAD = [
    ({"accelerators": [{"name": "h100-sxm", "pric": 2}]}, "accelerators.0.pric: unknown field"),
    ({"workload": {"rate_rps": 1}}, "workload: lengths: give the request lengths"),
    ({"workload": {"rate_rps": 0, "preset": "sharegpt"}}, "workload.rate_rps: Input should be greater than 0"),
    ({"slo": {"ttft_s": 1, "tpot_s": 0.05, "percentile": 95}}, "slo.percentile"),
    ({"weight_dtypes": ["fp16"]}, "weight_dtypes.0"),
    ({"accelerators": [{"name": "h100-sxm"}, {"name": "h100-sxm"}]}, "lists a name twice"),
]


@pytest.mark.parametrize("over,msg", BAD, ids=[m for _, m in BAD])
def test_bad_fields_name_the_field(over, msg):
    with pytest.raises(SpecError, match=msg.replace(".", r"\.")):
        planning_spec_from_dict({**BASE, **over})
