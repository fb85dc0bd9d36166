"""Traces with their own column names: a mapping `arrival=...,prompt=...,output=...` onto a CSV
header or JSONL fields (the mapping is `spec.workload.TraceColumns`, a trace arrival's `columns`).

Arrivals may be numbers or timestamps (`2024-05-01 12:00:03.25`, ISO 8601, a trailing `Z` or UTC
offset applied), detected from the values; the first arrival becomes 0. Numbers are in the
mapping's `arrival_unit`; left `auto`, epoch times are read in the one unit (s, ms, us, ns) in
which every value falls in `EPOCH_YEARS` (the ranges do not overlap, so this is unambiguous), and
other numbers are seconds, unless they then span more than `MAX_DURATION_S`: such a column may
as well be milliseconds, and the error asks for the unit. Token counts must be non-negative integers. Errors name the file, the line, the column
and the fix, like the built-in formats'.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fleetwise.errors import SpecError, quote
from fleetwise.spec.limits import MAX_DURATION_S
from fleetwise.spec.workload import ARRIVAL_UNITS, TraceColumns
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


EPOCH_YEARS = (946_684_800.0, 4_102_444_800.0)
"""Epoch seconds of 2000-01-01 and 2100-01-01 UTC: numeric arrivals all within this range, in one
of the `ARRIVAL_UNITS`, are epoch times in that unit."""


def _epoch_unit(p: Path, name: str, t: np.ndarray, lines: list[int]) -> str | None:
    """The unit every value of `t` is an epoch time in (None: not all epoch times in one unit)."""
    units = np.full(len(t), "", dtype=object)
    for unit, scale in ARRIVAL_UNITS.items():
        units[(t * scale >= EPOCH_YEARS[0]) & (t * scale < EPOCH_YEARS[1])] = unit
    found = [u for u in ARRIVAL_UNITS if (units == u).any()]
    if len(found) > 1:
        a, b = (int(np.argmax(units == u)) for u in found[:2])
        first, other = sorted((a, b))
        raise SpecError(f"{p}: column {name!r} mixes epoch {units[first]} (line {lines[first]}) and epoch "
                        f"{units[other]} (line {lines[other]}); write every arrival in one unit")
    return found[0] if found and (units != "").all() else None


def _arrivals(p: Path, cols: TraceColumns, values: list[str], lines: list[int]) -> tuple[np.ndarray, str]:
    """Seconds from the first arrival, and the unit `auto` found when it is not seconds (else ""):
    numbers in the mapping's unit (`auto`: see the module docstring); anything else must be a timestamp."""
    name, unit = cols.arrival, cols.arrival_unit
    try:
        np.asarray(values, dtype=np.float64)
    except ValueError:
        if unit != "auto":
            raise SpecError(f"{p}: arrival_unit={unit} applies to numeric arrivals; column {name!r} holds timestamps "
                            f"(e.g. {values[0][:40]!r}): drop arrival_unit") from None
        return datetime_column(p, name, values, lines), ""
    t = float_column(p, name, values, lines)  # names the line of a NaN or inf
    read_as: str = unit
    if unit == "auto":
        read_as = _epoch_unit(p, name, t, lines) or "s"
    t = t - (t.min() if len(t) else 0.0)
    if unit == "auto" and read_as == "s":
        span = float(t.max()) if len(t) else 0.0
        if span > MAX_DURATION_S:
            raise SpecError(f"{p}: column {name!r} spans {span:.3g} in its own unit: over a year as seconds; give the "
                            f"unit: --trace-columns arrival={cols.arrival},prompt={cols.prompt},output={cols.output},arrival_unit=ms "
                            "(or us, ns; `arrival_unit` in a file's columns)")
    return t * ARRIVAL_UNITS[read_as], read_as if unit == "auto" and read_as != "s" else ""


def read_mapped(path: str | Path, cols: TraceColumns) -> TraceTable:
    """A CSV or JSONL trace read through `cols` (arrivals from 0, rows in file order)."""
    p = check_path(path)
    is_json, _names = header_names(p)
    if is_json:
        raw, lines = _read_jsonl(p, cols)
    else:
        raw, lines = read_csv(p, cols.names(), f"--trace-columns {cols.arrival},{cols.prompt},{cols.output}")
    arrival_s, found = _arrivals(p, cols, raw[cols.arrival], lines)
    note = (f"{p}: column {cols.arrival!r} read as epoch {found} (the magnitude of its values); give "
            "arrival_unit to read it otherwise") if found else ""
    return TraceTable(
        str(p), "columns",
        arrival_s,
        int_column(p, cols.prompt, raw[cols.prompt], lines),
        int_column(p, cols.output, raw[cols.output], lines),
        note=note,
    )
