"""Trace loaders (Azure, Mooncake, BurstGPT, length statistics) and the trace summary reports use.

Owns reading request traces by their own column or field names, turning them into
`fleetwise.core.request.Request`s with arrivals starting at 0, and `trace_stats`. Does not
synthesise workloads (`fleetwise.workload.generate` does, and calls `read_trace` for `trace`
arrivals and `read_length_stats` for `empirical` lengths).

Formats are registered, one module each, in `fleetwise.workload.formats` (Azure, BurstGPT,
length statistics, Mooncake); the format is detected from the header line unless `format=` names
it. Any other CSV or JSONL is read through a column mapping (`columns=TraceColumns(...)`, the CLI's
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
from fleetwise.spec.limits import MAX_DURATION_S
from fleetwise.workload.formats import COLUMNS_HINT, TRACE_FORMATS, get_format, supported
from fleetwise.workload.formats.mooncake import MOONCAKE_BLOCK_TOKENS
from fleetwise.workload.parse import TraceTable, check_path, header_names

if TYPE_CHECKING:
    from fleetwise.spec.workload import TraceColumns

GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of a gzip file (RFC 1952, section 2.3.1)."""


def detect_format(path: str | Path) -> str:
    """The first registered format whose needed columns the file's header has; SpecError naming what it found."""
    p = check_path(path)
    is_json, names = header_names(p)
    for fmt in TRACE_FORMATS.values():
        if fmt.json == is_json and set(fmt.columns) <= set(names):
            return fmt.name
    found = repr(names) if len(repr(names)) <= 100 else repr(names)[:97] + "..."
    raise SpecError(  # the fix before the list of formats: the CLI cuts an error at one terminal line
        f"{p}: unknown trace format (found {'fields' if is_json else 'columns'} {found}); {COLUMNS_HINT}; "
        f"or a registered format (format=), with the columns it needs: {supported()}"
    )


def read_trace(path: str | Path, format: str | None = None, columns: TraceColumns | None = None) -> TraceTable:
    """Read a trace file as columns, sorted by arrival (stable), arrivals relative to the first;
    `columns` maps a file's own column names (see `fleetwise.workload.columns`)."""
    p = check_path(path)
    reader = get_format(format).read if format is not None else None
    try:
        if columns is not None:
            from fleetwise.workload.columns import read_mapped

            table = read_mapped(p, columns)
        else:
            table = (reader or TRACE_FORMATS[detect_format(p)].read)(p)
    except UnicodeDecodeError as err:
        with p.open("rb") as f:
            if f.read(2) == GZIP_MAGIC:
                raise SpecError(f"{p}: gzip-compressed; a trace is UTF-8 text (CSV or JSONL): decompress it first "
                                f"(gunzip {p})") from None
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
        fmt = TRACE_FORMATS.get(table.format)
        column = fmt.columns[0] if fmt is not None and fmt.columns else "arrival time"
        raise SpecError(f"{table.path}: row {i + 1}: {column} arrives {float(t[i] - t.min()):.3g} s after the first; a trace "
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
    rate_field: str | None = None,
) -> TraceTable:
    """Slice and rescale a trace: drop arrivals before `start_s`, keep `max_requests`, start at 0.

    `rate_rps` rescales so the mean inter-arrival time is 1/rate_rps, i.e. (n-1)/span = rate;
    it excludes `time_scale`. Length statistics have no timestamps: they get Poisson arrivals at
    `rate_rps` from the seed's `trace.arrivals` stream. `rate_field` is how errors name the rate
    (default `rate_rps=<rate_rps>`; the planner rescales through a unit rate but names its spec's).
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
            raise SpecError(f"{table.path}: {rate_field or f'rate_rps={rate_rps}'}: the kept requests all arrive at the same "
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


def check_run_span(reqs: list[Request]) -> list[Request]:
    """`reqs` (sorted by arrival, from 0); SpecError when they span more than `MAX_DURATION_S`:
    each gap is bounded, not their sum (a rate of 1e-9 req/s, a trace stretched 1000x)."""
    if reqs and reqs[-1].arrival_s > MAX_DURATION_S:
        raise SpecError(f"arrival: the {len(reqs)} requests span {reqs[-1].arrival_s:.3g} s, more than a run may "
                        f"({MAX_DURATION_S:.3g} s, one year); raise the rate (arrival.rate_rps, --rate) or lower the "
                        "time scale (time_scale, --arrival-stretch), or keep fewer requests")
    return reqs


def load_trace(
    path: str | Path,
    format: str | None = None,
    time_scale: float = 1.0,
    rate_rps: float | None = None,
    max_requests: int | None = None,
    seed: int = 0,
    start_s: float = 0.0,
    columns: TraceColumns | None = None,
    notes: list[str] | None = None,
) -> list[Request]:
    """Load a trace as `Request`s sorted by arrival, arrivals starting at 0 (see `replay_arrivals`);
    `notes`, when given, gets what reading decided that the file does not state (`TraceTable.note`)."""
    table = replay_arrivals(read_trace(path, format, columns), time_scale=time_scale, rate_rps=rate_rps,
                            start_s=start_s, max_requests=max_requests, seed=seed)
    if notes is not None and table.note:
        notes.append(table.note)
    return check_run_span(to_requests(table))


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
