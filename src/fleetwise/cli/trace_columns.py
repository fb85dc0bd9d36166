"""`--trace-columns arrival=C,prompt=C,output=C[,arrival_unit=U]`: read a trace in no registered format by its own
column (CSV) or field (JSONL) names, on every command that reads a trace (`simulate`, `plan`,
`scenarios`). The mapping is the trace arrival's `columns` (`spec.workload.TraceColumns`).
"""

from __future__ import annotations

import argparse

from fleetwise.errors import SpecError
from fleetwise.spec.workload import TRACE_COLUMNS_EXAMPLE, TraceArrival, TraceColumns

FLAG = "--trace-columns"


def add_flag(p: argparse.ArgumentParser, applies: str) -> None:
    """Add `--trace-columns`; `applies` says to which trace (`with --trace`, ...)."""
    p.add_argument(FLAG, default=None, metavar="arrival=C,prompt=C,output=C[,arrival_unit=U]",
                   help=f"{applies}: the trace file's own column (CSV) or field (JSONL) names, e.g. "
                        f"{TRACE_COLUMNS_EXAMPLE}; arrivals as timestamps or numbers: epoch times in the unit "
                        "their magnitude gives, other numbers in seconds unless arrival_unit=ms|us|ns says otherwise")


def parse(text: str | None) -> TraceColumns | None:
    """The mapping the flag gives (None without the flag); one-line SpecError on a bad one."""
    return TraceColumns.parse(text, FLAG) if text else None


def apply(arrival: object, columns: TraceColumns, where: str) -> TraceArrival:
    """`arrival` (a trace arrival) reading its file through `columns`; SpecError naming `where`
    when it replays no trace."""
    if not isinstance(arrival, TraceArrival):
        kind = getattr(arrival, "kind", type(arrival).__name__)
        raise SpecError(f"{FLAG}: {where} has a {kind} arrival, not a trace; the mapping applies to a trace "
                        "arrival (arrival: {kind: trace, path: FILE})")
    return arrival.model_copy(update={"columns": columns, "format": None})
