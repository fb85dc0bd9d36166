"""Fit a `Profile` to measured step times, predict measured points, and cross-validate.

Owns the fit (bounded robust least squares on log(predicted/measured), every factor shared by
every model), the per-point comparison and its summary (median and max absolute % error, overall and
per kind) and the held-out evaluations: leave-one-model-out, K-fold over step shapes and
extrapolation to the larger half of each shape axis. Does not read files (see `groundtruth`) or
print (see `fleetwise.cli.perf_cmd`).

Fit: the factors of `FIT_FACTORS` are optimised in log space within `FACTOR_BOUNDS`, minimising
    sum_points rho(log(pred/meas)) + sum_factors rho(PRIOR_WEIGHT * log(x/x_default)),
    rho(r) = 2 * s^2 * (sqrt(1 + (r/s)^2) - 1),  s = ROBUST_SCALE
(soft-L1: quadratic for errors below about s, linear above), with a weak pull toward the defaults
so factors the data cannot identify (MoE factors when only dense points are given) stay at
physical values instead of drifting to a bound. A plain sum of squares lets the few points a
one-factor-per-effect model cannot reach (long-context decodes, MoE mixed steps) pull every shared
factor toward them; the linear tail bounds that pull, so the median of the other points is fitted.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fleetwise.errors import SpecError
from fleetwise.perf.groundtruth import MOE_BLOCK_CEILING, MOE_BLOCK_SHAPE, GroundTruthFile, GroundTruthPoint
from fleetwise.perf.profile import (
    FACTOR_BOUNDS,
    PUBLIC_MOE_BLOCK_GPU,
    PUBLIC_MOE_BLOCK_MS,
    PUBLIC_MOE_BLOCK_SHAPE,
    Profile,
)
from fleetwise.perf.roofline import PerfModel
from fleetwise.perf.types import Deployment
from fleetwise.perf.uncertainty import residual
from fleetwise.spec.catalog import get_gpu
from fleetwise.spec.hardware import AcceleratorSpec
from fleetwise.spec.model import ModelSpec, MoESpec

HELD_OUT_TARGET_PCT = (5.0, 20.0)
"""Median and worst |error| % a fit must reach on the points it did not see (held out by model, both ways)."""
FIT_FACTORS: tuple[str, ...] = tuple(FACTOR_BOUNDS)
PRIOR_WEIGHT = 0.03
ROBUST_LOSS = "soft_l1"  # scipy.optimize.least_squares' smooth L1 on the residuals above
ROBUST_SCALE = HELD_OUT_TARGET_PCT[0] / 100.0
"""Log error (0.05: about 5%, the held-out median target) beyond which a point's pull on the fit grows
linearly, not quadratically: points missed by more than the target share cannot dominate the fit."""
KINDS = ("prefill", "decode", "mixed")
SHAPE_FOLDS = 5  # K of the K-fold over step shapes: about 9 of the 44 H200 grid shapes held out per fit
ShapeKey = tuple[str, int, int, int, int]

# Extrapolation axes: (kind, the shape quantity that grows). A split fits on every point whose
# quantity is in the smaller half of that kind's distinct values (the median value included) and
# on every point of the other kinds, and predicts the points in the larger half.
EXTRAPOLATION_AXES: dict[str, tuple[str, Callable[[GroundTruthPoint], int]]] = {
    "prefill tokens": ("prefill", lambda p: p.batch * p.seq),
    "decode batch": ("decode", lambda p: p.batch),
    "decode context": ("decode", lambda p: p.ctx),
    "mixed chunk": ("mixed", lambda p: p.chunk),
    "mixed batch": ("mixed", lambda p: p.batch),
}


@dataclass(frozen=True)
class Prediction:
    """One measured point next to the model's prediction."""

    point: GroundTruthPoint
    predicted_s: float

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_s / self.point.measured_s - 1.0)

    def as_dict(self) -> dict[str, Any]:
        d = self.point.as_dict()
        d.update(measured_ms=round(self.point.measured_s * 1e3, 4), predicted_ms=round(self.predicted_s * 1e3, 4),
                 error_pct=round(self.error_pct, 2))
        return d


def _cases(files: Sequence[GroundTruthFile], gpu: AcceleratorSpec,
           models: set[str] | None = None) -> list[tuple[GroundTruthPoint, Deployment]]:
    deps: dict[tuple[str, bool], Deployment] = {}
    out = []
    for f in files:
        for pt in f.points:
            if models is not None and pt.model not in models:
                continue
            key = (f"{f.path}:{pt.model}", pt.cuda_graphs)
            if key not in deps:
                deps[key] = Deployment(f.models[pt.model], gpu, cuda_graphs=pt.cuda_graphs)
            out.append((pt, deps[key]))
    return out


