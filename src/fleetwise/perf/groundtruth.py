"""Loader of measured step timings in the `fleetwise-groundtruth/1` format.

Owns turning one ground-truth JSON file into `GroundTruthPoint`s (prefill, decode and mixed
steps, each with its `BatchShape` and whether it ran as a CUDA-graph replay) and a `ModelSpec`
built from each model's `config`. Does not fit or predict anything (see `calibrate`).

Format (see `ground_truth/README.md` beside this module, which ships the H200 measurements): `models.NAME.config` holds
`layers, hidden, heads, kv_heads, head_dim, ffn, vocab` and, for MoE, `experts, topk, moe_ffn`;
`prefill` points are `{batch, seq, ms}` run eagerly; `decode` points `{batch, ctx, ms}` and
`mixed` points `{batch, ctx, chunk, ms}` (decodes plus one prompt chunk) replay a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from fleetwise.errors import SpecError
from fleetwise.perf.types import BatchShape
from fleetwise.spec.base import describe_validation_error, read_document
from fleetwise.spec.model import ModelSpec, MoESpec

GROUNDTRUTH_SCHEMA = "fleetwise-groundtruth/1"
"""Schema tag of a ground-truth file (`fleetwise measure` writes it, `fleetwise calibrate` reads it)."""
SHIPPED_DIR = Path(__file__).resolve().parent / "ground_truth"
"""The H200 step timings the project ships (measured facts; README.md there says how and where)."""
SHIPPED_FILES = ("h200_dense.json", "h200_moe.json", "h200_mixed.json")
"""The shipped ground-truth files: dense, MoE, and mixed (chunked-prefill) steps."""


def shipped(name: str) -> Path:
    """Path of one shipped ground-truth file (`SHIPPED_FILES`)."""
    return SHIPPED_DIR / name
MOE_BLOCK_CEILING = "moe_block_ms"
"""Ceiling key: milliseconds of one MoE block (router, top-k, sort by expert, the two grouped GEMMs,
weighted scatter-add) of `MOE_BLOCK_SHAPE` on random inputs, timed in the run's ceilings beside the
8192^3 GEMM (`fleetwise measure` records it). `calibrate` solves `grouped_tile_k` from it when it fits
no MoE point, so a dense-only calibration still prices this engine's grouped kernel."""
MOE_BLOCK_SHAPE: dict[str, int] = {"experts": 128, "topk": 8, "hidden": 2048, "moe_ffn": 768, "tokens": 32768}
"""The reference MoE block: Qwen3-30B-A3B's experts at 32,768 tokens, the shape of the public
torch._grouped_mm timing the grouped-kernel prior is checked on (VeOmni pull request 460)."""
Kind = Literal["prefill", "decode", "mixed"]
# Longest step time a measurement may report: one hour. The slowest shipped step is 1.4 s (a 32k-token
# prefill); a larger figure is a unit error or a corrupt file, not a step of an engine.
MAX_STEP_MS = 3.6e6
# Smallest value of each shape field of a point: a step has at least one sequence; a prefill at least one
# token; a decode attends at least its own new position; a mixed step's chunk may be empty (0).
_POINT_MINIMUM = {"batch": 1, "seq": 1, "ctx": 1, "chunk": 0}
_CONFIG_KEYS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab")
_POINT_KEYS: dict[str, tuple[str, ...]] = {
    "prefill": ("batch", "seq", "ms"),
    "decode": ("batch", "ctx", "ms"),
    "mixed": ("batch", "ctx", "chunk", "ms"),
}


@dataclass(frozen=True)
class GroundTruthPoint:
    """One measured step: its shape, how it ran and how long it took (seconds)."""

    model: str
    kind: Kind
    batch: int
    measured_s: float
    seq: int = 0
    ctx: int = 0
    chunk: int = 0

    @property
    def cuda_graphs(self) -> bool:
        """Prefill ran eagerly; decode and mixed steps replayed a captured graph."""
        return self.kind != "prefill"

    def shape(self) -> BatchShape:
        """The phase-free batch of this step."""
        if self.kind == "prefill":
            return BatchShape.prefill(self.batch, self.seq)
        shape = BatchShape.decode(self.batch, self.ctx)
        if self.kind == "mixed" and self.chunk > 0:
            shape = shape + BatchShape.prefill(1, self.chunk)
        return shape

    def as_dict(self) -> dict[str, Any]:
        """`{model, kind, batch, seq|ctx, chunk (mixed only)}`."""
        d: dict[str, Any] = {"model": self.model, "kind": self.kind, "batch": self.batch}
        if self.kind == "prefill":
            d["seq"] = self.seq
        else:
            d["ctx"] = self.ctx
        if self.kind == "mixed":
            d["chunk"] = self.chunk
        return d


@dataclass(frozen=True)
class GroundTruthFile:
    """One measured file: its setup, the models it measured and every point."""

    path: str
    device: str
    engine: str
    models: dict[str, ModelSpec]
    points: list[GroundTruthPoint] = field(default_factory=list)
    ceilings: dict[str, float] = field(default_factory=dict)
    """What the card reached in the same run (e.g. `bf16_gemm_8192_TFLOPs`)."""


