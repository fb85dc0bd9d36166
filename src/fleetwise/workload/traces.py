"""Trace loaders (Azure, Mooncake, BurstGPT, length statistics) and the trace summary reports use.

Owns reading request traces by their own column or field names, turning them into
`fleetwise.core.request.Request`s with arrivals starting at 0, and `trace_stats`. Does not
synthesise workloads (`fleetwise.workload.generate` does, and calls `read_trace` for `trace`
arrivals and `read_length_stats` for `empirical` lengths).

Formats (detected from the header line; `format=` overrides):
- `azure`: Azure LLM inference CSV (2023 and 2024), `TIMESTAMP,ContextTokens,GeneratedTokens`,
  timestamps `2023-11-16 18:17:03.9799600` parsed by numpy's datetime64[ns], so exactly (the 7
  fractional digits are 100 ns ticks). A trailing UTC offset (`+00:00`) is ignored.
- `mooncake`: JSONL, `{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}`;
  `hash_ids` become `block_hashes` (512 tokens per block).
- `burstgpt`: CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`,
  timestamps in seconds. BurstGPT's README says failed requests are the rows whose
  `Response tokens` are 0 (its `*_without_fails` files drop them); those rows are skipped and
  counted in `TraceTable.skipped_failed`.
- `length_stats`: `num_prefill_tokens,num_decode_tokens,...` (sarathi-serve/Vidur); no
  timestamps, so replay needs `rate_rps` and arrivals are Poisson from the seed.
- any other CSV or JSONL through a column mapping (`columns=ColumnMap(...)`, the CLI's
  `--trace-columns arrival=...,prompt=...,output=...`; `fleetwise.workload.columns`).
"""

from __future__ import annotations

import csv
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fleetwise.core.request import Request
from fleetwise.core.rng import RngStreams
from fleetwise.errors import SpecError, quote
from fleetwise.spec.inputs import MAX_DURATION_S, MAX_TOKENS, finite, parse_json_line, whole

if TYPE_CHECKING:
    from fleetwise.workload.columns import ColumnMap

FORMATS: dict[str, tuple[str, ...]] = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "mooncake": ("timestamp", "input_length", "output_length"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
    "length_stats": ("num_prefill_tokens", "num_decode_tokens"),
}
"""Format name -> the columns (JSON fields for mooncake) it needs."""

MOONCAKE_BLOCK_TOKENS = 512


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
# Format detection
# ---------------------------------------------------------------------------------------------


def _first_line(p: Path) -> str:
    with p.open(encoding="utf-8-sig") as f:
        for line in f:
            if line.strip():
                return line.strip()
    raise SpecError(f"{p}: the file is empty; expected a trace with a header line")


def _header_names(p: Path) -> tuple[bool, list[str]]:
    """(is_json, column or field names) of the first line."""
    line = _first_line(p)
    if line.startswith("{"):
        first = parse_json_line(line, f"{p}:1")
        return True, [str(k) for k in first] if isinstance(first, dict) else []
    return False, [c.strip() for c in next(csv.reader([line]))]


def _supported() -> str:
    return "; ".join(f"{k} ({', '.join(v)})" for k, v in FORMATS.items())


def detect_format(path: str | Path) -> str:
    """The format whose needed columns the file's header has; SpecError naming what it found."""
    p = _check_path(path)
    is_json, names = _header_names(p)
    candidates = ["mooncake"] if is_json else ["azure", "burstgpt", "length_stats"]
    for fmt in candidates:
        if set(FORMATS[fmt]) <= set(names):
            return fmt
    raise SpecError(
        f"{p}: unknown trace format; found {'fields' if is_json else 'columns'} {names}; "
        f"supported formats and the columns they need: {_supported()}; or pass format= explicitly, or map "
        "your own columns with --trace-columns arrival=COL,prompt=COL,output=COL (columns= in Python)"
    )


