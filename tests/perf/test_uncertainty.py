"""Uncertainty bands: from the calibration's held-out residuals of the nearest measured shapes."""

from __future__ import annotations

import json

import pytest

from fleetwise.cli.main import main
from fleetwise.errors import SpecError
from fleetwise.perf.calibrate import calibrate, held_out_residuals
from fleetwise.perf.groundtruth import SHIPPED_DIR, SHIPPED_FILES, load_groundtruth
from fleetwise.perf.profile import Profile
from fleetwise.perf.roofline import PerfModel
from fleetwise.perf.types import BatchShape, Deployment
from fleetwise.perf.uncertainty import Residual, band, features, residuals_of
from fleetwise.spec.catalog import get_gpu

H200 = get_gpu("h200-sxm")


def test_band_spans_the_nearest_residuals_quotients():
    decode = BatchShape.decode(16, 2048)
    lt, lc, share = features(decode)
    near = [Residual(lt, lc, share, 0.10), Residual(lt + 0.1, lc, share, -0.05)]
    far = [Residual(lt, lc, 1.0, 0.90)]  # a prefill: never a decode's neighbour while nearer ones exist
    b = band(1.0, decode, near + far, k=2)
    assert (b.low_s, b.mid_s, b.high_s, b.points) == (pytest.approx(1 / 1.10), 1.0, pytest.approx(1 / 0.95), 2)
    assert b.contains(1.02) and not b.contains(1.2)
    assert band(1.0, decode, []).points == 0 and band(1.0, decode, []).low_s == 1.0


def test_profile_rows_round_trip_and_bad_rows_are_one_line(tmp_path):
    r = Residual(3.0, 11.0, 0.0, -0.02)
    assert residuals_of([r.as_list()]) == [r]
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**Profile().model_dump(by_alias=True), "residuals": [[1.0, 2.0]]}))
    with pytest.raises(SpecError, match=r"residuals\[0\] has 2 numbers, expected 4"):
        Profile.load(path)


@pytest.fixture(scope="module")
def calibrated() -> PerfModel:
    files = [load_groundtruth(SHIPPED_DIR / f) for f in SHIPPED_FILES]
    prof = calibrate(files, H200).model_copy(update={"residuals": held_out_residuals(files, H200)})
    return PerfModel(prof)


def test_bands_of_the_shipped_calibration(calibrated):
    """88 residuals (every shipped point, held out by shape). The MoE mixed steps, the worst held-out
    points, get a wide band that holds their measurement; decode bands stay narrow (llama 32 x 2048:
    9.37-9.52 ms, the measured 9.522 ms 0.06% above its top: the robust fit prices that step 1.2% low)."""
    files = [load_groundtruth(SHIPPED_DIR / f) for f in SHIPPED_FILES]
    assert len(calibrated.profile.residuals) == 88
    qwen = files[2].models["qwen3-30b-a3b"]
    mixed = BatchShape.decode(64, 2048) + BatchShape.prefill(1, 1024)
    b = calibrated.step_time_band(mixed, Deployment(qwen, H200))
    assert b.points == 5 and b.contains(64.05e-3)  # the measured step (h200_mixed.json)
    llama = files[0].models["llama-3.1-8b"]
    d = calibrated.step_time_band(BatchShape.decode(32, 2048), Deployment(llama, H200))
    assert (d.high_s - d.low_s) / d.mid_s < 0.15
    assert (round(d.low_s * 1e3, 3), round(d.high_s * 1e3, 3)) == (9.365, 9.516)


def test_cli_calibrate_stores_residuals_unless_told_not_to(tmp_path, capsys):
    files = [str(SHIPPED_DIR / "h200_dense.json")]
    out = tmp_path / "p.json"
    assert main(["calibrate", *files, "-o", str(out), "--no-band"]) == 0
    assert Profile.load(out).residuals == []
    capsys.readouterr()


def test_threshold_note_says_when_a_decision_could_flip():
    from fleetwise.perf.uncertainty import Band, threshold_note

    b = Band(0.040, 0.045, 0.052, 5)
    assert threshold_note("a decode step", b, 0.050, "TPOT budget") == (
        "a decode step 40.0-52.0 ms straddles the TPOT budget (50 ms): this decision could flip")
    assert threshold_note("a decode step", b, 0.060, "TPOT budget") == (
        "a decode step 40.0-52.0 ms, all under the TPOT budget (60 ms)")
    assert threshold_note("a decode step", b, 0.030, "TPOT budget").endswith("all over the TPOT budget (30 ms)")


@pytest.mark.slow
def test_plan_shows_its_decisions_at_the_band_ends(tmp_path):
    """A profile whose held-out errors span -25% to +30% on every shape: the cheapest plan (one TP=1
    replica) meets the targets as predicted but misses TPOT at the band's slow end, where TP=2 becomes
    the cheapest colocated layout; colocating holds at both ends. In the JSON and as one explanation line."""
    import itertools

    from fleetwise.planner.api import plan
    from fleetwise.planner.report import to_json
    from fleetwise.planner.state import PlanOptions
    from fleetwise.spec.planning import planning_spec_from_dict

    rows = [[lt, lc, share, e] for lt, lc, share in itertools.product(range(16), range(0, 16, 2), (0.0, 1.0))
            for e in (0.3, -0.25)]
    path = tmp_path / "wide.json"
    Profile(accelerator="h200-sxm").model_copy(update={"residuals": rows}).save(path)
    spec = {
        "name": "flips", "model": "llama-3.1-8b", "profile": str(path),
        "accelerators": [{"name": "h200-sxm", "price_per_hour_usd": 3.0}],
        "workload": {"rate_rps": 2.0, "prompt_tokens": {"kind": "fixed", "tokens": 1024},
                     "output_tokens": {"kind": "fixed", "tokens": 64}},
        "slo": {"ttft_s": 1.0, "tpot_s": 0.02, "percentile": 90, "attainment": 0.9},
        "weight_dtypes": ["bf16"],
        "headroom": {"failures_to_survive": 0, "upgrade_batch_replicas": 0, "burst_factor": 1.0},
        "search": {"max_gpus": 8, "top_k": 1, "refine_top": 2, "seeds": 1, "sample_requests": 100,
                   "disaggregation": "on", "bisect_steps": 3},
    }
    top = to_json(plan(planning_spec_from_dict(spec), PlanOptions(workers=1)))["plans"][0]
    assert [(p["role"], p["tp"]) for p in top["pools"]] == [("mixed", 1)]
    got = {f["decision"]: (f["chosen"], f["at_fast_end"], f["at_slow_end"], f["flips"]) for f in top["decision_flips"]}
    assert got == {
        "fit": ("meets the latency targets", "meets the latency targets",
                "misses TPOT on h200-sxm bf16 TP=1 PP=1", True),
        "TP": ("TP=1", "TP=1", "TP=2", True),
        "disaggregate": ("colocate", "colocate", "colocate", False),
    }
    line = next(s for s in top["explanation"] if s.startswith("decisions across the step-time band"))
    assert "TP: TP=1, but TP=1 at the band's fast end and TP=2 at its slow end: this decision could flip" in line
    assert "disaggregate: colocate at both ends of the band" in line
