"""Length statistics (sarathi-serve/Vidur): CSV `num_prefill_tokens,num_decode_tokens,...`.

No timestamps: replaying one needs `rate_rps`, and arrivals are then Poisson from the seed.
"""

from __future__ import annotations

from pathlib import Path

from fleetwise.workload.formats import trace_format
from fleetwise.workload.parse import TraceTable, int_column, read_csv

COLUMNS = ("num_prefill_tokens", "num_decode_tokens")


@trace_format("length_stats", COLUMNS)
def read(p: Path) -> TraceTable:
    """A length-statistics file as columns, without arrivals."""
    cols, lines = read_csv(p, COLUMNS, "length_stats")
    return TraceTable(
        str(p), "length_stats", None,
        int_column(p, "num_prefill_tokens", cols["num_prefill_tokens"], lines),
        int_column(p, "num_decode_tokens", cols["num_decode_tokens"], lines),
    )
