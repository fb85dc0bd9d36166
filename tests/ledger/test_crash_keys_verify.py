"""Crash safety (a writer SIGKILLed mid-stream), idempotency keys, `verify` against a run's records."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleetwise.errors import SpecError
from fleetwise.ledger import (
    IdempotencyKeyError,
    RunRecord,
    Usage,
    WorkItem,
    check_key,
    generate_key,
    idempotency_key,
    load_run_records,
    open_ledger,
    verify,
)

WRITER = textwrap.dedent("""
    import sys
    from fleetwise.ledger import Usage, WorkItem, open_ledger
    led = open_ledger(sys.argv[1])
    for i in range(100000):
        work = tuple(WorkItem("decode", "first", "decode", "decode-0", 1, 0.1) for _ in range(1 + i % 5))
        led.record(Usage(f"k{i}", f"r{i}", "acme", "m", "p", "d", "completed", "", 10, 0, 1 + i % 5,
                         0.0, float(i), work))
        print(i, flush=True)
""")


def test_sigkill_mid_write_leaves_every_acknowledged_row_and_no_partial_one(tmp_path):
    db = tmp_path / "ledger.db"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acked = []
    for line in proc.stdout:
        acked.append(int(line))
        if len(acked) == 40:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    with open_ledger(str(db)) as led:
        rows = {r.request_id: r for r in led.rows()}
        work = led.work()
    # Every acknowledged record is durable; at most the one being written when killed is there too.
    assert {f"r{i}" for i in acked} <= set(rows)
    assert len(rows) - len(acked) in (0, 1)
    # A row and its work rows commit together: never a row without all its work, nor work without its row.
    per_row: dict[str, int] = {}
    for w in work:
        per_row[w[2]] = per_row.get(w[2], 0) + 1
    assert per_row == {rid: r.delivered_tokens for rid, r in rows.items()}


def test_keys_from_header_or_generated():
    assert check_key("order-42:retry.1") == "order-42:retry.1"
    assert idempotency_key("abc") == "abc"
    a, b = generate_key(), idempotency_key(None)
    assert a != b and a.startswith("fw-") and len(a) == 35
    with pytest.raises(IdempotencyKeyError, match=r"header Idempotency-Key='' must be 1 to 255 characters; send a key "):
        check_key("")
    with pytest.raises(IdempotencyKeyError, match="must be 1 to 255 characters; send a shorter key"):
        check_key("x" * 256)
    with pytest.raises(IdempotencyKeyError, match="printable ASCII without spaces"):
        check_key("two words")
    with pytest.raises(IdempotencyKeyError, match="printable ASCII"):
        check_key("caf\u00e9")


def _u(key: str, rid: str, prompt: int = 10, delivered: int = 5, status: str = "completed",
       tenant: str = "default") -> Usage:
    return Usage(key, rid, tenant, "m", "p", "d", status, "", prompt, 0, delivered, 0.0, 1.0,  # type: ignore[arg-type]
                 (WorkItem("decode", "first", "d", "d-0", delivered, 0.1),))


def _rec(rid: str, key: str | None = None, done: bool = True, prompt: int = 10, delivered: int = 5) -> RunRecord:
    return RunRecord(rid, key or rid, "default", prompt, delivered, done)


def test_verify_accepts_a_matching_ledger_and_names_every_mismatch(tmp_path):
    records = [_rec("a"), _rec("b", done=False), _rec("c1", "c", done=False), _rec("c2", "c"), _rec("d"),
               _rec("e"), _rec("f", done=False, delivered=2), _rec("g", prompt=11), _rec("h", done=False),
               _rec("h2", "h")]
    with open_ledger(str(tmp_path / "l.db")) as led:
        led.record(_u("a", "a"))
        led.record(_u("c", "c1", status="failed"))
        led.record(_u("c", "c2"))
        good = verify(led.rows()[:2], records[:4])
        assert good.ok and (good.records, good.keys, good.completed_keys, good.rows) == (4, 3, 2, 2)
        led.record(_u("d", "d", delivered=6))       # wrong delivered count
        led.record(_u("f", "f"))                    # billed, but the run never completed it
        led.record(_u("g", "g"))                    # wrong prompt count
        led.record(_u("z", "z"))                    # a key the run never sent
        led.record(_u("h", "h"))                    # cut by a crash after its last token: billed once,
        led.record(_u("h", "h2"))                   # and its retry is a duplicate
        rep = verify(led.rows(), records)           # and e has no row
    assert not rep.ok
    assert sorted((p["idempotency_key"], p["problem"]) for p in rep.problems) == [
        ("d", "delivered_tokens 6 in the ledger, 5 in the run"),
        ("e", "completed (e) has no ledger row"),
        ("f", "delivered_tokens 5 in the ledger, 2 in the run"),
        ("g", "prompt_tokens 10 in the ledger, 11 in the run"),
        ("z", "ledger row (z) for a key the run never sent"),
    ]


def test_run_records_load_from_simulator_csv_and_jsonl(tmp_path):
    p = tmp_path / "requests.csv"
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["request_id", "tenant", "prompt_tokens", "tokens_generated", "failure"])
        w.writerow(["7", "acme", "100", "20", ""])
        w.writerow(["8", "", "50", "0", "replica_crashed"])
    assert load_run_records(p) == [RunRecord("7", "7", "acme", 100, 20, True),
                                   RunRecord("8", "8", "default", 50, 0, False)]
    j = tmp_path / "log.jsonl"
    j.write_text('{"request_id": "x", "idempotency_key": "K", "status": "cancelled", "delivered_tokens": 3}\n\n')
    assert load_run_records(j) == [RunRecord("x", "K", "default", None, 3, False)]
    j.write_text('{"request_id": "x"}\n')
    with pytest.raises(SpecError, match="neither a status nor a failure column"):
        load_run_records(j)
    j.write_text('{"request_id": "x", "status": "completed", "prompt_tokens": "lots"}\n')
    with pytest.raises(SpecError, match=r"log.jsonl:1: prompt_tokens='lots' is not an integer"):
        load_run_records(j)
    with pytest.raises(SpecError, match="not found"):
        load_run_records(tmp_path / "missing.csv")


def test_ledger_urls_fail_with_one_line():
    with pytest.raises(SpecError, match="scheme 'mysql' is not supported"):
        open_ledger("mysql://u@h/db")
    with pytest.raises(SpecError, match="does not exist"):
        open_ledger("/no/such/dir/ledger.db")
    with pytest.raises(SpecError, match="not found"):
        open_ledger("/tmp/definitely-missing-ledger.db", create=False)


def test_not_a_database_is_a_clear_error(tmp_path):
    bad = Path(tmp_path / "junk.db")
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(SpecError, match="is not a usable SQLite database"):
        open_ledger(str(bad))


def test_a_reader_refuses_a_file_without_a_ledger_and_leaves_it_unchanged(tmp_path):
    empty = tmp_path / "usage.json"  # a wrong path: it was given a ledger's tables (40 KiB) and summed as empty
    empty.write_bytes(b"")
    with pytest.raises(SpecError, match="holds no fleetwise ledger"):
        open_ledger(str(empty), create=False)
    assert empty.read_bytes() == b""
    with open_ledger(str(tmp_path / "ledger.db")) as led:  # a gateway's ledger, even with no usage yet, still reads
        assert led.summary()["tenants"] == {}
    with open_ledger(str(tmp_path / "ledger.db"), create=False) as led:
        assert led.summary()["total"]["requests"] == 0
