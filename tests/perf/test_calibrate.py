"""Calibration against the shipped H200 ground truth: in-sample and leave-one-model-out accuracy,
ground-truth loading, and the calibrate/predict CLI (bad files: one line, exit 2)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fleetwise.cli.main import main
from fleetwise.errors import SpecError
from fleetwise.perf.calibrate import (
    FIT_FACTORS,
    HELD_OUT_TARGET_PCT,
    calibrate,
    cross_validate,
    cross_validate_shapes,
    extrapolate_shapes,
    faster_than_the_card,
    fit_bounds,
    fit_warnings,
    grouped_tile_k_from_block,
    predict,
    shape_folds,
    shape_key,
    summarize,
)
from fleetwise.perf.groundtruth import (
    MOE_BLOCK_CEILING,
    MOE_BLOCK_SHAPE,
    SHIPPED_DIR,
    SHIPPED_FILES,
    load_groundtruth,
)
from fleetwise.perf.profile import (
    FACTOR_BOUNDS,
    PUBLIC_MOE_BLOCK_GPU,
    PUBLIC_MOE_BLOCK_MS,
    PUBLIC_MOE_BLOCK_SHAPE,
    Profile,
)
from fleetwise.spec.catalog import get_gpu

SHARED = SHIPPED_DIR
FILES = list(SHIPPED_FILES)
H200 = get_gpu("h200-sxm")


@pytest.fixture(scope="module")
def files():
    return [load_groundtruth(SHARED / f) for f in FILES]


@pytest.fixture(scope="module")
def profile(files):
    return calibrate(files, H200, base=Profile(accelerator="h200-sxm", engine="test"))


def test_loader_reads_every_point_and_config(files):
    dense, moe, mixed = files
    assert len(dense.points) == 30 and len(moe.points) == 30 and len(mixed.points) == 28
    q = moe.models["qwen3-30b-a3b"]
    assert q.moe is not None and q.moe.num_experts == 128 and q.moe.experts_per_token == 8
    assert q.kv_bytes_per_token("bf16") == 98304  # the file's kv_bytes_per_token
    assert dense.models["llama-3.1-8b"].kv_bytes_per_token("bf16") == 131072
    assert {p.kind for p in mixed.points} == {"mixed"}
    assert dense.ceilings["bf16_gemm_8192_TFLOPs"] > 700


def test_in_sample_accuracy(files, profile):
    s = summarize(predict(profile, files, H200))
    assert s["points"] == 88
    assert (s["median_abs_pct"], s["max_abs_pct"]) == (1.4, 11.19)
    for kind in ("prefill", "decode", "mixed"):
        assert s["by_kind"][kind]["median_abs_pct"] <= 5.0


def test_factors_are_physical_and_within_bounds(files, profile):
    bounds = fit_bounds(files, H200)
    for name, value in profile.factors().items():
        lo, hi = bounds[name]
        assert lo * 0.999 <= value <= hi * 1.001, name
    # no GEMM beats the 8192^3 GEMM the card ran in the same session
    assert profile.gemm_compute_eff <= max(f.ceilings["bf16_gemm_8192_TFLOPs"] for f in files) * 1e12 / 989e12 + 1e-9
    assert profile.accelerator == "h200-sxm" and profile.fit["points"] == 88


def test_leave_one_model_out(files):
    cv = cross_validate(files, H200)
    assert set(cv) == {"llama-3.1-8b", "qwen3-30b-a3b"}
    # the target holds both ways. The held-out model's points never reach the fit (calibrate(models=rest));
    # with only dense points `grouped_tile_k` is solved from the public MoE-block timing under the dense
    # fit's own factors (see the next test), the other MoE-only factors stay at their defaults.
    med, worst = HELD_OUT_TARGET_PCT
    for held in cv:
        assert cv[held]["median_abs_pct"] <= med and cv[held]["max_abs_pct"] <= worst, held
    assert cv["qwen3-30b-a3b"]["points"] == 30 + 14 and cv["llama-3.1-8b"]["points"] == 30 + 14
    assert {held: (s["median_abs_pct"], s["max_abs_pct"]) for held, s in cv.items()} == {
        "llama-3.1-8b": (3.08, 13.89), "qwen3-30b-a3b": (4.19, 16.79)}


def test_dense_only_fit_solves_the_grouped_kernel_from_the_public_block(files):
    """Without MoE points (and no `moe_block_ms` ceiling) the grouped kernel's constant is the one at which
    the fitted model prices the public H100 MoE block (512 experts top-10, hidden 2048, FFN 512, 32,768
    tokens) at its measured 11.41 ms: 1,488 under the dense fit's factors, where the same timing under the
    default factors gives the uncalibrated default (1,225). With the all-points fit's constant (1,982)
    kept instead, the MoE from dense meets the worst-point target and misses the median one by 0.7 points
    (5.71%): the solved constant is not worse than the engine's own."""
    dense = calibrate(files, H200, models={"llama-3.1-8b"})
    h100 = get_gpu(PUBLIC_MOE_BLOCK_GPU)
    assert dense.grouped_tile_k == pytest.approx(
        grouped_tile_k_from_block(dense, PUBLIC_MOE_BLOCK_SHAPE, PUBLIC_MOE_BLOCK_MS, h100), rel=1e-9)
    assert block_ms(dense, PUBLIC_MOE_BLOCK_SHAPE, h100) == pytest.approx(PUBLIC_MOE_BLOCK_MS, rel=1e-6)
    assert block_ms(Profile(), PUBLIC_MOE_BLOCK_SHAPE, h100) == pytest.approx(PUBLIC_MOE_BLOCK_MS, rel=0.01)
    assert 1400 < dense.grouped_tile_k < 1600  # measured: 1,488
    engine = calibrate(files, H200).grouped_tile_k
    kept = calibrate(files, H200, base=Profile().with_factors(grouped_tile_k=engine), models={"llama-3.1-8b"},
                     factors=[f for f in FIT_FACTORS if f != "grouped_tile_k"])
    assert kept.grouped_tile_k == pytest.approx(engine)
    med, worst = HELD_OUT_TARGET_PCT
    solved, at_engine = (summarize(predict(prof, files, H200, {"qwen3-30b-a3b"})) for prof in (dense, kept))
    assert (solved["median_abs_pct"], solved["max_abs_pct"]) == (4.19, 16.79)
    assert solved["median_abs_pct"] <= med and solved["max_abs_pct"] <= worst
    assert (at_engine["median_abs_pct"], at_engine["max_abs_pct"]) == (5.71, 12.74)


