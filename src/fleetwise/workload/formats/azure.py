"""Azure LLM inference traces (2023 and 2024): CSV `TIMESTAMP,ContextTokens,GeneratedTokens`.

Timestamps such as `2023-11-16 18:17:03.9799600` are parsed by numpy's datetime64[ns], so
exactly (the 7 fractional digits are 100 ns ticks); a trailing UTC offset (`+00:00`) is applied.
"""

from __future__ import annotations

from pathlib import Path

from fleetwise.workload.formats import trace_format
from fleetwise.workload.parse import TraceTable, datetime_column, int_column, read_csv

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@trace_format("azure", COLUMNS)
def read(p: Path) -> TraceTable:
    """An Azure trace as columns, arrivals in seconds from the earliest timestamp."""
    cols, lines = read_csv(p, COLUMNS, "azure")
    return TraceTable(
        str(p), "azure",
        datetime_column(p, "TIMESTAMP", cols["TIMESTAMP"], lines),
        int_column(p, "ContextTokens", cols["ContextTokens"], lines),
        int_column(p, "GeneratedTokens", cols["GeneratedTokens"], lines),
    )
