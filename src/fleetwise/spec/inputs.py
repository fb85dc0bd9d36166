"""Untrusted input, read once and bounded: files, request bodies and values read outside a spec.

Every file a user names (plan, workload, faults, planning spec, scenario, profile, ground truth,
model or accelerator spec, trace) and every body a live server receives is decoded and parsed
here, so a mistake gives one `SpecError` line naming the field, a short quote of the value and
the fix, never a `UnicodeDecodeError`, a `RecursionError`, an alias bomb or a silently kept
duplicate key. Stdlib + PyYAML only (L0): every layer, the CLI and the live servers use it.

Usage (CLI, emulator, gateway alike):

    from fleetwise.spec.inputs import parse_json, read_document, quote, finite
    from fleetwise.spec.output import strict_json_dumps

    doc = read_document(path)                       # YAML or JSON file -> plain data
    body = parse_json(raw_bytes, "request body")    # bytes off the wire; depth and size bounded
    rate = finite(body.get("rate"), "rate", minimum=0.0)   # a finite float >= 0, or SpecError
    raise SpecError(f"prompt: {quote(value)} is not a string")   # value cut to a short quote
    text = strict_json_dumps(result)                # NaN/Infinity -> null, never invalid JSON

A `SpecError` maps to exit code 2 on the command line and to HTTP 400 on a server. Specs built on
`fleetwise.spec.base.Spec` already refuse NaN and infinities in every float field; `finite` is for
values read outside a spec. The size limits are in `spec.limits`, the writers in `spec.output`, the context checks in
`spec.context`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetwise.errors import SpecError, quote
from fleetwise.spec.limits import (
    MAX_BODY_BYTES,
    MAX_DOCUMENT_BYTES,
    MAX_INT_DIGITS,
    MAX_NESTING_DEPTH,
    MAX_QUOTE_CHARS,
)

# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------

_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def decode_text(data: bytes, where: str, what: str = "text") -> str:
    """UTF-8 text of `data` (a leading BOM dropped); SpecError for binary, UTF-16 or bad UTF-8."""
    if data.startswith(_UTF16_BOMS):
        raise SpecError(f"{where}: the file is UTF-16; save it as UTF-8 {what}")
    if b"\x00" in data[:8192]:
        raise SpecError(f"{where}: binary data (NUL bytes), not UTF-8 {what}; check the path")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise SpecError(f"{where}:{line}: byte {data[err.start]:#04x} at offset {err.start} is not UTF-8; "
                        f"save the file as UTF-8 {what}") from None
    return text.removeprefix("\ufeff")


def check_file(path: str | Path, what: str = "file") -> Path:
    """`path` as an existing regular file, else SpecError naming the path."""
    p = Path(path)
    try:
        if p.is_dir():
            raise SpecError(f"{quote(str(p), 200)}: is a directory; expected a {what}")
        if not p.is_file():
            raise SpecError(f"{quote(str(p), 200)}: {what} not found; check the path")
    except (OSError, ValueError) as err:  # a name too long for the file system, a NUL byte, a permission error
        reason = getattr(err, "strerror", None) or str(err)
        raise SpecError(f"{quote(str(p), 200)}: cannot read the {what} ({reason}); check the path") from None
    return p


def read_bytes(path: str | Path, max_bytes: int = MAX_DOCUMENT_BYTES, what: str = "file") -> bytes:
    """The bytes of an existing file no larger than `max_bytes`; SpecError otherwise."""
    p = check_file(path, what)
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise SpecError(f"{p}: {size:,} bytes is over the {max_bytes:,}-byte limit for a {what}; "
                            "check the path (see docs/errors.md for limits)")
        with p.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as err:
        raise SpecError(f"{p}: cannot read the {what} ({err.strerror or err})") from None
    if len(data) > max_bytes:
        raise SpecError(f"{p}: over the {max_bytes:,}-byte limit for a {what}")
    return data


def read_text(path: str | Path, max_bytes: int = MAX_DOCUMENT_BYTES, what: str = "file") -> str:
    """UTF-8 text of a file (see `read_bytes` and `decode_text`)."""
    return decode_text(read_bytes(path, max_bytes, what), str(path), what)


# ---------------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------------


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_JSON_BRACKETS = re.compile(r"[\[\]{}]")


def json_depth(text: str, stop_above: int | None = None) -> int:
    """Deepest bracket nesting of a JSON text, brackets inside strings ignored (C-speed regexes;
    only the brackets are walked in Python), or the first depth above `stop_above`."""
    depth = deepest = 0
    for b in _JSON_BRACKETS.finditer(_JSON_STRING.sub("", text)):
        if b.group() in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop_above is not None and deepest > stop_above:
                    break
        else:
            depth -= 1
    return deepest


class _Refused:
    """A number JSON may spell but a document may not hold (NaN, an infinity, an overflowing
    literal, an integer of too many digits), kept with its spelling so the error can name the
    field it sits in (`check_finite_tree`) rather than just the file."""

    def __init__(self, text: str, reason: str) -> None:
        self.text, self.reason = text, reason

    def __repr__(self) -> str:
        return quote_text(self.text)


def _number_hooks() -> tuple[list[str], Callable[[str], Any], Callable[[str], Any], Callable[[str], Any]]:
    """`json.loads` hooks (constants, floats, ints) that read NaN, infinities, overflowing
    literals and over-long integers as `_Refused` and note them, so the caller walks the tree for
    the field's path only when there is one."""
    bad: list[str] = []

    def refuse(text: str, reason: str) -> _Refused:
        bad.append(text)
        return _Refused(text, reason)

    def constant(text: str) -> Any:
        return refuse(text, "is not a finite number; give a finite value")

    def number(text: str) -> Any:
        x = float(text)
        return x if math.isfinite(x) else refuse(text, "overflows a float; give a finite value")

    def integer(text: str) -> Any:
        digits = len(text.lstrip("-"))
        if digits > MAX_INT_DIGITS:
            return refuse(text, f"is an integer of {digits} digits; give at most {MAX_INT_DIGITS}")
        return int(text)

    return bad, constant, number, integer


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {quote(k)}; give each key once")
        out[k] = v
    return out