def test_dense_calibration_takes_the_grouped_kernel_from_the_moe_block_ceiling(files):
    """A dense-only file that carries the run's MoE-block time (`moe_block_ms`) gives `grouped_tile_k` by
    inverting the routed-expert cost at the reference shape under the dense fit's own factors, ahead of
    the public block; a block faster than any tile work explains gives the factor's lower bound."""
    engine = calibrate(files, H200)
    ms = block_ms(engine, MOE_BLOCK_SHAPE, H200)  # a stand-in for the measurement the shipped files lack
    stamped = [replace(f, ceilings={**f.ceilings, MOE_BLOCK_CEILING: ms}) for f in files]
    dense = calibrate(stamped, H200, models={"llama-3.1-8b"})
    public = calibrate(files, H200, models={"llama-3.1-8b"})
    assert block_ms(dense, MOE_BLOCK_SHAPE, H200) == pytest.approx(ms, rel=1e-6)
    assert dense.grouped_tile_k == pytest.approx(grouped_tile_k_from_block(dense, MOE_BLOCK_SHAPE, ms, H200), rel=1e-9)
    assert abs(dense.grouped_tile_k - public.grouped_tile_k) > 100  # the ceiling, not the public block, decided
    low = grouped_tile_k_from_block(public, MOE_BLOCK_SHAPE, 1e-6, H200)
    assert low == pytest.approx(FACTOR_BOUNDS["grouped_tile_k"][0])


def block_ms(profile: Profile, shape: dict[str, int], gpu) -> float:
    """Milliseconds `profile` prices one MoE block of `shape` at on `gpu` (routed experts, one layer)."""
    from fleetwise.perf.roofline import PerfModel
    from fleetwise.perf.types import Deployment
    from fleetwise.spec.model import ModelSpec, MoESpec

    block = ModelSpec(name="b", num_layers=1, hidden_size=shape["hidden"], num_attention_heads=16, num_kv_heads=4,
                      head_dim=128, ffn_size=0, vocab_size=1000,
                      moe=MoESpec(num_experts=shape["experts"], experts_per_token=shape["topk"],
                                  expert_ffn_size=shape["moe_ffn"]))
    return PerfModel(profile).bind(Deployment(block, gpu)).routed_experts_s(shape["tokens"]) * 1e3