def _check_path(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: trace file not found; check the path (formats: {', '.join(FORMATS)})")
    return p


# ---------------------------------------------------------------------------------------------
# Column parsing
# ---------------------------------------------------------------------------------------------


def _int_column(p: Path, name: str, values: list[str], lines: list[int]) -> np.ndarray:
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


def _float_column(p: Path, name: str, values: list[str], lines: list[int]) -> np.ndarray:
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


def _strip_offset(s: str) -> str:
    s = s.strip()
    if s.endswith("Z"):
        return s[:-1]
    if len(s) > 6 and s[-6] in "+-" and s[-3] == ":":
        return s[:-6]
    return s


def _datetime_column(p: Path, name: str, values: list[str], lines: list[int]) -> np.ndarray:
    """Seconds since the earliest timestamp, exact to the nanosecond (datetime64[ns])."""
    if values and values[0].strip() != _strip_offset(values[0]):
        values = [_strip_offset(v) for v in values]
    try:
        _check_dates(p, name, values, lines)
        ns = np.asarray(values, dtype="datetime64[ns]").astype(np.int64)
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


def _check_dates(p: Path, name: str, values: list[str], lines: list[int]) -> None:
    """SpecError naming the first row whose timestamp is missing (NaT) or outside `TRACE_DATES`."""
    us = np.asarray(values, dtype="datetime64[us]")
    bad = np.isnat(us) | (us < TRACE_DATES[0]) | (us >= TRACE_DATES[1])
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SpecError(f"{p}:{lines[i]}: column {name!r}: {quote(values[i])} is not a date between "
                        f"{TRACE_DATES[0]} and {TRACE_DATES[1]}; fix or drop the row")


def _read_csv(p: Path, needed: tuple[str, ...], fmt: str) -> tuple[dict[str, list[str]], list[int]]:
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


# ---------------------------------------------------------------------------------------------
# Per-format readers
# ---------------------------------------------------------------------------------------------


def _read_azure(p: Path) -> TraceTable:
    cols, lines = _read_csv(p, FORMATS["azure"], "azure")
    return TraceTable(
        str(p), "azure",
        _datetime_column(p, "TIMESTAMP", cols["TIMESTAMP"], lines),
        _int_column(p, "ContextTokens", cols["ContextTokens"], lines),
        _int_column(p, "GeneratedTokens", cols["GeneratedTokens"], lines),
    )


def _read_burstgpt(p: Path) -> TraceTable:
    cols, lines = _read_csv(p, FORMATS["burstgpt"], "burstgpt")
    t = _float_column(p, "Timestamp", cols["Timestamp"], lines)
    prompt = _int_column(p, "Request tokens", cols["Request tokens"], lines)
    out = _int_column(p, "Response tokens", cols["Response tokens"], lines)
    ok = out > 0  # BurstGPT marks failed requests with 0 response tokens
    t = t[ok]
    return TraceTable(str(p), "burstgpt", t - (t.min() if len(t) else 0.0), prompt[ok], out[ok],
                      skipped_failed=int((~ok).sum()))


def _read_length_stats(p: Path) -> TraceTable:
    cols, lines = _read_csv(p, FORMATS["length_stats"], "length_stats")
    return TraceTable(
        str(p), "length_stats", None,
        _int_column(p, "num_prefill_tokens", cols["num_prefill_tokens"], lines),
        _int_column(p, "num_decode_tokens", cols["num_decode_tokens"], lines),
    )


def _mooncake_row(p: Path, ln: int, line: str) -> tuple[float, int, int, tuple[int, ...]]:
    """One row, types as Mooncake writes them: no string, bool or fractional value is coerced."""
    where = f"{p}:{ln}"
    d = parse_json_line(line, where)
    if not isinstance(d, dict):
        raise SpecError(f"{where}: expected a JSON object per line, got {quote(d)}")
    missing = [k for k in FORMATS["mooncake"] if k not in d]
    if missing:
        raise SpecError(f"{where}: missing field {missing[0]!r}; mooncake rows need {list(FORMATS['mooncake'])}"
                        " and optionally hash_ids")
    t = finite(d["timestamp"], f"{where}: timestamp", minimum=0.0)
    i, o = (_whole_tokens(d[k], f"{where}: {k}") for k in ("input_length", "output_length"))
    raw = d.get("hash_ids", [])
    if not isinstance(raw, list):
        raise SpecError(f"{where}: hash_ids must be a list of integers, got {quote(raw)}")
    hashes = tuple(whole(h, f"{where}: hash_ids[{k}]") for k, h in enumerate(raw))
    return t, i, o, hashes


def _whole_tokens(value: object, field: str) -> int:
    """A token count: a JSON integer (or an integral float such as 12.0) in [0, MAX_TOKENS]."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return whole(value, field, minimum=0, maximum=MAX_TOKENS)


def _read_mooncake(p: Path) -> TraceTable:
    rows = []
    with p.open(encoding="utf-8-sig") as f:
        for ln, line in enumerate(f, start=1):
            if line.strip():
                rows.append(_mooncake_row(p, ln, line))
    t = np.array([r[0] for r in rows], dtype=np.float64) / 1000.0
    return TraceTable(
        str(p), "mooncake", t - (t.min() if len(t) else 0.0),
        np.array([r[1] for r in rows], dtype=np.int64),
        np.array([r[2] for r in rows], dtype=np.int64),
        [r[3] for r in rows],
    )


_READERS = {"azure": _read_azure, "mooncake": _read_mooncake, "burstgpt": _read_burstgpt,
            "length_stats": _read_length_stats}


def read_trace(path: str | Path, format: str | None = None, columns: ColumnMap | None = None) -> TraceTable:
    """Read a trace file as columns, sorted by arrival (stable), arrivals relative to the first;
    `columns` maps a file's own column names (see `fleetwise.workload.columns`)."""
    p = _check_path(path)
    if format is not None and format not in _READERS:
        raise SpecError(f"format {format!r} is not a trace format; supported: {_supported()}")
    try:
        if columns is not None:
            from fleetwise.workload.columns import read_mapped

            table = read_mapped(p, columns)
        else:
            table = _READERS[format or detect_format(p)](p)
    except UnicodeDecodeError as err:
        raise SpecError(f"{p}: byte {err.object[err.start]:#04x} at offset {err.start} is not UTF-8; a trace is "
                        "UTF-8 text (CSV or JSONL)") from None
    except csv.Error as err:
        raise SpecError(f"{p}: not a readable CSV ({quote(str(err), 120)}); a trace is UTF-8 CSV or JSONL") from None
    _check_span(table)
    if table.arrival_s is not None:
        order = np.argsort(table.arrival_s, kind="stable")
        if (order != np.arange(len(order))).any():
            table = table.take(order)
    return table


def _check_span(table: TraceTable) -> None:
    """SpecError when the arrivals span more than `MAX_DURATION_S` (one stray timestamp far in the
    future would otherwise stretch the replay by centuries)."""
    t = table.arrival_s
    if t is not None and len(t) and float(t.max() - t.min()) > MAX_DURATION_S:
        i = int(np.argmax(t))
        raise SpecError(f"{table.path}: row {i + 1} arrives {float(t[i] - t.min()):.3g} s after the first; a trace "
                        f"may span at most {MAX_DURATION_S:.3g} s (one year); fix or drop the row")


def read_length_stats(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(input, output) token arrays of a length-statistics CSV (any trace file with lengths works)."""
    table = read_trace(path)
    return table.prompt_tokens, table.output_tokens


# ---------------------------------------------------------------------------------------------
# Replay: slice, rescale, convert
# ---------------------------------------------------------------------------------------------


def replay_arrivals(
    table: TraceTable,
    *,
    time_scale: float = 1.0,
    rate_rps: float | None = None,
    start_s: float = 0.0,
    max_requests: int | None = None,
    seed: int = 0,
) -> TraceTable:
    """Slice and rescale a trace: drop arrivals before `start_s`, keep `max_requests`, start at 0.

    `rate_rps` rescales so the mean inter-arrival time is 1/rate_rps, i.e. (n-1)/span = rate;
    it excludes `time_scale`. Length statistics have no timestamps: they get Poisson arrivals at
    `rate_rps` from the seed's `trace.arrivals` stream.
    """
    if rate_rps is not None and time_scale != 1.0:
        raise SpecError(f"give either time_scale ({time_scale}) or rate_rps ({rate_rps}), not both")
    if table.arrival_s is None:
        return _poisson_replay(table, rate_rps, max_requests, seed)
    keep = np.flatnonzero(table.arrival_s >= start_s)
    if max_requests is not None:
        keep = keep[:max_requests]
    table = table.take(keep)
    assert table.arrival_s is not None
    t = table.arrival_s - (table.arrival_s[0] if len(keep) else 0.0)
    if rate_rps is not None:
        span = float(t[-1]) if len(t) else 0.0
        if span <= 0:
            raise SpecError(f"{table.path}: rate_rps={rate_rps}: the kept requests all arrive at the same "
                            "time, so there is no rate to rescale; use time_scale or more requests")
        t = t * ((len(t) - 1) / (span * rate_rps))
    else:
        t = t * time_scale
    return replace(table, arrival_s=t)


def _poisson_replay(table: TraceTable, rate_rps: float | None, max_requests: int | None, seed: int) -> TraceTable:
    if rate_rps is None:
        raise SpecError(f"{table.path}: a {table.format} file has no timestamps; give rate_rps to replay it "
                        "with Poisson arrivals")
    n = len(table) if max_requests is None else min(len(table), max_requests)
    table = table.take(np.arange(n))
    gaps = RngStreams(seed).get("trace.arrivals").exponential(1.0 / rate_rps, size=max(n - 1, 0))
    return replace(table, arrival_s=np.concatenate([[0.0], np.cumsum(gaps)])[:n])


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building millions of acyclic records.

    Allocating a million `Request`s and tuples triggers a collection every few hundred
    allocations, each scanning everything built so far: pausing it halves generation time.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def to_requests(table: TraceTable, tenants: list[str] | None = None) -> list[Request]:
    """One `Request` per row (ids "0".."n-1"); the table must be in arrival order with arrivals set."""
    assert table.arrival_s is not None
    n = len(table)
    h = table.hash_ids or [()] * n
    with gc_paused():
        return list(map(Request, map(str, range(n)), table.arrival_s.tolist(), table.prompt_tokens.tolist(),
                        table.output_tokens.tolist(), h, [MOONCAKE_BLOCK_TOKENS] * n,
                        tenants or ["default"] * n))


def load_trace(
    path: str | Path,
    format: str | None = None,
    time_scale: float = 1.0,
    rate_rps: float | None = None,
    max_requests: int | None = None,
    seed: int = 0,
    start_s: float = 0.0,
    columns: ColumnMap | None = None,
) -> list[Request]:
    """Load a trace as `Request`s sorted by arrival, arrivals starting at 0 (see `replay_arrivals`)."""
    table = replay_arrivals(read_trace(path, format, columns), time_scale=time_scale, rate_rps=rate_rps,
                            start_s=start_s, max_requests=max_requests, seed=seed)
    return to_requests(table)


# ---------------------------------------------------------------------------------------------
# Stats
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceStats:
    """Summary of a request list. Percentiles use numpy's linear interpolation.

    rate_rps = (count-1)/duration_s (the inverse of the mean inter-arrival time);
    prefix_reuse_fraction = prompt tokens found in an unbounded prefix cache / all prompt tokens.
    """

    count: int
    duration_s: float
    rate_rps: float
    interarrival_cv: float
    input_p50: float
    input_p90: float
    input_p99: float
    output_p50: float
    output_p90: float
    output_p99: float
    prefix_reuse_fraction: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def prefix_reuse_fraction(requests: list[Request]) -> float:
    """Share of prompt tokens an unbounded prefix cache would serve, requests taken in list order.

    A request reuses its longest run of leading block ids seen before (chained ids: a seen id at
    position i means the first i+1 blocks are cached), counting min(blocks*block_tokens, prompt).
    """
    seen: set[int] = set()
    reused = total = 0
    for r in requests:
        k = 0
        for h in r.block_hashes:
            if h not in seen:
                break
            k += 1
        reused += min(k * r.hash_block_tokens, r.prompt_tokens)
        total += r.prompt_tokens
        seen.update(r.block_hashes)
    return reused / total if total else 0.0


def trace_stats(requests: list[Request]) -> TraceStats:
    """Count, duration, rate, inter-arrival CV, length percentiles and prefix reuse of `requests`."""
    n = len(requests)
    if n == 0:
        return TraceStats(0, 0.0, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0.0)
    t = np.sort(np.fromiter((r.arrival_s for r in requests), dtype=np.float64, count=n))
    inp = np.fromiter((r.prompt_tokens for r in requests), dtype=np.float64, count=n)
    out = np.fromiter((r.output_tokens for r in requests), dtype=np.float64, count=n)
    gaps = np.diff(t)
    duration = float(t[-1] - t[0])
    mean_gap = float(gaps.mean()) if len(gaps) else 0.0
    ip, op = np.percentile(inp, [50, 90, 99]), np.percentile(out, [50, 90, 99])
    return TraceStats(
        count=n,
        duration_s=duration,
        rate_rps=(n - 1) / duration if duration > 0 else 0.0,
        interarrival_cv=float(gaps.std() / mean_gap) if mean_gap > 0 else 0.0,
        input_p50=float(ip[0]), input_p90=float(ip[1]), input_p99=float(ip[2]),
        output_p50=float(op[0]), output_p90=float(op[1]), output_p99=float(op[2]),
        prefix_reuse_fraction=prefix_reuse_fraction(requests),
    )