def parse_json(data: bytes | str, where: str, max_bytes: int = MAX_BODY_BYTES,
               max_depth: int = MAX_NESTING_DEPTH) -> Any:
    """Parse JSON from bytes or text: UTF-8, at most `max_bytes`, `max_depth` deep, no duplicate
    keys, no NaN/Infinity, integers of at most `MAX_INT_DIGITS` digits; SpecError otherwise.
    The depth is scanned only when the text holds more opening brackets than `max_depth` (fewer
    cannot nest deeper), so a request body of ordinary shape costs one C-speed count."""
    if len(data) > max_bytes:
        raise SpecError(f"{where}: {len(data):,} bytes is over the {max_bytes:,}-byte limit")
    text = decode_text(data, where, "JSON") if isinstance(data, (bytes, bytearray)) else data
    if text.count("[") + text.count("{") > max_depth and json_depth(text, stop_above=max_depth) > max_depth:
        raise SpecError(f"{where}: nested more than {max_depth} levels deep; flatten the document")
    return _loads(text, where, row=False)


def parse_json_line(line: str, where: str) -> Any:
    """Parse one JSONL row (a trace line) fast: the C decoder, NaN/Infinity and huge integers
    refused, nesting beyond the interpreter's stack a SpecError instead of a RecursionError."""
    return _loads(line, where, row=True)


def _loads(text: str, where: str, row: bool) -> Any:
    """`json.loads` with the number hooks (NaN/Infinity and huge integers refused) and every
    failure a SpecError at `where`: a document also refuses duplicate keys; a `row` (one JSONL
    line) is only a line, so its messages say the column and a RecursionError is caught here."""
    bad, constant, number, integer = _number_hooks()
    try:
        data = json.loads(text, object_pairs_hook=None if row else _unique_pairs, parse_constant=constant,
                          parse_float=number, parse_int=integer)
    except json.JSONDecodeError as err:
        at = f"({err.msg} at column {err.colno})" if row else f": {err.msg} at line {err.lineno} column {err.colno}"
        raise SpecError(f"{where}: not valid JSON{' ' if row else ''}{at}") from None
    except RecursionError:
        raise SpecError(f"{where}: nested too deep to be a trace row") from None
    except ValueError as err:
        raise SpecError(f"{where}: {'' if row else 'not accepted: '}{err}") from None
    if bad:
        check_finite_tree(data, where)
    return data


# ---------------------------------------------------------------------------------------------
# YAML
# ---------------------------------------------------------------------------------------------


