"""Shared pydantic base for specs and the one place that turns validation errors into one line.

Specs are frozen documents validated once at the edge (`extra="forbid"` so a typo'd field is an
error, not silently ignored; `allow_inf_nan=False` so NaN and infinities never pass as numbers).
Loading YAML/JSON files goes through `load_document`, which reads them with the bounded parsers
of `fleetwise.spec.inputs`.
"""

from __future__ import annotations

import datetime as dt
import json
import typing
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from fleetwise.errors import SpecError
from fleetwise.spec import inputs
from fleetwise.spec.attribute_docs import attribute_docstrings

T = TypeVar("T", bound=BaseModel)


class Spec(BaseModel):
    """Frozen, strict base for every declared spec."""

    # defer_build: a spec's validator is built on its first validation, not when its class is
    # defined, so a process pays only for the specs it validates (`fleetwise simulate` imports
    # some 40 spec classes and validates a handful); errors and the JSON schema are the same.
    # The fields' attribute docstrings (their schema descriptions) are set by
    # `__pydantic_init_subclass__` below, not by pydantic's `use_attribute_docstrings`.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, defer_build=True)

    retired_fields: ClassVar[dict[str, str]] = {}
    """Field names a spec no longer takes -> what to write instead (an old file gets the fix, not
    only "unknown field"; read by `describe_validation_error`)."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """A field without a description takes its attribute docstring (pydantic's
        `use_attribute_docstrings` rule, read from one parse per module: `spec.attribute_docs`)."""
        super().__pydantic_init_subclass__(**kwargs)
        docs = attribute_docstrings(cls)
        for name, info in cls.__pydantic_fields__.items():
            if info.description is None and name in docs:
                info.description = docs[name]


YAML_ON = ("on", "yes", "true", "y")
YAML_OFF = ("off", "no", "false", "n")
"""Words YAML 1.1 (PyYAML) reads as booleans when unquoted: `disaggregation: off` arrives as False."""


def on_off(on: str, off: str) -> BeforeValidator:
    """Validator of a setting that means on/off: a YAML boolean (`off`, `no`, `false` unquoted, or
    the same words quoted) is read as the setting's `off` value, and `on`/`yes`/`true` as `on`."""

    def read(value: Any) -> Any:
        word = value.strip().lower() if isinstance(value, str) else value
        if value is False or word in YAML_OFF:
            return off
        if value is True or word in YAML_ON:
            return on
        return value

    return BeforeValidator(read)


MAX_REPORTED_PROBLEMS = 2
"""Validation problems spelled out in one error line; the rest are counted."""


def _is_size_limit(ctx: Any) -> bool:
    """Upper bounds of 1000 and more are the size limits of `fleetwise.spec.inputs` (fractions are not)."""
    bound = (ctx or {}).get("le", (ctx or {}).get("lt"))
    return isinstance(bound, int | float) and bound >= 1000


_UNION_MEMBER_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "tuple", "none", "bytes"})


def _is_union_member(part: Any) -> bool:
    """Whether a location part is pydantic's name of a union member (`str`, `function-after[...]`),
    not a field: the user's path is the fields only."""
    return isinstance(part, str) and (part in _UNION_MEMBER_TAGS or "[" in part)