def predict(profile: Profile, files: Sequence[GroundTruthFile], gpu: AcceleratorSpec,
            models: set[str] | None = None) -> list[Prediction]:
    """Predict every point of `files` (optionally only the named models)."""
    pm = PerfModel(profile)
    return [Prediction(pt, pm.bind(dep).step_time_s(pt.shape())) for pt, dep in _cases(files, gpu, models)]


def summarize(preds: Sequence[Prediction]) -> dict[str, Any]:
    """Median and max absolute % error over all points and per kind."""
    def stats(ps: Sequence[Prediction]) -> dict[str, float]:
        errs = [abs(p.error_pct) for p in ps]
        return {"points": len(errs), "median_abs_pct": round(statistics.median(errs), 2),
                "max_abs_pct": round(max(errs), 2)}
    if not preds:
        return {"points": 0}
    out: dict[str, Any] = stats(preds)
    out["by_kind"] = {k: stats([p for p in preds if p.point.kind == k])
                      for k in KINDS if any(p.point.kind == k for p in preds)}
    return out


def _to_x(profile: Profile, names: Sequence[str]) -> list[float]:
    return [math.log(float(getattr(profile, n))) for n in names]


def fit_bounds(files: Sequence[GroundTruthFile], gpu: AcceleratorSpec) -> dict[str, tuple[float, float]]:
    """`FACTOR_BOUNDS`, with GEMM efficiency capped at the best GEMM the card ran in the same runs
    (the files' `bf16_gemm_8192_TFLOPs` ceiling): no model GEMM beats a large square one."""
    bounds = dict(FACTOR_BOUNDS)
    best = [f.ceilings["bf16_gemm_8192_TFLOPs"] * 1e12 / gpu.peak_flops("bf16")
            for f in files if f.ceilings.get("bf16_gemm_8192_TFLOPs", 0) > 0]
    if best:
        lo, hi = bounds["gemm_compute_eff"]
        bounds["gemm_compute_eff"] = (lo, max(lo * 1.01, min(hi, max(best))))
    return bounds


def calibrate(files: Sequence[GroundTruthFile], gpu: AcceleratorSpec, *, base: Profile | None = None,
              factors: Sequence[str] = FIT_FACTORS, models: set[str] | None = None) -> Profile:
    """Fit the shared factors to every point of `files` (or of the named models only)."""
    try:
        from scipy.optimize import least_squares
    except ImportError:  # pragma: no cover - scipy ships with the test extras
        raise SpecError("calibrate needs scipy: pip install scipy") from None
    base = base if base is not None else Profile()
    cases = _cases(files, gpu, models)
    if not cases:
        raise SpecError("calibrate: no measured points to fit (check the files and model names)")
    names = list(factors)
    x0 = _to_x(base, names)
    # Ceilings only from files that contribute fitted points: a held-out model's file says nothing.
    fitted_files = [f for f in files if any(models is None or p.model in models for p in f.points)]
    bounds = fit_bounds(fitted_files, gpu)
    lo = [math.log(bounds[n][0]) for n in names]
    hi = [math.log(bounds[n][1]) for n in names]
    x0 = [min(max(v, a + 1e-9), b - 1e-9) for v, a, b in zip(x0, lo, hi, strict=True)]
    meas = [math.log(pt.measured_s) for pt, _ in cases]

    def residuals(x: Sequence[float]) -> list[float]:
        prof = base.model_copy(update={n: math.exp(v) for n, v in zip(names, x, strict=True)})
        pm = PerfModel(prof)
        r = [math.log(pm.bind(dep).step_time_s(pt.shape())) - y for (pt, dep), y in zip(cases, meas, strict=True)]
        r.extend(PRIOR_WEIGHT * (v - v0) for v, v0 in zip(x, _to_x(base, names), strict=True))
        return r

    sol = least_squares(residuals, x0, bounds=(lo, hi), x_scale=1.0, diff_step=1e-4, max_nfev=4000,
                        loss=ROBUST_LOSS, f_scale=ROBUST_SCALE)
    fitted = {n: math.exp(v) for n, v in zip(names, sol.x, strict=True)}
    prof = base.with_factors(**fitted)
    if "grouped_tile_k" in names and all(dep.model.moe is None for _, dep in cases):
        prof = prof.with_factors(grouped_tile_k=_grouped_tile_k_without_moe_points(prof, fitted_files, gpu))
    stats = summarize(predict(prof, files, gpu, models))
    fit = {"points": float(stats["points"]), "median_abs_pct": stats["median_abs_pct"],
           "max_abs_pct": stats["max_abs_pct"]}
    return prof.with_factors(fit=fit)  # type: ignore[arg-type]