def parse_yaml(text: str, where: str) -> Any:
    """Parse YAML text with the safe loader, bounded depth and alias expansion, no duplicate keys."""
    # PyYAML loads with the first YAML document (`spec.yaml_input`): a run given JSON files only
    # (the benchmark against Vidur, `plan --json` output) does not import it.
    import yaml

    from fleetwise.spec.yaml_input import load

    try:
        data = load(text, where)
    except yaml.YAMLError as err:
        raise SpecError(f"{where}: not valid YAML: {_yaml_reason(err)}") from None
    check_finite_tree(data, where)
    return data


def _yaml_reason(err: Any) -> str:
    """The reason of a `yaml.YAMLError`, with its line and column where it has them."""
    import yaml  # loaded already: only a YAML document's error comes here

    if isinstance(err, yaml.MarkedYAMLError):
        where = f" (line {err.problem_mark.line + 1}, column {err.problem_mark.column + 1})" if err.problem_mark else ""
        return quote_text(f"{err.problem or err.context or 'syntax error'}{where}", 160)
    return quote_text(str(err).splitlines()[0] if str(err) else type(err).__name__, 160)


def quote_text(text: str, limit: int = MAX_QUOTE_CHARS) -> str:
    """`text` on one line, cut to `limit` characters (for messages built from other messages)."""
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 3] + "..."


def check_finite_tree(data: Any, where: str) -> None:
    """SpecError naming the path of the first NaN or infinite float in a parsed document."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, _Refused):
            raise SpecError(f"{where}: {quote_text(path or '(document)', 80)}: {v!r} {v.reason}")
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecError(f"{where}: {quote_text(path or '(document)', 80)}: {v} is not a finite number; "
                            "give a finite value")
        if isinstance(v, dict):
            stack.extend((x, f"{path}.{k}" if path else str(k)) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{path}.{i}" if path else str(i)) for i, x in enumerate(v))


# ---------------------------------------------------------------------------------------------
# Documents
# ---------------------------------------------------------------------------------------------


def parse_document(data: bytes | str, where: str, json_only: bool = False,
                   max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """Parse a YAML or JSON document (JSON when `json_only`); every bound of this module applies."""
    if json_only:
        return parse_json(data, where, max_bytes=max_bytes)
    if len(data) > max_bytes:
        raise SpecError(f"{where}: {len(data):,} bytes is over the {max_bytes:,}-byte limit")
    text = decode_text(data, where, "YAML") if isinstance(data, (bytes, bytearray)) else data
    return parse_yaml(text, where)


def read_document(path: str | Path, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """Read and parse a YAML or JSON file (`.json` parsed as strict JSON) with every bound applied."""
    p = Path(path)
    data = read_bytes(p, max_bytes, "spec file")
    return parse_document(data, str(p), json_only=p.suffix.lower() == ".json", max_bytes=max_bytes)


# ---------------------------------------------------------------------------------------------
# Values read outside a spec
# ---------------------------------------------------------------------------------------------


def finite(value: Any, field: str, minimum: float | None = None, maximum: float | None = None,
           strictly_positive: bool = False) -> float:
    """`value` as a finite float within bounds (bools and strings refused); SpecError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{field}: expected a number, got {quote(value)}")
    try:
        x = float(value)
    except OverflowError:
        raise SpecError(f"{field}: {quote(value)} is too large; give a finite number") from None
    if not math.isfinite(x):
        raise SpecError(f"{field}: {quote(value)} is not a finite number; give a finite value")
    if strictly_positive and x <= 0:
        raise SpecError(f"{field}: must be greater than 0, got {quote(value)}")
    why = out_of_bounds(x, minimum, maximum, "g")
    if why:
        raise SpecError(f"{field}: {why}, got {quote(value)}")
    return x


def whole(value: Any, field: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int within bounds: a real int, not a bool, float or numeric string."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{field}: expected a whole number, got {quote(value)}")
    why = out_of_bounds(value, minimum, maximum, ",", " (see docs/errors.md for limits)")
    if why:
        raise SpecError(f"{field}: {why}, got {quote(value)}")
    return value


def out_of_bounds(value: float, minimum: float | None, maximum: float | None, fmt: str, max_note: str = "") -> str:
    """Which bound `value` breaks ("must be at least 1", bounds written with format `fmt`), or ""."""
    if minimum is not None and value < minimum:
        return f"must be at least {minimum:{fmt}}"
    if maximum is not None and value > maximum:
        return f"must be at most {maximum:{fmt}}{max_note}"
    return ""
