"""What a plan was priced with: the GPU prices per accelerator and where the perf model is uncalibrated.

Owns the plan document's `prices` and `calibration` sections. A plan's latencies come from the
perf model's efficiency factors: fitted ones (a `fleetwise calibrate` profile measured on the same
card) carry the accuracy docs/perf-model.md measures; default ones, or a profile measured on
another card, do not, and the plan says which factor drives which of its figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetwise.perf.profile import Profile
from fleetwise.spec.catalog_gpus import GPUS

if TYPE_CHECKING:
    from fleetwise.planner.state import Search

CALIBRATED_ACCURACY = ("a profile fitted on a card's measured steps predicts them within 1.40% median, 11.2% "
                       "worst (H200, docs/perf-model.md, Measured accuracy)")
"""The accuracy a calibrated profile is known to reach, as README and docs/perf-model.md state it."""

FACTORS_BY_FIGURE: dict[str, tuple[tuple[str, ...], str]] = {
    "TTFT": (("gemm_compute_eff", "attn_compute_eff"),
             "prefill is compute-bound: step time scales with 1 / these efficiencies, so TTFT and the "
             "prefill replica count move with them"),
    "TPOT": (("gemm_mem_eff", "kv_mem_eff"),
             "decode is memory-bound: step time scales with 1 / these efficiencies, so TPOT, the decode "
             "batch that meets the target and the replica count move with them"),
}
"""Which perf factors (`perf.profile.Profile`) set which SLO figure of a dense model, and why."""
MOE_FACTORS = (("grouped_tile_k", "expert_group_s", "moe_kernel_weight"),
               "the MoE blocks' grouped GEMMs: their defaults are priors, not measurements (docs/perf-model.md)")
"""Extra factors a mixture-of-experts model's step time depends on."""


def prices(search: Search) -> dict[str, dict[str, Any]]:
    """Price per GPU-hour (USD) of each accelerator the plan could use, and where it comes from."""
    given = {c.name: c.price_per_hour_usd for c in search.spec.accelerators}
    out = {}
    for name, gpu in search.hw.gpus.items():
        from_spec = given.get(name) is not None
        source = ("spec: accelerators[].price_per_hour_usd" if from_spec else
                  "catalog default: " + gpu.sources.get("price_per_hour_usd", "fleetwise catalog") if name in GPUS else
                  f"accelerator file {name}: price_per_hour_usd")  # a card from a file is keyed by its path
        out[name] = {"usd_per_gpu_hour": round(gpu.price_per_hour_usd, 4), "source": source}
    return out


def _factor_values(p: Profile, names: tuple[str, ...]) -> str:
    return ", ".join(f"{n} {getattr(p, n):g}" for n in names)


def calibration(search: Search) -> dict[str, Any]:
    """The `calibration` section: the profile used, and per accelerator and figure where it is uncalibrated."""
    p, path = search.perf.profile, search.spec.profile
    moe = search.hw.model.moe is not None
    uncalibrated = []
    for name in search.hw.gpus:
        if path is None:
            why_not = "no profile given: the default factors, not fitted to any measurement"
        elif p.accelerator not in ("any", name):
            why_not = f"the profile was fitted on {p.accelerator}, not on {name}"
        else:
            continue
        figures = [(fig, names, why) for fig, (names, why) in FACTORS_BY_FIGURE.items()]
        if moe:
            figures.append(("TTFT and TPOT (MoE)", *MOE_FACTORS))
        for fig, names, why in figures:
            uncalibrated.append({"accelerator": name, "figure": fig, "factors": _factor_values(p, names),
                                 "reason": why_not, "why_it_matters": why})
    return {
        "profile": path,
        "profile_accelerator": p.accelerator if path else None,
        "fit": dict(p.fit) if path else {},
        "calibrated_accuracy": CALIBRATED_ACCURACY,
        "uncalibrated": uncalibrated,
        "fix": "" if not uncalibrated else
        "measure steps on the card and fit a profile: `fleetwise calibrate STEPS.json -o PROFILE.json --gpu GPU`, "
        "then pass `--profile PROFILE.json` (or `profile:` in the spec)",
    }
