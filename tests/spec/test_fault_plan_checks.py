"""Fault scenarios checked against the plan before a run: a rolling upgrade of one side of a P/D
plan that leaves the other side on the old version is warned about up front."""

from __future__ import annotations

from pathlib import Path

import yaml

from fleetwise.spec.base import validate
from fleetwise.spec.faults import FaultScenario, version_skew_warnings
from fleetwise.spec.plan import PlanSpec

ROOT = Path(__file__).resolve().parents[2]


def _plan() -> PlanSpec:
    return validate(PlanSpec, yaml.safe_load((ROOT / "examples/plans/pd-70b.yaml").read_text()), "pd-70b.yaml")


def _faults(*upgrades: dict) -> FaultScenario:
    return FaultScenario(faults=[{"kind": "rolling_upgrade", "start_s": 60, "new_model_version": "v2", **u}
                                 for u in upgrades])


def test_upgrading_one_side_alone_is_warned_naming_matched_with():
    got = version_skew_warnings(_faults({"pool": "prefill"}), _plan(), "f.yaml")
    assert got == [
        "f.yaml: faults.0 (rolling_upgrade): pool 'prefill' is the prefill side of P/D plan 'pd-70b' and no fault "
        "upgrades its decode pool 'decode' to v2: once the upgrade ends no decode replica accepts a prefill "
        "replica's KV, and every request fails for version skew (kv_version_skew); add matched_with: decode "
        "to upgrade both sides in matched slices"]


def test_both_sides_upgraded_to_the_same_version_are_not_warned():
    assert version_skew_warnings(_faults({"pool": "prefill", "matched_with": "decode"}), _plan()) == []
    assert version_skew_warnings(_faults({"pool": "decode"}, {"pool": "prefill"}), _plan()) == []
    colocated = PlanSpec(pools=[{"name": "m", "accelerator": "h100-sxm", "model": "llama-3.1-8b"}])
    assert version_skew_warnings(_faults({"pool": "m"}), colocated) == []


def test_upgrading_the_other_side_to_another_version_is_warned():
    got = version_skew_warnings(_faults({"pool": "prefill"}, {"pool": "decode", "new_model_version": "v3"}), _plan())
    assert len(got) == 2 and "no fault upgrades its decode pool 'decode' to v2" in got[0]
    assert "no fault upgrades its prefill pool 'prefill' to v3" in got[1]