def fit_warnings(files: Sequence[GroundTruthFile], factors: Sequence[str] = FIT_FACTORS) -> list[str]:
    """What a fit on `files` cannot tell: fewer points than fitted factors (its in-sample error then
    says nothing), and step kinds (prefill, decode, mixed) with no point (their cost rests on factors
    fitted on the other kinds and on the prior)."""
    points = [pt for f in files for pt in f.points]
    out = []
    if len(points) < len(factors):
        out.append(f"{len(points)} measured points for {len(factors)} fitted factors: the fit's own error "
                   "says nothing about its accuracy; measure more shapes (`fleetwise measure` takes a grid) "
                   "and read the held-out residuals")
    missing = [k for k in ("prefill", "decode", "mixed") if not any(pt.kind == k for pt in points)]
    if missing:
        out.append(f"no {', '.join(missing)} points: those steps are priced from the other kinds' factors "
                   "and the prior; measure them to check")
    return out


FASTER_WHEN_HIGHER = frozenset({"gemm_mem_eff", "gemm_compute_eff", "attn_compute_eff", "kv_mem_eff",
                                 "elementwise_mem_eff", "eager_overlap_p"})
"""Factors whose larger value makes every step cheaper (efficiencies; the smooth max's exponent); for the
others (tile rows, kernel times, per-tile work, saturation units, MoE kernel weight) the smaller is cheaper."""


def faster_than_the_card(files: Sequence[GroundTruthFile], gpu: AcceleratorSpec) -> list[str]:
    """Points measured faster than any profile within the factor bounds can price them on `gpu` (every
    efficiency at its upper bound, every overhead at its lower): no fit can reach them, and the usual
    cause is the wrong card (`--gpu`) or a config that is not the measured model. One line naming the
    first such point and the count, or nothing."""
    bounds = fit_bounds(files, gpu)
    fastest = Profile().with_factors(**{n: b[1] if n in FASTER_WHEN_HIGHER else b[0] for n, b in bounds.items()})
    slow = [p for p in predict(fastest, files, gpu) if p.point.measured_s < p.predicted_s]
    if not slow:
        return []
    pt, floor = slow[0].point, slow[0].predicted_s
    shape = " ".join(f"{k}={v}" for k, v in pt.as_dict().items() if k not in ("model", "kind"))
    total = sum(len(f.points) for f in files)
    return [f"{len(slow)} of {total} points measured faster than {gpu.name} allows at the fastest factor "
            f"bounds (first: {pt.model} {pt.kind} {shape}: {pt.measured_s * 1e3:.4g} ms < "
            f"{floor * 1e3:.4g} ms); no fit reaches them: check --gpu and the model's config"]


def _grouped_tile_k_without_moe_points(profile: Profile, files: Sequence[GroundTruthFile],
                                      gpu: AcceleratorSpec) -> float:
    """No MoE point to fit the grouped kernel on: solve it from the MoE block the same run timed
    (`moe_block_ms`), else from the public block timing, each under the profile's fitted factors."""
    blocks = [f.ceilings[MOE_BLOCK_CEILING] for f in files if MOE_BLOCK_CEILING in f.ceilings]
    if blocks:
        return grouped_tile_k_from_block(profile, MOE_BLOCK_SHAPE, statistics.median(blocks), gpu)
    return grouped_tile_k_from_block(profile, PUBLIC_MOE_BLOCK_SHAPE, PUBLIC_MOE_BLOCK_MS,
                                     get_gpu(PUBLIC_MOE_BLOCK_GPU))


def grouped_tile_k_from_block(profile: Profile, shape: dict[str, int], block_ms: float,
                              gpu: AcceleratorSpec) -> float:
    """`grouped_tile_k` at which one MoE block of `shape` (experts, topk, hidden, moe_ffn, tokens) takes
    `block_ms` milliseconds on `gpu` with the profile's other factors (the routed-expert cost; clamped
    to the factor's bounds)."""
    from scipy.optimize import brentq

    s = shape
    block = ModelSpec(name="moe-block", num_layers=1, hidden_size=s["hidden"], num_attention_heads=16,
                      num_kv_heads=4, head_dim=128, ffn_size=0, vocab_size=1000,
                      moe=MoESpec(num_experts=s["experts"], experts_per_token=s["topk"], expert_ffn_size=s["moe_ffn"]))
    dep = Deployment(block, gpu)

    def excess_ms(log_k: float) -> float:
        pm = PerfModel(profile.with_factors(grouped_tile_k=math.exp(log_k)))
        return pm.bind(dep).routed_experts_s(s["tokens"]) * 1e3 - block_ms

    lo, hi = (math.log(v) for v in FACTOR_BOUNDS["grouped_tile_k"])
    if excess_ms(lo) >= 0:  # faster than any tile work explains: the fastest grouped kernel allowed
        return math.exp(lo)
    if excess_ms(hi) <= 0:
        return math.exp(hi)
    return math.exp(brentq(excess_ms, lo, hi, xtol=1e-9))