def _spec_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The spec class that holds the field at `loc` under `model` (list indices and union tags skipped)."""
    for part in loc:
        if model is None:
            return None
        if not isinstance(part, str) or _is_union_member(part):
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field is not None else None
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The first pydantic model in a field's type (`tuple[BackendSpec, ...]` -> BackendSpec)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _unknown_field(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> str:
    """The message for a field the spec does not take: its replacement where it was retired."""
    holder = _spec_at(model, loc[:-1]) if loc else None
    retired = getattr(holder, "retired_fields", {}) if holder is not None else {}
    name = loc[-1] if loc else None
    if isinstance(name, str) and name in retired:
        return f"no longer read; {retired[name]}"
    return "unknown field; remove it or check its spelling"


def describe_validation_error(err: ValidationError, where: str, model: type[BaseModel] | None = None) -> str:
    """One line: `where: field.path: message (got value)` for the first problems, values quoted short;
    `model` (the validated spec class) lets a retired field name its replacement."""
    parts = []
    # an unknown field first: it usually explains the "Field required" of its misspelt twin
    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    for e in errors[:MAX_REPORTED_PROBLEMS]:
        loc = ".".join(str(p) for p in e["loc"] if not _is_union_member(p))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = _unknown_field(model, tuple(e["loc"]))
        elif e["type"] == "finite_number":
            msg = "must be a finite number"
        elif e["type"] == "union_tag_invalid":
            ctx = e.get("ctx") or {}
            msg = f"unknown kind {inputs.quote(ctx.get('tag'), 30)}; expected one of {ctx.get('expected_tags')}"
            e = {**e, "type": "missing"}  # the tag is already quoted
        elif e["type"] in ("less_than_equal", "less_than") and _is_size_limit(e.get("ctx")):
            msg = f"{msg} (a limit, see docs/errors.md)"
        elif e["type"] in _STRICT_TYPES and isinstance(e.get("input"), str | bool | float):
            msg = f"{msg}; {_strict_fix(e['type'], e['input'])}"
        elif msg.startswith("Value error, "):
            msg = msg.removeprefix("Value error, ")
        got = e.get("input")
        got_s = "" if e["type"] in ("missing",) or isinstance(got, dict) else f" (got {inputs.quote(got)})"
        at = f"{inputs.quote_text(loc, 80)}: " if loc else ""
        parts.append(f"{at}{inputs.quote_text(msg, 160)}{got_s}")
    more = len(errors) - MAX_REPORTED_PROBLEMS
    return f"{where}: " + "; ".join(parts) + (f"; and {more} more problem(s)" if more > 0 else "")


_STRICT_TYPES = frozenset({"int_type", "float_type", "bool_type", "string_type"})
"""Error types of strict validation whose input was of the wrong kind (`"100"` for a count)."""


def _strict_fix(kind: str, got: Any) -> str:
    """The fix for a value of the wrong kind in a file (strict validation)."""
    if kind == "int_type" and isinstance(got, float) and not isinstance(got, bool):
        return "give a whole number"
    if kind in ("int_type", "float_type"):
        return "write a number, without quotes" if isinstance(got, str) else "give a number, not true/false"
    if kind == "bool_type":
        return "write true or false"
    return "write it as text (in quotes)"


def _json_default(obj: Any) -> Any:
    """What a parsed document may hold beyond JSON: YAML dates (as their ISO text), sets, specs."""
    if isinstance(obj, dt.date):
        return obj.isoformat()
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    raise SpecError(f"a value of type {type(obj).__name__} ({inputs.quote(obj)}) has no place in a spec")


def validate(model: type[T], data: Any, where: str, strict: bool = False) -> T:
    """Validate `data` as `model`, raising SpecError with a readable one-line message.

    `strict` is for documents read from a file or a request body: values are taken as JSON types
    and never coerced, so a count written `"100"`, `100.7` or `true` and a rate written `"5"` are
    errors naming the field (pydantic's strict mode on JSON input: an integer is still a valid
    float, a string still a valid enum, tuple or path). Values built by code or parsed from flags
    use the default (lax) mode.
    """
    try:
        if strict:
            try:
                text = json.dumps(data, default=_json_default, allow_nan=False)
            except (TypeError, ValueError):  # a key JSON cannot hold, a non-finite number
                inputs.check_finite_tree(data, where)
                raise SpecError(f"{where}: holds a value a spec cannot (a mapping key that is not text?); "
                                "check the document") from None
            return model.model_validate_json(text, strict=True)
        return model.model_validate(data)
    except ValidationError as err:
        raise SpecError(describe_validation_error(err, where, model)) from None


def read_document(path: str | Path) -> Any:
    """Parse a YAML or JSON file (bounded, UTF-8, no duplicate keys; see `fleetwise.spec.inputs`)."""
    return inputs.read_document(path)


def top_mapping(data: Any, where: str, what: str = "") -> dict[str, Any]:
    """`data`, a document's top level, if it is a mapping; else one SpecError line naming
    `where` and what it holds instead (an empty file says so). `what`: " (a ModelSpec)"."""
    if isinstance(data, dict):
        return data
    got = "the file is empty" if data is None else f"got {type(data).__name__}"
    raise SpecError(f"{where}: expected a mapping{what} at the top level, {got}; write its fields as `key: value` lines")


def load_document(model: type[T], path: str | Path) -> T:
    """Read and validate a spec file."""
    data = top_mapping(read_document(path), str(path))
    return validate(model, data, str(path), strict=True)
