"""`verify`: check a ledger against a run's request records (what the clients saw).

A run's records are a CSV (the simulator's `requests.csv`, a gateway's request log) or JSON
Lines, one request attempt per row, with columns `request_id` (required), `tenant` (default
`default`), `idempotency_key` (default: the request id), `prompt_tokens`, the generated tokens
delivered (`delivered_tokens` or `tokens_generated`) and how it ended (`status`, or `failure`:
empty = completed). Rules, per (tenant, key):
- some attempt completed: exactly one usage row, and it is `completed`;
- a `completed` row was written by an attempt of its key and bills exactly the prompt and the
  generated tokens that attempt delivered. That attempt is usually one the client saw complete;
  it may also be one cut by a gateway crash after its last token and its usage commit but before
  its end-of-stream marker (the record then shows every billed token delivered);
- no attempt completed and no such row: nothing billed;
- a row whose key is in no record is reported as unknown.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetwise.errors import SpecError
from fleetwise.ledger.usage import LedgerRow
from fleetwise.spec.inputs import parse_json_line, read_text


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One request attempt as the run saw it."""

    request_id: str
    idempotency_key: str
    tenant: str
    prompt_tokens: int | None
    delivered_tokens: int | None
    completed: bool


@dataclass
class VerifyReport:
    """Outcome of `verify`: counts and one line per problem."""

    records: int = 0
    keys: int = 0
    completed_keys: int = 0
    rows: int = 0
    problems: list[dict[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "records": self.records, "keys": self.keys, "completed_keys": self.completed_keys,
                "rows": self.rows, "problems": self.problems}


def verify(rows: Sequence[LedgerRow], records: Sequence[RunRecord]) -> VerifyReport:
    """Compare ledger `rows` with a run's `records` (rules in the module docstring)."""
    rep = VerifyReport(records=len(records), rows=len(rows))
    by_key: dict[tuple[str, str], list[RunRecord]] = {}
    for r in records:
        by_key.setdefault((r.tenant, r.idempotency_key), []).append(r)
    ledger = {(r.tenant, r.idempotency_key): r for r in rows}
    rep.keys = len(by_key)

    def problem(key: tuple[str, str], what: str) -> None:
        rep.problems.append({"tenant": key[0], "idempotency_key": key[1], "problem": what})

    for key, attempts in by_key.items():
        done = [a for a in attempts if a.completed]
        row = ledger.get(key)
        rep.completed_keys += bool(done)
        if row is None or row.status != "completed":
            if done:
                state = "has no ledger row" if row is None else f"but the ledger row says {row.status}"
                problem(key, f"completed ({done[0].request_id}) {state}")
            continue
        writer = next((a for a in attempts if a.request_id == row.request_id), None)
        if writer is None:
            problem(key, f"ledger row written by {row.request_id}, which is not an attempt of this key")
            continue
        if writer.prompt_tokens is not None and writer.prompt_tokens != row.prompt_tokens:
            problem(key, f"prompt_tokens {row.prompt_tokens} in the ledger, {writer.prompt_tokens} in the run")
        if writer.delivered_tokens is not None and writer.delivered_tokens != row.delivered_tokens:
            problem(key, f"delivered_tokens {row.delivered_tokens} in the ledger, {writer.delivered_tokens} in the run")
        elif not writer.completed and writer.delivered_tokens is None:
            problem(key, f"billed as completed by {row.request_id}, but no attempt completed in the run")
    for key in sorted(set(ledger) - set(by_key)):
        problem(key, f"ledger row ({ledger[key].request_id}) for a key the run never sent")
    return rep


# ---- reading a run's records ------------------------------------------------------------------------
MAX_RECORDS_BYTES = 4 * 1024**3
"""Largest records file `load_run_records` reads (held in memory): ~20M request rows of ~200 bytes."""


def load_run_records(path: str | Path) -> list[RunRecord]:
    """Read a run's request records from CSV or JSON Lines (columns in the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"records file {str(p)!r} not found; pass a run's requests.csv or request log")
    text = read_text(p, MAX_RECORDS_BYTES, "records file")  # UTF-8, bounded; a binary file is one line
    if p.suffix in (".jsonl", ".ndjson"):
        rows: list[dict[str, Any]] = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            obj = parse_json_line(line, f"{p}:{n}")
            if not isinstance(obj, dict):
                raise SpecError(f"{p}:{n}: expected a JSON object, got {type(obj).__name__}")
            rows.append(obj)
    else:
        try:
            rows = list(csv.DictReader(io.StringIO(text, newline="")))
        except csv.Error as err:
            raise SpecError(f"{p}: not a CSV file ({err}); pass a run's requests.csv") from None
    return [_record(row, f"{p}:{n}") for n, row in enumerate(rows, 2 if p.suffix == ".csv" else 1)]


def _record(row: dict[str, Any], where: str) -> RunRecord:
    rid = row.get("request_id")
    if rid is None or str(rid) == "":
        raise SpecError(f"{where}: column request_id is missing or empty; every record needs its request id")
    key = row.get("idempotency_key") or str(rid)
    if "status" in row and row["status"] not in (None, ""):
        completed = str(row["status"]) == "completed"
    elif "failure" in row:
        completed = row["failure"] in (None, "")
    else:
        raise SpecError(f"{where}: neither a status nor a failure column; add status=completed|cancelled|failed")
    delivered = row.get("delivered_tokens", row.get("tokens_generated"))
    return RunRecord(str(rid), str(key), str(row.get("tenant") or "default"),
                     _int(row.get("prompt_tokens"), "prompt_tokens", where),
                     _int(delivered, "delivered_tokens", where), completed)


def _int(value: Any, name: str, where: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SpecError(f"{where}: {name}={value!r} is not an integer token count") from None