def test_fit_never_sees_the_held_out_model(files):
    """Leave-one-model-out honesty: a fit on llama alone is identical whether or not the MoE
    model's points are in the files, and leaves the MoE-only factors it cannot solve at their defaults."""
    dense_only = [replace(f, models={n: m for n, m in f.models.items() if m.moe is None},
                          points=[p for p in f.points if p.model == "llama-3.1-8b"]) for f in (files[0], files[2])]
    alone = calibrate(dense_only, H200)
    beside = calibrate(files, H200, models={"llama-3.1-8b"})
    assert alone.factors() == beside.factors()
    for name in ("expert_group_s", "moe_kernel_weight"):
        assert alone.factors()[name] == pytest.approx(getattr(Profile(), name), rel=1e-6), name


def test_leave_shapes_out(files):
    """K-fold over the 44 distinct step shapes: every point once, predicted by a fit that saw its
    shape on no model; the target holds on shapes not fitted."""
    folds = shape_folds(files)
    keys = {shape_key(p) for f in files for p in f.points}
    assert len(keys) == 11 + 19 + 14 and [len(g) for g in folds] == [9, 9, 9, 9, 8]
    assert set().union(*folds) == keys and sum(len(g) for g in folds) == len(keys)  # disjoint, complete
    for g in folds:  # every fold holds out some of each kind
        assert {k[0] for k in g} == {"prefill", "decode", "mixed"}
    preds = cross_validate_shapes(files, H200)
    assert sorted(shape_key(p.point) + (p.point.model,) for p in preds) == sorted(
        shape_key(p) + (p.model,) for f in files for p in f.points)
    s = summarize(preds)
    assert (s["median_abs_pct"], s["max_abs_pct"]) == (1.44, 11.48)
    assert {k: (v["median_abs_pct"], v["max_abs_pct"]) for k, v in s["by_kind"].items()} == {
        "prefill": (3.28, 9.82), "decode": (1.15, 10.43), "mixed": (2.04, 11.48)}
    for kind in ("prefill", "decode", "mixed"):
        assert s["by_kind"][kind]["median_abs_pct"] <= 5.0 and s["by_kind"][kind]["max_abs_pct"] <= 20.0, kind


def test_extrapolation_to_larger_shapes(files):
    """Fit on the smaller half of each shape axis, predict the larger half: the worst point stays
    within 20% on every axis; the medians of prefill tokens (5.85%) and decode batch (5.82%) miss
    5% (docs/perf-model.md says why), the pooled median meets it."""
    ext = extrapolate_shapes(files, H200)
    counts = {name: len(ps) for name, ps in ext.items()}
    assert counts == {"prefill tokens": 14, "decode batch": 10, "decode context": 12, "mixed chunk": 12,
                      "mixed batch": 14, "all axes": 56}
    # the larger half only: e.g. decode batch holds out 64, 128 and 256 sequences
    assert {p.point.batch for p in ext["decode batch"]} == {64, 128, 256}
    assert {p.point.chunk for p in ext["mixed chunk"]} == {2048, 4096, 8192}
    assert {name: (summarize(ps)["median_abs_pct"], summarize(ps)["max_abs_pct"]) for name, ps in ext.items()} == {
        "prefill tokens": (5.85, 12.09), "decode batch": (5.82, 13.31), "decode context": (1.5, 5.18),
        "mixed chunk": (2.84, 8.93), "mixed batch": (2.82, 13.5), "all axes": (3.3, 17.14)}
    for name, ps in ext.items():
        assert summarize(ps)["max_abs_pct"] <= 20.0, name
    pooled = summarize([p for name, ps in ext.items() if name != "all axes" for p in ps])
    assert pooled["median_abs_pct"] <= 5.0  # measured: about 4


@pytest.mark.parametrize("doc", [{"schema": "fleetwise-profile/1", "moe_row_passes": 30.0},
                                 {"schema": "fleetwise-profile/3", "elementwise_passes": 24.0}])
