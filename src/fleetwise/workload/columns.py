"""Traces with their own column names: a mapping `arrival=...,prompt=...,output=...` onto a CSV
header or JSONL fields.

Arrivals may be seconds (any numbers: the first arrival becomes 0) or timestamps
(`2024-05-01 12:00:03.25`, ISO 8601, a trailing `Z` or UTC offset ignored), detected from the
values. Token counts must be non-negative integers. Errors name the file, the line, the column
and the fix, like the built-in formats'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleetwise.errors import SpecError, quote
from fleetwise.workload.parse import (
    TraceTable,
    check_path,
    datetime_column,
    float_column,
    header_names,
    int_column,
    read_csv,
)

ROLES = ("arrival", "prompt", "output")
"""What a mapping names: the arrival time, the prompt length and the output length columns."""
EXAMPLE = "arrival=ts,prompt=input_tokens,output=output_tokens"


@dataclass(frozen=True)
class ColumnMap:
    """Which of a trace's columns (or JSON fields) hold the arrival, prompt and output."""

    arrival: str
    prompt: str
    output: str

    @staticmethod
    def parse(text: str, flag: str = "--trace-columns") -> ColumnMap:
        """From `arrival=NAME,prompt=NAME,output=NAME` (any order)."""
        found: dict[str, str] = {}
        for part in text.split(","):
            key, sep, name = part.partition("=")
            key, name = key.strip(), name.strip()
            if not sep or key not in ROLES or not name:
                raise SpecError(f"{flag}={quote(text)}: expected {','.join(r + '=COLUMN' for r in ROLES)}, "
                                f"e.g. {flag} {EXAMPLE}")
            if key in found:
                raise SpecError(f"{flag}={quote(text)}: {key} is given twice")
            found[key] = name
        missing = [r for r in ROLES if r not in found]
        if missing:
            raise SpecError(f"{flag}={quote(text)}: missing {', '.join(missing)}; e.g. {flag} {EXAMPLE}")
        return ColumnMap(found["arrival"], found["prompt"], found["output"])

    def names(self) -> tuple[str, str, str]:
        """(arrival, prompt, output) column names, in that order."""
        return self.arrival, self.prompt, self.output


def _read_jsonl(p: Path, cols: ColumnMap) -> tuple[dict[str, list[str]], list[int]]:
    out: dict[str, list[str]] = {c: [] for c in cols.names()}
    lines: list[int] = []
    with p.open(encoding="utf-8-sig") as f:
        for ln, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise SpecError(f"{p}:{ln}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise SpecError(f"{p}:{ln}: expected a JSON object per line, got {quote(line.strip())}")
            for c in cols.names():
                if c not in row:
                    raise SpecError(f"{p}:{ln}: field {quote(c)} missing (--trace-columns maps it); "
                                    f"fields here: {quote(sorted(row))}")
                out[c].append(str(row[c]))
            lines.append(ln)
    return out, lines


def _arrivals(p: Path, name: str, values: list[str], lines: list[int]) -> np.ndarray:
    """Seconds from the first arrival: numbers are seconds, anything else must be a timestamp."""
    try:
        np.asarray(values, dtype=np.float64)
    except ValueError:
        return datetime_column(p, name, values, lines)
    t = float_column(p, name, values, lines)  # names the line of a NaN or inf
    return t - (t.min() if len(t) else 0.0)


def read_mapped(path: str | Path, cols: ColumnMap) -> TraceTable:
    """A CSV or JSONL trace read through `cols` (arrivals from 0, rows in file order)."""
    p = check_path(path)
    is_json, _names = header_names(p)
    if is_json:
        raw, lines = _read_jsonl(p, cols)
    else:
        raw, lines = read_csv(p, cols.names(), f"--trace-columns {cols.arrival},{cols.prompt},{cols.output}")
    return TraceTable(
        str(p), "columns",
        _arrivals(p, cols.arrival, raw[cols.arrival], lines),
        int_column(p, cols.prompt, raw[cols.prompt], lines),
        int_column(p, cols.output, raw[cols.output], lines),
    )
