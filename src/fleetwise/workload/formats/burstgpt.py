"""BurstGPT traces: CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`.

Timestamps are seconds. BurstGPT's README says failed requests are the rows whose `Response
tokens` are 0 (its `*_without_fails` files drop them); those rows are skipped and counted in
`TraceTable.skipped_failed`.
"""

from __future__ import annotations

from pathlib import Path

from fleetwise.workload.formats import trace_format
from fleetwise.workload.parse import TraceTable, float_column, int_column, read_csv

COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


@trace_format("burstgpt", COLUMNS)
def read(p: Path) -> TraceTable:
    """A BurstGPT trace as columns, failed rows skipped, arrivals in seconds from the first."""
    cols, lines = read_csv(p, COLUMNS, "burstgpt")
    t = float_column(p, "Timestamp", cols["Timestamp"], lines)
    prompt = int_column(p, "Request tokens", cols["Request tokens"], lines)
    out = int_column(p, "Response tokens", cols["Response tokens"], lines)
    ok = out > 0  # BurstGPT marks failed requests with 0 response tokens
    t = t[ok]
    return TraceTable(str(p), "burstgpt", t - (t.min() if len(t) else 0.0), prompt[ok], out[ok],
                      skipped_failed=int((~ok).sum()))