def _whole(value: Any, where: str, minimum: int, fix: str) -> int:
    """`value` as an int when it is a whole JSON number (not a bool) of at least `minimum`; else SpecError."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value != int(value) or value < minimum:
        raise SpecError(f"{where}: expected a whole number >= {minimum}, got {value!r}; {fix}")
    return int(value)


def _step_ms(value: Any, where: str) -> float:
    """A measured step time in ms: a finite JSON number in (0, MAX_STEP_MS]; else SpecError."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not 0 < value <= MAX_STEP_MS:
        raise SpecError(f"{where}: expected a step time in milliseconds, a number in (0, {MAX_STEP_MS:g}], "
                        f"got {value!r}; fix or drop this point")
    return float(value)


def _ceiling(value: Any, where: str) -> float:
    """A ceiling the card reached (a positive finite number); else SpecError."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        raise SpecError(f"{where}: expected a positive number, got {value!r}; fix it or drop the ceiling")
    return float(value)


def model_from_config(name: str, cfg: dict[str, Any], where: str = "config") -> ModelSpec:
    """Build a `ModelSpec` from a ground-truth `config` block (untied embeddings, SwiGLU)."""
    missing = [k for k in _CONFIG_KEYS if k not in cfg]
    if missing:
        raise SpecError(f"{where}: missing {', '.join(missing)}; a config needs {', '.join(_CONFIG_KEYS)}")
    fix = "fix the model's config (whole counts and sizes)"
    v = {k: _whole(cfg[k], f"{where}.{k}", 0 if k == "ffn" else 1, fix) for k in _CONFIG_KEYS}
    moe = None
    try:
        if cfg.get("experts"):
            if "topk" not in cfg or "moe_ffn" not in cfg:
                raise SpecError(f"{where}: experts={cfg['experts']} needs `topk` and `moe_ffn`")
            moe = MoESpec(num_experts=_whole(cfg["experts"], f"{where}.experts", 1, fix),
                          experts_per_token=_whole(cfg["topk"], f"{where}.topk", 1, fix),
                          expert_ffn_size=_whole(cfg["moe_ffn"], f"{where}.moe_ffn", 1, fix))
        return ModelSpec(
            name=name, num_layers=v["layers"], hidden_size=v["hidden"], num_attention_heads=v["heads"],
            num_kv_heads=v["kv_heads"], head_dim=v["head_dim"], ffn_size=v["ffn"], vocab_size=v["vocab"],
            moe=moe, source=where,
        )
    except ValidationError as err:  # a shape rule (GQA ratio, top-k <= experts): the rule, value and fix
        raise SpecError(describe_validation_error(err, where)) from None
    except (ValueError, TypeError) as err:
        raise SpecError(f"{where}: {str(err).splitlines()[0]}") from None


def engine_name(doc: dict[str, Any]) -> str:
    """Engine label of a file: PyTorch version plus how steps ran (from `method`)."""
    method = str(doc.get("method", ""))
    parts = [f"pytorch-{doc.get('torch', 'unknown')}"]
    if "grouped_mm" in method:
        parts.append("grouped_mm")
    if "CUDA-graph" in method or "graph" in method:
        parts.append("eager-prefill+graph-decode")
    return " ".join(parts)


def _points(name: str, entry: dict[str, Any], where: str) -> list[GroundTruthPoint]:
    out: list[GroundTruthPoint] = []
    for kind, keys in _POINT_KEYS.items():
        rows = entry.get(kind, [])
        if not isinstance(rows, list):
            raise SpecError(f"{where}.{kind}: expected a list of points, got {type(rows).__name__}")
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or any(k not in row for k in keys):
                raise SpecError(f"{where}.{kind}[{i}]: a {kind} point needs {', '.join(keys)}")
            at = f"{where}.{kind}[{i}]"
            ms = _step_ms(row["ms"], f"{at}.ms")
            size = {k: _whole(row[k], f"{at}.{k}", _POINT_MINIMUM[k], "fix or drop this point")
                    for k in keys if k != "ms"}
            out.append(GroundTruthPoint(
                model=name, kind=kind, batch=size["batch"], measured_s=ms / 1e3,  # type: ignore[arg-type]
                seq=size.get("seq", 0), ctx=size.get("ctx", 0), chunk=size.get("chunk", 0),
            ))
    return out


def load_groundtruth(path: str | Path) -> GroundTruthFile:
    """Read one `fleetwise-groundtruth/1` file; SpecError naming the problem when it is not one."""
    doc = read_document(path)
    where = str(path)
    if not isinstance(doc, dict) or doc.get("schema") != GROUNDTRUTH_SCHEMA:
        raise SpecError(f"{where}: not a ground-truth file (expected \"schema\": \"{GROUNDTRUTH_SCHEMA}\")")
    models_doc = doc.get("models")
    if not isinstance(models_doc, dict) or not models_doc:
        raise SpecError(f"{where}: `models` must be a non-empty mapping of model name -> measurements")
    models: dict[str, ModelSpec] = {}
    points: list[GroundTruthPoint] = []
    for name, entry in models_doc.items():
        w = f"{where}: models.{name}"
        if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
            raise SpecError(f"{w}: needs a `config` mapping")
        models[name] = model_from_config(name, entry["config"], f"{w}.config")
        points.extend(_points(name, entry, w))
    if not points:
        raise SpecError(f"{where}: no prefill, decode or mixed points to use")
    raw = doc.get("ceilings")
    ceilings = {k: _ceiling(v, f"{where}: ceilings.{k}") for k, v in raw.items()} if isinstance(raw, dict) else {}
    return GroundTruthFile(where, str(doc.get("device", "")), engine_name(doc), models, points, ceilings)
