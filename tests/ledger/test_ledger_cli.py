"""`fleetwise ledger summary|verify` through the CLI entry point (exit codes, JSON, errors)."""

from __future__ import annotations

import json

import pytest

from fleetwise.cli.ledger_cmd import parse_since
from fleetwise.cli.main import main
from fleetwise.errors import SpecError
from fleetwise.ledger import Usage, WorkItem, open_ledger


def _fill(db: str) -> None:
    with open_ledger(db) as led:
        for i, (tenant, ended) in enumerate([("a", 1_700_000_000.0), ("b", 1_800_000_000.0)]):
            led.record(Usage(f"k{i}", f"r{i}", tenant, "m", "prefill", "decode", "completed", "", 100, 40, 7,
                             ended - 1, ended, (WorkItem("prefill", "first", "prefill", "prefill-0", 60, 0.25),)))


def test_summary_json_filters_by_tenant_and_time(tmp_path, capsys):
    db = str(tmp_path / "l.db")
    _fill(db)
    assert main(["ledger", "summary", "--ledger", db, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(doc["tenants"]) == ["a", "b"] and doc["total"]["billed_generated_tokens"] == 14
    assert doc["pools"]["prefill"]["billed_cached_tokens"] == 80
    assert main(["ledger", "summary", "--ledger", db, "--json", "--since", "2025-01-01T00:00:00Z"]) == 0
    assert list(json.loads(capsys.readouterr().out)["tenants"]) == ["b"]
    assert main(["ledger", "summary", "--ledger", f"sqlite:///{db}", "--tenant", "a"]) == 0
    out = capsys.readouterr().out
    assert "usage per tenant" in out and "usage per pool" in out


def test_verify_exit_codes(tmp_path, capsys):
    db = str(tmp_path / "l.db")
    _fill(db)
    ok = tmp_path / "ok.jsonl"
    ok.write_text("".join(json.dumps({"request_id": f"r{i}", "idempotency_key": f"k{i}", "tenant": t,
                                      "status": "completed", "prompt_tokens": 100, "delivered_tokens": 7}) + "\n"
                          for i, t in enumerate("ab")))
    assert main(["ledger", "verify", "--ledger", db, "--records", str(ok)]) == 0
    assert "2 records, 2 keys (2 completed), 2 ledger rows: ok" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text(ok.read_text().splitlines()[0] + "\n")
    assert main(["ledger", "verify", "--ledger", db, "--records", str(bad), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["problems"] == [{"tenant": "b", "idempotency_key": "k1", "problem": "ledger row (r1) for a key the run never sent"}]


def test_user_errors_are_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FLEETWISE_LEDGER", raising=False)
    assert main(["ledger", "summary"]) == 2
    assert "no ledger: pass --ledger URL or set FLEETWISE_LEDGER" in capsys.readouterr().err
    assert main(["ledger", "summary", "--ledger", str(tmp_path / "none.db")]) == 2
    assert "not found" in capsys.readouterr().err
    db = str(tmp_path / "l.db")
    _fill(db)
    assert main(["ledger", "summary", "--ledger", db, "--since", "yesterday"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--since='yesterday' is not a time" in err


def test_parse_since_forms():
    assert parse_since("2h", 10_000.0) == 2_800.0
    assert parse_since("90s", 100.0) == 10.0
    assert parse_since("1700000000", 0.0) == 1_700_000_000.0
    assert parse_since("2023-11-14T22:13:20", 0.0) == 1_700_000_000.0
    assert parse_since("2023-11-14T23:13:20+01:00", 0.0) == 1_700_000_000.0
    with pytest.raises(SpecError):
        parse_since("soon", 0.0)
