"""Reading trace files: the shared column parsers every trace format and `--trace-columns` use.

Owns `TraceTable` (a trace as numpy columns), finding a file and its header, reading named CSV
columns with their line numbers, and parsing token counts, seconds and timestamps with errors
that name the file, the line, the column and the value. Does not know any format's columns
(each format in `fleetwise.workload.formats` does).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fleetwise.errors import SpecError, quote
from fleetwise.spec.inputs import parse_json_line, whole
from fleetwise.spec.limits import MAX_TOKENS


@dataclass(frozen=True, slots=True)
class TraceTable:
    """A trace as columns, in arrival order. `arrival_s` is None for length statistics."""

    path: str
    format: str
    arrival_s: np.ndarray | None
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: list[tuple[int, ...]] | None = None
    skipped_failed: int = 0
    note: str = ""
    """What reading decided that the file does not state (the unit of epoch arrivals); "" when nothing."""

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def take(self, idx: np.ndarray) -> TraceTable:
        """Rows `idx`, in that order."""
        return replace(
            self,
            arrival_s=None if self.arrival_s is None else self.arrival_s[idx],
            prompt_tokens=self.prompt_tokens[idx],
            output_tokens=self.output_tokens[idx],
            hash_ids=None if self.hash_ids is None else [self.hash_ids[i] for i in idx.tolist()],
        )



# ---------------------------------------------------------------------------------------------
# Files and headers
# ---------------------------------------------------------------------------------------------


def first_line(p: Path) -> str:
    """The first non-blank line of a UTF-8 text file, stripped; SpecError when there is none."""
    with p.open(encoding="utf-8-sig") as f:
        for line in f:
            if line.strip():
                return line.strip()
    raise SpecError(f"{p}: the file is empty; expected a trace with a header line")


def header_names(p: Path) -> tuple[bool, list[str]]:
    """(is_json, column or field names) of the first line."""
    line = first_line(p)
    if line.startswith("{"):
        first = parse_json_line(line, f"{p}:1")
        return True, [str(k) for k in first] if isinstance(first, dict) else []
    return False, [c.strip() for c in next(csv.reader([line]))]


def check_path(path: str | Path) -> Path:
    """`path` as a Path; SpecError when it is not a file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: trace file not found; check the path")
    return p


# ---------------------------------------------------------------------------------------------
# Columns
# ---------------------------------------------------------------------------------------------


def int_column(p: Path, name: str, values: list[str], lines: list[int]) -> np.ndarray:
    """Parse non-negative integer tokens counts (`"12"` or `"12.0"`), naming file:line on a bad one."""
    try:
        a = np.asarray(values, dtype=np.float64)
        ok = np.isfinite(a) & (a >= 0) & (a <= MAX_TOKENS) & (a == np.floor(a))
    except ValueError:
        a, ok = None, None
    if a is None or ok is None or not ok.all():
        for v, ln in zip(values, lines, strict=True):
            try:
                x = float(v)
                good = 0 <= x <= MAX_TOKENS and x == int(x)
            except (ValueError, OverflowError):
                good = False
            if not good:
                raise SpecError(f"{p}:{ln}: column {name!r} must be a non-negative integer, got {quote(v)} "
                                f"(at most {MAX_TOKENS:,})")
    assert a is not None
    return a.astype(np.int64)


def float_column(p: Path, name: str, values: list[str], lines: list[int]) -> np.ndarray:
    """Parse finite numbers (seconds), naming file:line on a bad one."""
    try:
        a = np.asarray(values, dtype=np.float64)
        if np.isfinite(a).all():
            return a
    except ValueError:
        pass
    for v, ln in zip(values, lines, strict=True):
        try:
            if np.isfinite(float(v)):
                continue
        except ValueError:
            pass
        raise SpecError(f"{p}:{ln}: column {name!r} must be a number of seconds, got {v!r}")
    raise AssertionError("unreachable")


UTC_OFFSET_FORM = "+HH:MM"
"""The ISO 8601 offset suffix `split_offset` removes (its length: 6 characters)."""