def model_names(files: Sequence[GroundTruthFile]) -> dict[str, ModelSpec]:
    """Every model measured in `files` (by name)."""
    out: dict[str, ModelSpec] = {}
    for f in files:
        out.update(f.models)
    return out


def cross_validate(files: Sequence[GroundTruthFile], gpu: AcceleratorSpec,
                   base: Profile | None = None) -> dict[str, dict[str, Any]]:
    """Leave-one-model-out: fit on every other model, predict the one left out."""
    out: dict[str, dict[str, Any]] = {}
    names = set(model_names(files))
    for held in sorted(names):
        rest = names - {held}
        if not rest:
            continue
        prof = calibrate(files, gpu, base=base, models=rest)
        out[held] = summarize(predict(prof, files, gpu, {held}))
    return out


def shape_key(pt: GroundTruthPoint) -> ShapeKey:
    """The step shape of a point, whatever model ran it: (kind, batch, seq, ctx, chunk)."""
    return (pt.kind, pt.batch, pt.seq, pt.ctx, pt.chunk)


def split_points(files: Sequence[GroundTruthFile], held: Callable[[GroundTruthPoint], bool]
                 ) -> tuple[list[GroundTruthFile], list[GroundTruthFile]]:
    """(files with the held points removed, files with only the held points); files left
    without points are dropped, so a file's ceilings bound a fit only when it gives that fit points."""
    fit = [replace(f, points=[p for p in f.points if not held(p)]) for f in files]
    out = [replace(f, points=[p for p in f.points if held(p)]) for f in files]
    return [f for f in fit if f.points], [f for f in out if f.points]


def predict_held_out(files: Sequence[GroundTruthFile], gpu: AcceleratorSpec, held: Callable[[GroundTruthPoint], bool],
                     base: Profile | None = None) -> list[Prediction]:
    """Fit on every point `held` rejects, predict the points it selects (none of them reach the fit)."""
    fit_on, held_files = split_points(files, held)
    if not held_files:
        return []
    return predict(calibrate(fit_on, gpu, base=base), held_files, gpu)


def shape_folds(files: Sequence[GroundTruthFile], folds: int = SHAPE_FOLDS) -> list[set[ShapeKey]]:
    """The distinct step shapes of `files`, dealt into `folds` groups: each kind's shapes in sorted
    order go round-robin, so every fold holds out some prefill, decode and mixed shapes and a shape
    measured on several models is held out for all of them at once."""
    groups: list[set[ShapeKey]] = [set() for _ in range(folds)]
    i = 0
    for kind in KINDS:
        for key in sorted({shape_key(p) for f in files for p in f.points if p.kind == kind}):
            groups[i % folds].add(key)
            i += 1
    return [g for g in groups if g]


def cross_validate_shapes(files: Sequence[GroundTruthFile], gpu: AcceleratorSpec, folds: int = SHAPE_FOLDS,
                          base: Profile | None = None) -> list[Prediction]:
    """K-fold over step shapes: each point predicted by the fit that did not see its shape (on any model)."""
    out: list[Prediction] = []
    for group in shape_folds(files, folds):
        out.extend(predict_held_out(files, gpu, lambda p, g=group: shape_key(p) in g, base))  # type: ignore[misc]
    return out


def held_out_residuals(files: Sequence[GroundTruthFile], gpu: AcceleratorSpec, base: Profile | None = None,
                       folds: int = SHAPE_FOLDS) -> list[list[float]]:
    """Every point's error when predicted by the fit that did not see its shape (K-fold over shapes),
    as the rows `Profile.residuals` stores (`fleetwise.perf.uncertainty`)."""
    return [residual(p.point.shape(), p.predicted_s, p.point.measured_s).as_list()
            for p in cross_validate_shapes(files, gpu, folds, base)]


def _upper_half(files: Sequence[GroundTruthFile], kind: str,
                size: Callable[[GroundTruthPoint], int]) -> Callable[[GroundTruthPoint], bool]:
    values = sorted({size(p) for f in files for p in f.points if p.kind == kind})
    cut = values[(len(values) - 1) // 2] if values else 0
    return lambda p: p.kind == kind and size(p) > cut


def extrapolate_shapes(files: Sequence[GroundTruthFile], gpu: AcceleratorSpec,
                       base: Profile | None = None) -> dict[str, list[Prediction]]:
    """Per `EXTRAPOLATION_AXES` axis, and for all axes at once (`all axes`: fit only on points in
    the smaller half of every axis), the predictions of the larger half from a fit on the smaller."""
    uppers = {name: _upper_half(files, kind, size) for name, (kind, size) in EXTRAPOLATION_AXES.items()}
    out = {name: predict_held_out(files, gpu, up, base) for name, up in uppers.items()}
    out["all axes"] = predict_held_out(files, gpu, lambda p: any(up(p) for up in uppers.values()), base)
    return out
