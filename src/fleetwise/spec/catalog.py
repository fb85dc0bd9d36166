"""The built-in catalog of models and accelerators, and resolution of `--model`/`--gpu` values.

Owns lookups (`get_model`, `get_gpu`, `list_models`, `list_gpus`) with close-name suggestions
for unknown names, and `resolve_model`/`resolve_gpu`, which accept a catalog name or a file:
a Hugging Face config.json, or a YAML/JSON `ModelSpec`/`AcceleratorSpec` document. The figures
themselves live in `catalog_models` and `catalog_gpus`.
"""

from __future__ import annotations

from pathlib import Path

from fleetwise.errors import SpecError, UnknownNameError, quote
from fleetwise.spec.base import read_document, top_mapping, validate
from fleetwise.spec.catalog_gpus import GPUS
from fleetwise.spec.catalog_models import MODELS
from fleetwise.spec.hardware import AcceleratorSpec
from fleetwise.spec.hf import (
    default_name,
    looks_like_hf_config,
    looks_like_repo_id,
    model_from_hf_cache,
    model_from_hf_config,
    model_from_hf_path,
)
from fleetwise.spec.model import ModelSpec

_FILE_SUFFIXES = (".json", ".yaml", ".yml")
MAX_NAME_CHARS = 1024
"""Longest `--model`/`--gpu` value: a catalog name or a path (Linux allows 4096, real ones are short)."""


def get_model(name: str) -> ModelSpec:
    """A catalog model by name (case-insensitive); UnknownNameError lists the closest names."""
    spec = MODELS.get(name.strip().lower())
    if spec is None:
        raise UnknownNameError("model", name, MODELS)
    return spec


def get_gpu(name: str) -> AcceleratorSpec:
    """A catalog accelerator by name (case-insensitive); UnknownNameError lists the closest names."""
    spec = GPUS.get(name.strip().lower())
    if spec is None:
        raise UnknownNameError("gpu", name, GPUS)
    return spec


def list_models() -> list[ModelSpec]:
    """Every catalog model, in catalog order."""
    return list(MODELS.values())


def list_gpus() -> list[AcceleratorSpec]:
    """Every catalog accelerator, in catalog order."""
    return list(GPUS.values())


def _is_path_like(value: str) -> bool:
    if not value.strip():  # '' is the current directory to Path, never a model or accelerator
        return False
    if "/" in value or "\\" in value or value.lower().endswith(_FILE_SUFFIXES):
        return True
    try:
        return Path(value).exists()
    except (OSError, ValueError):  # a name too long for a path, or holding a NUL byte
        return False


def _check_name(value: str, kind: str) -> None:
    """SpecError for a value that is neither a name nor a path (control characters, absurd length)."""
    if len(value) > MAX_NAME_CHARS or any(ord(c) < 32 for c in value):
        raise SpecError(f"{kind} {quote(value)}: not a catalog name or a file path (control characters or over "
                        f"{MAX_NAME_CHARS} characters); see `fleetwise catalog {kind}s`")


def resolve_model(name_or_path: str) -> ModelSpec:
    """A catalog name, a HF config.json (file or model directory), a HF repo id whose config is in the
    local Hugging Face cache, or a YAML/JSON ModelSpec file."""
    _check_name(name_or_path, "model")
    if name_or_path.strip().lower() in MODELS:
        return MODELS[name_or_path.strip().lower()]
    if (looks_like_repo_id(name_or_path) and not name_or_path.lower().endswith(_FILE_SUFFIXES)
            and not Path(name_or_path).exists()):
        return model_from_hf_cache(name_or_path)
    if not _is_path_like(name_or_path):
        raise UnknownNameError("model", name_or_path, MODELS)
    p = Path(name_or_path)
    if p.is_dir():
        return model_from_hf_path(p)
    if p.suffix == ".json" and p.is_file():
        return _model_from_json(p)
    data = top_mapping(read_document(p), str(p), " (a ModelSpec)")
    if looks_like_hf_config(data):
        return model_from_hf_config(data, default_name(p), source=f"config at {p}")
    return validate(ModelSpec, data, str(p), strict=True)


def _model_from_json(p: Path) -> ModelSpec:
    from fleetwise.spec.hf import read_hf_config

    data = read_hf_config(p)
    if looks_like_hf_config(data):
        return model_from_hf_config(data, default_name(p), source=f"config.json at {p}")
    return validate(ModelSpec, data, str(p), strict=True)


def resolve_gpu(name_or_path: str) -> AcceleratorSpec:
    """A catalog accelerator name, or a YAML/JSON AcceleratorSpec file."""
    _check_name(name_or_path, "gpu")
    if name_or_path.strip().lower() in GPUS:
        return GPUS[name_or_path.strip().lower()]
    if not _is_path_like(name_or_path):
        raise UnknownNameError("gpu", name_or_path, GPUS)
    data = top_mapping(read_document(name_or_path), name_or_path, " (an AcceleratorSpec)")
    return validate(AcceleratorSpec, data, str(name_or_path), strict=True)
