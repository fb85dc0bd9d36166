"""Shared pydantic base for specs and the one place that turns validation errors into one line.

Specs are frozen documents validated once at the edge (`extra="forbid"` so a typo'd field is an
error, not silently ignored). Loading YAML/JSON files goes through `load_document`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from fleetwise.errors import SpecError

T = TypeVar("T", bound=BaseModel)


class Spec(BaseModel):
    """Frozen, strict base for every declared spec."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


def describe_validation_error(err: ValidationError, where: str) -> str:
    """One line per problem: `where: field.path: message (got value)`."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(document)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field; remove it or check its spelling"
        got = e.get("input")
        got_s = "" if e["type"] in ("missing",) or isinstance(got, dict) else f" (got {got!r})"
        parts.append(f"{loc}: {msg}{got_s}")
    return f"{where}: " + "; ".join(parts)


def validate(model: type[T], data: Any, where: str) -> T:
    """Validate `data` as `model`, raising SpecError with a readable one-line message."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise SpecError(describe_validation_error(err, where)) from None


def read_document(path: str | Path) -> Any:
    """Parse a YAML or JSON file, with a clear error for a missing or malformed file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: file not found; check the path")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise SpecError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {first}") from None


def load_document(model: type[T], path: str | Path) -> T:
    """Read and validate a spec file."""
    data = read_document(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return validate(model, data, str(path))
