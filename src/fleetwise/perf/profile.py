"""`Profile`: the efficiency and overhead factors the roofline applies on top of datasheet peaks.

Owns the factor names, their defaults (sane on any accelerator, no calibration), their physical
bounds (what `calibrate` may fit them to) and JSON load/save. Does not know how the factors are
used (see `fleetwise.perf.roofline`) or fitted (see `fleetwise.perf.calibrate`).

A profile names the accelerator and the engine it was measured on: the same card under a
different engine (fused kernels, other attention backend) needs its own profile. Every factor is
shared by every model: there are no per-model constants.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from fleetwise.errors import SpecError
from fleetwise.spec.base import Spec, read_document, validate
from fleetwise.spec.output import write_json

PROFILE_SCHEMA = "fleetwise-profile/4"
# Profiles of the schemas before: /1 fitted `moe_row_passes` and `grouped_m_half_tokens`; /2 had one
# shape-blind `grouped_compute_eff` (now `grouped_tile_k`, which depends on the expert's shape); /3
# fitted `elementwise_passes` over one width (now counted traffic at a fitted `elementwise_mem_eff`).
OLD_PROFILE_SCHEMAS = ("fleetwise-profile/1", "fleetwise-profile/2", "fleetwise-profile/3")

# Default `grouped_tile_k`, used when no MoE point was fitted. Source: torch._grouped_mm fused MoE
# forward on an H100, 512 experts, top-10, hidden 2048, expert FFN 512, 32,768 tokens: 11.41 ms
# (180.7 TFLOP/s), ByteDance-Seed/VeOmni pull request 460. Solving this model's routed-expert terms
# (default factors, H100 datasheet peaks) for that time gives 1,225 (tests/perf/test_roofline.py
# reproduces it). A different MoE shape from any the ground truth holds, so held-out checks stay honest.
GROUPED_TILE_K_PRIOR = 1225.0
# The same public timing as a measurement: a calibration that fits no MoE point and whose files carry no
# MoE-block ceiling solves `grouped_tile_k` from it under its own fitted factors (`calibrate`), so the
# constant is consistent with the engine's fitted efficiencies instead of the defaults above.
PUBLIC_MOE_BLOCK_GPU = "h100-sxm"
PUBLIC_MOE_BLOCK_SHAPE: dict[str, int] = {"experts": 512, "topk": 10, "hidden": 2048, "moe_ffn": 512, "tokens": 32768}
PUBLIC_MOE_BLOCK_MS = 11.411

RESIDUAL_FIELDS = 4  # a stored residual row: log2 tokens, log2 context, prompt share, error (perf.uncertainty)

# Factor name -> (lower, upper) bound a fit may use. Bounds are physical: an efficiency is a
# fraction of a datasheet peak, a kernel time is between a GPU launch (~1 us) and a slow eager
# PyTorch op (~100 us), a half-efficiency size lies between one row and a full tile wave.
FACTOR_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_mem_eff": (0.3, 1.0),
    "gemm_compute_eff": (0.3, 1.0),
    "gemm_m_half_tokens": (1.0, 128.0),
    "grouped_tile_k": (1.0, 65536.0),
    "expert_group_s": (0.05e-6, 20e-6),
    "attn_compute_eff": (0.1, 1.0),
    "kv_mem_eff": (0.2, 1.0),
    "attn_saturation_units": (1.0, 4096.0),
    "elementwise_mem_eff": (0.05, 1.0),
    "kernel_graph_s": (0.2e-6, 20e-6),
    "kernel_eager_s": (1e-6, 100e-6),
    "moe_kernel_weight": (1.0, 4.0),
    "eager_overlap_p": (1.0, 16.0),
}


class Profile(Spec):
    """Fitted (or default) efficiency factors for one accelerator under one engine."""

    schema_: str = Field(default=PROFILE_SCHEMA, alias="schema")
    """Format tag of the JSON document."""
    accelerator: str = "any"
    """Catalog name of the card the factors were measured on (`any` for the defaults)."""
    engine: str = "default"
    """Engine that ran the measured steps (implementation and version)."""
    source: str = ""
    """Where the factors come from (files fitted, or `defaults`)."""

    gemm_mem_eff: float = Field(default=0.7, gt=0, le=1)
    """Fraction of peak HBM bandwidth a dense GEMM reaches while streaming its weights."""
    gemm_compute_eff: float = Field(default=0.7, gt=0, le=1)
    """Fraction of dense peak FLOP/s a large GEMM reaches (cuBLAS on big shapes: 0.7-0.8)."""
    gemm_m_half_tokens: float = Field(default=96.0, gt=0)
    """Padding rows of a large-M dense GEMM tile: eff(M) = eff*M/(M+min(M, m_half)) (a GEMM of fewer rows
    runs in a smaller tile and pads at most its own rows; routed experts pay m_half rows each)."""
    grouped_tile_k: float = Field(default=GROUPED_TILE_K_PRIOR, gt=0)
    """Fixed work of one grouped (expert) GEMM output tile, in reduction steps: a tile with reduction
    length K runs at K/(K + grouped_tile_k) of a dense tile's rate (group lookup, operand-descriptor
    switch, pipeline fill and epilogue, amortised over the K loop). So narrow experts (small hidden or
    FFN) run far below a dense GEMM and wide ones close to it. The default is a public measurement of
    another MoE shape (`GROUPED_TILE_K_PRIOR`)."""
    expert_group_s: float = Field(default=1e-6, gt=0)
    """Fixed GPU time per touched expert and MoE layer in a grouped GEMM (group setup, pipeline fill).
    Source of the default: none measured; 1 us is a round prior of the order of one CTA's prologue
    and epilogue. The all-points H200 fit (benchmarks/results/perf_fidelity.json, `in_sample`): 1.00 us."""
    attn_compute_eff: float = Field(default=0.4, gt=0, le=1)
    """Fraction of dense peak FLOP/s fused (flash) attention reaches on prompt chunks."""
    kv_mem_eff: float = Field(default=0.85, gt=0, le=1)
    """Fraction of peak HBM bandwidth decode attention reaches reading the KV cache, when saturated."""
    attn_saturation_units: float = Field(default=96.0, gt=0)
    """(decode sequence x KV head) work units per GPU needed to saturate bandwidth (about one per SM)."""
    elementwise_mem_eff: float = Field(default=0.5, gt=0, le=1)
    """Fraction of peak HBM bandwidth the elementwise kernels reach on their counted traffic (the
    `elementwise_*_passes` below): short eager kernels (norms, RoPE halves, copies) stream well below a
    large copy. Default: half of peak, a round prior (the H200 fit is lower, docs/perf-model.md)."""
    kernel_graph_s: float = Field(default=1.5e-6, gt=0)
    """GPU time per kernel when steps replay CUDA graphs (launch gaps, tails, tiny kernels)."""
    kernel_eager_s: float = Field(default=12e-6, gt=0)
    """Host time to launch one kernel eagerly (framework dispatch): the floor of short eager steps."""
    moe_kernel_weight: float = Field(default=1.5, ge=1)
    """Cost of an MoE-block kernel (routing, sort, scatter, grouped GEMM) relative to a plain one.
    Source of the default: none measured; a round prior between a plain kernel (1) and the bound (4).
    The all-points H200 fit (benchmarks/results/perf_fidelity.json, `in_sample`): 1.62."""
    eager_overlap_p: float = Field(default=4.0, ge=1)
    """Exponent of the smooth max (host^p + gpu^p)^(1/p) of eager steps: host launches overlap GPU work."""

    attn_kernels_per_layer: int = Field(default=39, ge=0)
    """Kernels of one attention block (norm, QKV GEMM, RoPE ops, cache write, attention, O GEMM, residual)."""
    ffn_kernels_per_layer: int = Field(default=6, ge=0)
    """Kernels of one dense SwiGLU block (norm, gate/up GEMM, SiLU, mul, down GEMM, residual)."""
    moe_kernels_per_layer: int = Field(default=20, ge=0)
    """Kernels of one MoE block (norm, router, softmax, top-k, sort, counts, gather, 2 grouped GEMMs, scatter).
    Source: counted from the ground truth's MoE block (README of the H200 ground truth: router softmax,
    top-k, tokens sorted by expert, torch._grouped_mm); not fitted."""
    moe_row_hidden_passes: int = Field(default=7, ge=0)
    """Reads+writes of a routed row's hidden-width activations outside the grouped GEMMs: gather
    (2), routing-weight multiply (2), scatter-add (3: read the row, read and write the sum).
    Source: counted from the same MoE block; not fitted."""
    moe_row_ffn_passes: int = Field(default=5, ge=0)
    """Reads+writes of a routed row's expert-width activations outside the grouped GEMMs: SiLU (2)
    and the gate*up product (3). Source: counted from the same MoE block; not fitted."""
    elementwise_hidden_passes: int = Field(default=10, ge=0)
    """Reads+writes per token and layer over the hidden width outside the GEMMs: two RMSNorms (2 each)
    and two residual adds (3 each). Counted from the ground truth's decoder (ground_truth/README.md); not fitted."""
    elementwise_qhead_passes: int = Field(default=13, ge=0)
    """Reads+writes over the query-head width (heads x head_dim / tp): RoPE on the queries by halves
    (four products, a difference and a sum of halves, the concatenation: 9), writing K and V expanded
    to every query head for the fused kernel (2), the attention output's transpose copy (2). Counted; not fitted."""
    elementwise_kvhead_passes: int = Field(default=11, ge=0)
    """Reads+writes over the KV-head width (kv_heads x head_dim / tp): RoPE on the keys (9), reading K
    and V for the expansion (2). Counted; not fitted."""
    elementwise_ffn_passes: int = Field(default=5, ge=0)
    """Reads+writes over the FFN width of a dense layer (ffn / tp): SiLU (2) and the gate*up product (3).
    Counted; not fitted."""
    step_kernels: int = Field(default=6, ge=0)
    """Kernels once per step (embedding gather, final norm, LM head, sampling prep)."""

    fit: dict[str, float] = Field(default_factory=dict)
    """Fit statistics (median/max absolute % error, points) when the profile was calibrated."""
    residuals: list[list[float]] = Field(default_factory=list)
    """Held-out errors of the calibration, one `[log2 tokens, log2 context, prompt share, error]` row per
    measured step predicted by a fit that had not seen its shape (`fleetwise.perf.uncertainty`): the
    bands of predicted step times come from the nearest of them. Empty: predictions carry no band."""

    @field_validator("residuals")
    @classmethod
    def _four_numbers(cls, rows: list[list[float]]) -> list[list[float]]:
        bad = next((i for i, r in enumerate(rows) if len(r) != RESIDUAL_FIELDS), None)
        if bad is not None:
            raise ValueError(f"residuals[{bad}] has {len(rows[bad])} numbers, expected {RESIDUAL_FIELDS} "
                             "(log2 tokens, log2 context, prompt share, error); recalibrate")
        return rows

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON."""
        write_json(path, self.model_dump(by_alias=True), indent=1)

    @staticmethod
    def load(path: str | Path) -> Profile:
        """Read and validate a profile JSON file."""
        data = read_document(path)
        if isinstance(data, dict) and data.get("schema") in OLD_PROFILE_SCHEMAS:
            raise SpecError(
                f"{path}: schema {data['schema']!r} was fitted by an older perf model (its factors changed); "
                "recalibrate it with `fleetwise calibrate GROUND_TRUTH.json -o PROFILE.json`"
            )
        if not isinstance(data, dict) or data.get("schema") != PROFILE_SCHEMA:
            raise SpecError(
                f"{path}: not a fleetwise profile (expected \"schema\": \"{PROFILE_SCHEMA}\"); "
                "create one with `fleetwise calibrate GROUND_TRUTH.json -o PROFILE.json`"
            )
        return validate(Profile, data, str(path), strict=True)

    def factors(self) -> dict[str, float]:
        """The fittable factors by name."""
        return {k: float(getattr(self, k)) for k in FACTOR_BOUNDS}

    def with_factors(self, **values: float) -> Profile:
        """A copy with some factors replaced (validated)."""
        data = self.model_dump(by_alias=True)
        data.update(values)
        return validate(Profile, data, "profile")
