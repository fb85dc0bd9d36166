"""The fleet document: one schema `simulate`, `emulate --plan`, `gateway --plan`, `up` and `deploy`
read, written by `plan` (`--fleet-out`, or the `fleet` section of `--json`); an older or invalid
document is one error naming the field."""

from __future__ import annotations

import json

import pytest

from fleetwise.errors import SpecError
from fleetwise.spec.plan import FLEET_SCHEMA, PLAN_SEARCH_SCHEMA, PlanSpec

PLAN = {
    "name": "pd", "routing": "fleetwise-default",
    "pools": [
        {"name": "prefill", "role": "prefill", "replicas": 2, "accelerator": "h200-sxm", "model": "llama-3.1-8b",
         "spare_replicas": 1},
        {"name": "decode", "role": "decode", "replicas": 3, "accelerator": "h200-sxm", "model": "llama-3.1-8b",
         "parallelism": {"tp": 2}, "spare_replicas": 1},
    ],
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05, "percentile": 90},
}


def _write(tmp_path, doc, name="doc.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_fleet_document_round_trips(tmp_path):
    plan = PlanSpec.load(_write(tmp_path, PLAN))
    doc = plan.document()
    assert next(iter(doc)) == "schema" and doc["schema"] == FLEET_SCHEMA
    again = PlanSpec.load(_write(tmp_path, doc, "fleet.json"))
    assert again == plan
    assert [p.spare_replicas for p in again.pools] == [1, 1] and again.slo is not None and again.slo.tpot_s == 0.05


def test_plan_search_is_read_through_its_fleet_section(tmp_path):
    plan = PlanSpec.load(_write(tmp_path, PLAN))
    search = {"schema": PLAN_SEARCH_SCHEMA, "plans": [], "fleet": plan.document()}
    assert PlanSpec.load(_write(tmp_path, search)) == plan


def test_older_plan_search_names_the_missing_fleet(tmp_path):
    old = {"schema": PLAN_SEARCH_SCHEMA, "plans": [{"rank": 1, "pools": []}]}
    with pytest.raises(SpecError, match=r"doc.json: fleet: missing: .*older fleetwise.*rerun `fleetwise plan"):
        PlanSpec.load(_write(tmp_path, old))
    with pytest.raises(SpecError, match=r"fleet: null: .*no feasible fleet"):
        PlanSpec.load(_write(tmp_path, {**old, "fleet": None}))


def test_invalid_field_in_fleet_section_is_named_with_its_path(tmp_path):
    bad = json.loads(json.dumps(PLAN))
    bad["pools"][1]["replicas"] = "3"
    with pytest.raises(SpecError, match=r"doc.json: fleet: pools.1.replicas: .*write a number, without quotes"):
        PlanSpec.load(_write(tmp_path, {"schema": PLAN_SEARCH_SCHEMA, "fleet": {"schema": FLEET_SCHEMA, **bad}}))


def test_unknown_schema_is_named(tmp_path):
    with pytest.raises(SpecError, match=r"schema: 'fleetwise-fleet/0' is not a fleet document; expected "
                                        r"fleetwise-fleet/1"):
        PlanSpec.load(_write(tmp_path, {**PLAN, "schema": "fleetwise-fleet/0"}))


def test_spares_must_leave_a_replica_serving(tmp_path):
    bad = json.loads(json.dumps(PLAN))
    bad["pools"][0]["spare_replicas"] = 2
    with pytest.raises(SpecError, match=r"pools: prefill: spare_replicas must be below replicas"):
        PlanSpec.load(_write(tmp_path, bad))