def split_offset(s: str) -> tuple[str, int]:
    """A timestamp without its trailing `Z` or UTC offset (`+HH:MM`), and that offset in minutes
    east of UTC (0 for `Z` or none)."""
    s = s.strip()
    if s.endswith("Z"):
        return s[:-1], 0
    n = len(UTC_OFFSET_FORM)
    if len(s) > n and s[-n] in "+-" and s[-3] == ":":  # `+HH:MM`: sign 6 from the end, colon 3
        hh, mm = s[-n + 1:-3], s[-2:]
        if hh.isdigit() and mm.isdigit():
            return s[:-n], (1 if s[-n] == "+" else -1) * (int(hh) * 60 + int(mm))
        return s[:-n], 0
    return s, 0


def datetime_column(p: Path, name: str, values: list[str], lines: list[int]) -> np.ndarray:
    """Seconds since the earliest timestamp, exact to the nanosecond (datetime64[ns]); a trailing
    UTC offset counts (a local-time log across a daylight-saving change keeps its true gaps)."""
    offset_ns = None
    if values and values[0].strip() != split_offset(values[0])[0]:
        split = [split_offset(v) for v in values]
        values = [v for v, _ in split]
        offset_ns = np.array([m for _, m in split], dtype=np.int64) * 60_000_000_000
    try:
        check_dates(p, name, values, lines)
        ns = np.asarray(values, dtype="datetime64[ns]").astype(np.int64)
        if offset_ns is not None and offset_ns.any():
            ns = ns - offset_ns
    except ValueError:
        for v, ln in zip(values, lines, strict=True):
            try:
                np.datetime64(v, "ns")
            except ValueError:
                raise SpecError(
                    f"{p}:{ln}: column {name!r} must be a timestamp like 2023-11-16 18:17:03.9799600, got {v!r}"
                ) from None
        raise
    if len(ns) == 0:
        return np.zeros(0)
    return (ns - ns.min()).astype(np.float64) / 1e9


TRACE_DATES = (np.datetime64("1970-01-01"), np.datetime64("2200-01-01"))
"""Timestamps a trace may hold: datetime64[ns] wraps outside 1678..2262 (year 2300 would read as
1715 and reorder every row), and no request log predates 1970 or is dated past 2200."""


def check_dates(p: Path, name: str, values: list[str], lines: list[int]) -> None:
    """SpecError naming the first row whose timestamp is missing (NaT) or outside `TRACE_DATES`."""
    us = np.asarray(values, dtype="datetime64[us]")
    bad = np.isnat(us) | (us < TRACE_DATES[0]) | (us >= TRACE_DATES[1])
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SpecError(f"{p}:{lines[i]}: column {name!r}: {quote(values[i])} is not a date between "
                        f"{TRACE_DATES[0]} and {TRACE_DATES[1]}; fix or drop the row")


def read_csv(p: Path, needed: tuple[str, ...], fmt: str) -> tuple[dict[str, list[str]], list[int]]:
    """The needed columns as string lists, and each row's 1-based file line number."""
    with p.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        header = [c.strip() for c in next(reader, [])]
        missing = [c for c in needed if c not in header]
        if missing:
            raise SpecError(f"{p}: format {fmt} needs columns {list(needed)}; found {header}; missing {missing}")
        idx = [header.index(c) for c in needed]
        width = max(idx) + 1
        cols: list[list[str]] = [[] for _ in needed]
        lines: list[int] = []
        for row in reader:
            if not row:
                continue
            if len(row) < width:
                raise SpecError(f"{p}:{reader.line_num}: expected {len(header)} columns {header}, got {row}")
            for c, i in zip(cols, idx, strict=True):
                c.append(row[i])
            lines.append(reader.line_num)
    return dict(zip(needed, cols, strict=True)), lines


def whole_tokens(value: object, field: str) -> int:
    """A token count: a JSON integer (or an integral float such as 12.0) in [0, MAX_TOKENS]."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return whole(value, field, minimum=0, maximum=MAX_TOKENS)


