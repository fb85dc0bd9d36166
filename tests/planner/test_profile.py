"""A calibrated profile reaches the planner: the estimate and the simulator price steps with it."""

from __future__ import annotations

from pathlib import Path

from fleetwise.perf.profile import Profile
from fleetwise.perf.roofline import PerfModel
from fleetwise.perf.types import BatchShape
from fleetwise.planner.api import plan
from fleetwise.planner.report import to_json
from fleetwise.planner.state import PlanOptions


def _slow_profile(tmp_path: Path) -> Path:
    prof = Profile(accelerator="h100-sxm", engine="test-engine").with_factors(gemm_mem_eff=0.35, kv_mem_eff=0.5)
    path = tmp_path / "slow.json"
    prof.save(path)
    return path


def test_plan_priced_with_a_custom_profile_differs_from_default(tmp_path, small_search, spec_factory):
    path = _slow_profile(tmp_path)
    custom = plan(spec_factory(profile=str(path)), PlanOptions(workers=1))
    doc, base = to_json(custom), to_json(small_search)
    steps = doc["plans"][0]["explanation"]
    assert steps[0] == (f"priced by: perf profile {path} (accelerator h100-sxm, engine test-engine), in the "
                        "estimate and in every simulation")
    (lay, est), = [(k, v) for k, v in custom.estimates.items() if k.tp == 1]
    dep = custom.hw.deployment(lay, "bf16")
    ctx = int(custom.stats.prompt_mean + custom.stats.output_mean / 2)
    slow = PerfModel(Profile.load(path)).bind(dep).step_time_s(BatchShape.decode(1, ctx))
    default = PerfModel().bind(dep).step_time_s(BatchShape.decode(1, ctx))
    assert est.tpot_floor_s == slow
    assert small_search.estimates[lay].tpot_floor_s == default
    assert slow > 1.5 * default
    # The simulator priced the same steps: decode TPOT moves with the profile too.
    tpot = doc["plans"][0]["predicted"]["tpot_p50_s"]
    assert tpot > 1.5 * base["plans"][0]["predicted"]["tpot_p50_s"]


def test_bad_profile_path_is_one_line(tmp_path, capsys):
    from fleetwise.cli.main import main

    rc = main(["plan", "--profile", str(tmp_path / "missing.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "missing.json" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1

