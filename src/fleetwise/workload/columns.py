"""Traces with their own column names: a mapping `arrival=...,prompt=...,output=...` onto a CSV
header or JSONL fields (the mapping is `spec.workload.TraceColumns`, a trace arrival's `columns`).

Arrivals may be seconds (any numbers: the first arrival becomes 0) or timestamps
(`2024-05-01 12:00:03.25`, ISO 8601, a trailing `Z` or UTC offset applied), detected from the
values. Token counts must be non-negative integers. Errors name the file, the line, the column
and the fix, like the built-in formats'.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fleetwise.errors import SpecError, quote
from fleetwise.spec.workload import TraceColumns
from fleetwise.workload.parse import (
    TraceTable,
    check_path,
    datetime_column,
    float_column,
    header_names,
    int_column,
    read_csv,
)


def _read_jsonl(p: Path, cols: TraceColumns) -> tuple[dict[str, list[str]], list[int]]:
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


def read_mapped(path: str | Path, cols: TraceColumns) -> TraceTable:
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
