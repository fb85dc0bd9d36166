"""Mooncake traces: JSONL rows `{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}`.

`hash_ids` become `Request.block_hashes`, one per `MOONCAKE_BLOCK_TOKENS` tokens (chained: an
equal id at position i means equal first i+1 blocks).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fleetwise.errors import SpecError, quote
from fleetwise.spec.inputs import finite, parse_json_line, whole
from fleetwise.workload.formats import trace_format
from fleetwise.workload.parse import TraceTable, whole_tokens

COLUMNS = ("timestamp", "input_length", "output_length")

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per `hash_ids` block (Mooncake's trace README: one hash id per 512-token block)."""


def _mooncake_row(p: Path, ln: int, line: str) -> tuple[float, int, int, tuple[int, ...]]:
    """One row, types as Mooncake writes them: no string, bool or fractional value is coerced."""
    where = f"{p}:{ln}"
    d = parse_json_line(line, where)
    if not isinstance(d, dict):
        raise SpecError(f"{where}: expected a JSON object per line, got {quote(d)}")
    missing = [k for k in COLUMNS if k not in d]
    if missing:
        raise SpecError(f"{where}: missing field {missing[0]!r}; mooncake rows need {list(COLUMNS)}"
                        " and optionally hash_ids")
    t = finite(d["timestamp"], f"{where}: timestamp", minimum=0.0)
    i, o = (whole_tokens(d[k], f"{where}: {k}") for k in ("input_length", "output_length"))
    raw = d.get("hash_ids", [])
    if not isinstance(raw, list):
        raise SpecError(f"{where}: hash_ids must be a list of integers, got {quote(raw)}")
    hashes = tuple(whole(h, f"{where}: hash_ids[{k}]") for k, h in enumerate(raw))
    return t, i, o, hashes


@trace_format("mooncake", COLUMNS, json=True)
def read(p: Path) -> TraceTable:
    """A Mooncake trace as columns, arrivals in seconds from the first, `hash_ids` per row."""
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