def test_old_profile_schema_asks_for_recalibration(tmp_path, doc):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=rf"{doc['schema']}.*recalibrate it with `fleetwise calibrate"):
        Profile.load(path)


def test_bounds_cover_every_factor():
    assert set(Profile().factors()) == set(FACTOR_BOUNDS)
    for name, (lo, hi) in FACTOR_BOUNDS.items():
        assert lo < getattr(Profile(), name) < hi, name


@pytest.mark.parametrize("doc,match", [
    ({"schema": "other"}, "not a ground-truth file"),
    ({"schema": "fleetwise-groundtruth/1", "models": {}}, "non-empty mapping"),
    ({"schema": "fleetwise-groundtruth/1", "models": {"m": {"config": {"layers": 2}}}}, "missing hidden"),
    ({"schema": "fleetwise-groundtruth/1", "models": {"m": {
        "config": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128, "vocab": 100},
        "decode": [{"batch": 1, "ms": 1.0}]}}}, r"decode\[0\]: a decode point needs batch, ctx, ms"),
], ids=["schema", "no-models", "config", "point"])
def test_bad_ground_truth_names_the_problem(tmp_path, doc, match):
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=match):
        load_groundtruth(path)


def test_cli_bad_file_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["calibrate", str(bad), "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not valid JSON" in err[0]
    assert main(["predict", "--profile", str(bad), "--against", str(bad)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_cli_calibrate_then_predict_json(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert main(["calibrate", *[str(SHARED / f) for f in FILES], "-o", str(out)]) == 0
    capsys.readouterr()
    assert Profile.load(out).accelerator == "h200-sxm"
    assert main(["predict", "--profile", str(out), "--against", str(SHARED / "h200_mixed.json"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["points"]) == 28
    first = doc["points"][0]
    assert set(first) >= {"model", "kind", "batch", "ctx", "chunk", "measured_ms", "predicted_ms"}
    assert doc["summary"]["by_kind"]["mixed"]["points"] == 28
    assert main(["predict", "--profile", str(out), "--against", str(SHARED / "h200_dense.json")]) == 0
    assert "median |err|" in capsys.readouterr().out


GOOD_CONFIG = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128, "vocab": 100}


def _write_point(tmp_path, config, kind, point):
    """A ground-truth file of model `m` (GOOD_CONFIG overridden by `config`) holding one point."""
    doc = {"schema": "fleetwise-groundtruth/1",
           "models": {"m": {"config": {**GOOD_CONFIG, **config}, kind: [point]}}}
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("config,kind,point,match", [
    ({}, "decode", {"batch": 1, "ctx": 64, "ms": 1e308}, r"decode\[0\]\.ms: expected a step time .* got 1e\+308"),
    ({}, "decode", {"batch": 1, "ctx": 64, "ms": True}, r"decode\[0\]\.ms: .* got True"),
    ({}, "prefill", {"batch": 1, "seq": 64, "ms": -2.0}, r"prefill\[0\]\.ms: .* got -2\.0"),
    ({"hidden": 64.5}, "prefill", {"batch": 1, "seq": 64, "ms": 1.0}, r"config\.hidden: expected a whole number >= 1, got 64\.5"),
    ({}, "decode", {"batch": 0, "ctx": 64, "ms": 1.0}, r"decode\[0\]\.batch: expected a whole number >= 1, got 0"),
    ({}, "prefill", {"batch": 1, "seq": -512, "ms": 1.0}, r"prefill\[0\]\.seq: expected a whole number >= 1, got -512"),
    ({}, "mixed", {"batch": 4, "ctx": 64, "chunk": -1, "ms": 1.0}, r"mixed\[0\]\.chunk: expected a whole number >= 0, got -1"),
    ({}, "decode", {"batch": True, "ctx": 64, "ms": 1.0}, r"decode\[0\]\.batch: .* got True"),
], ids=["huge-ms", "bool-ms", "negative-ms", "fractional-hidden", "batch-0", "negative-seq", "negative-chunk", "bool-batch"])
def test_ground_truth_values_are_validated(tmp_path, capsys, config, kind, point, match):
    """Each bad value is one line naming the file, the model, the point and the field, in calibrate and predict."""
    path = _write_point(tmp_path, config, kind, point)
    with pytest.raises(SpecError, match=match):
        load_groundtruth(path)
    assert main(["calibrate", str(path), "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "models.m" in err[0] and str(path) in err[0]
    prof = tmp_path / "profile.json"
    Profile(accelerator="h200-sxm").save(prof)
    assert main(["predict", "--profile", str(prof), "--against", str(path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("config,match", [
    ({"kv_heads": 3}, r"models\.m\.config: num_attention_heads=4 is not a multiple of num_kv_heads=3; GQA groups"),
    ({"ffn": 0}, r"models\.m\.config: ffn_size=0 is only valid for MoE models; set ffn_size"),
    ({"ffn": 0, "experts": 4, "topk": 8, "moe_ffn": 32},
     r"models\.m\.config: experts_per_token=8 exceeds num_experts=4; top-k must be at most"),
], ids=["gqa-ratio", "dense-no-ffn", "topk-over-experts"])
def test_config_shape_rules_name_rule_and_value(tmp_path, capsys, config, match):
    """A config that breaks a model-shape rule is one line naming the file, the model, the rule and its
    values (was: pydantic's header `1 validation error for ModelSpec`, or `arguments: ...` without the file)."""
    path = _write_point(tmp_path, config, "decode", {"batch": 1, "ctx": 64, "ms": 1.0})
    with pytest.raises(SpecError, match=match):
        load_groundtruth(path)
    assert main(["calibrate", str(path), "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0]


def test_bad_ceiling_is_refused(tmp_path):
    doc = {"schema": "fleetwise-groundtruth/1", "ceilings": {"bf16_gemm_8192_TFLOPs": True},
           "models": {"m": {"config": GOOD_CONFIG, "decode": [{"batch": 1, "ctx": 64, "ms": 1.0}]}}}
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=r"ceilings\.bf16_gemm_8192_TFLOPs: expected a positive number, got True"):
        load_groundtruth(path)


def test_cli_calibrate_warns_what_a_small_fit_cannot_tell(tmp_path, capsys):
    """One decode point fits without error, but stderr says the fit is underdetermined and names the
    step kinds it never saw; the shipped files (every kind, 88 points) give no warning."""
    doc = {"schema": "fleetwise-groundtruth/1",
           "models": {"m": {"config": GOOD_CONFIG, "decode": [{"batch": 1, "ctx": 64, "ms": 1.0}]}}}
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(doc))
    assert main(["calibrate", str(path), "--gpu", "h200-sxm", "-o", str(tmp_path / "p.json"), "--no-band"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"warning: 1 measured points for {len(FIT_FACTORS)} fitted factors: the fit's own error says "
                   "nothing about its accuracy; measure more shapes (`fleetwise measure` takes a grid) and "
                   "read the held-out residuals",
                   "warning: no prefill, mixed points: those steps are priced from the other kinds' factors "
                   "and the prior; measure them to check"]
    files = [load_groundtruth(SHARED / f) for f in FILES]
    assert fit_warnings(files) == []


def test_points_faster_than_the_card_are_named(tmp_path, capsys):
    """The H200 files fitted as an A100 (the wrong --gpu): 61 of 88 points are faster than any profile
    within the factor bounds prices them there, one warning line names the first; as an H200, none. Before,
    the fit ran silently to its bounds."""
    files = [load_groundtruth(SHARED / f) for f in FILES]
    assert faster_than_the_card(files, H200) == []
    line = ("61 of 88 points measured faster than a100-80g allows at the fastest factor bounds (first: "
            "llama-3.1-8b prefill batch=1 seq=512: 21.73 ms < 26.86 ms); no fit reaches them: check --gpu "
            "and the model's config")
    assert faster_than_the_card(files, get_gpu("a100-80g")) == [line]
    one = _write_point(tmp_path, {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "head_dim": 128,
                                  "ffn": 28672, "vocab": 128256}, "decode", {"batch": 1, "ctx": 512, "ms": 7.0})
    assert main(["calibrate", str(one), "--gpu", "h200-sxm", "-o", str(tmp_path / "p.json"), "--no-band"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("warning: 1 of 1 points measured faster than h200-sxm allows at the fastest factor "
                              "bounds (first: m decode batch=1 ctx=512: 7 ms < ")
