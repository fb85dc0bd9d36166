"""Ledger outages: a PostgreSQL restart under load and a SQLite write lock held 15 s. Every stream
ends with [DONE] (metering never cuts one), usage is spooled while the ledger cannot take it and
replayed once when it returns, /readiness and /metrics say the ledger is degraded meanwhile, and
`fleetwise ledger verify` finds nothing lost or doubled."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from gw_harness import run, running_fleet

from fleetwise.cli.main import main
from fleetwise.ledger import open_ledger

PROMPT = "hello world " * 20
TOKENS = 6
BODY = {"model": "m", "prompt": PROMPT, "max_tokens": TOKENS, "stream": True}
CLIENTS = 8
"""Concurrent closed-loop clients."""
OUTAGE_TIMEOUT_S = 120.0


async def _load(f: Any, stop: asyncio.Event, records: list[dict[str, Any]], tag: str) -> None:
    """Closed-loop streams with unique keys until `stop`; each outcome appended to `records`."""
    i = 0
    while not stop.is_set():
        key = f"{tag}-{i}"
        i += 1
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        status, events, h = await f.stream("/v1/completions", BODY, {"Idempotency-Key": key})
        texts = [e for e in events if isinstance(e, dict) and e.get("choices")]
        errors = [e for e in events if isinstance(e, dict) and "error" in e]
        records.append({"request_id": h.get("X-Request-ID", ""), "idempotency_key": key, "tenant": "default",
                        "status": "completed" if status == 200 and events[-1:] == ["[DONE]"] and not errors
                        else "failed", "delivered_tokens": len(texts), "seconds": loop.time() - t0})


async def _readiness(f: Any) -> dict[str, Any]:
    async with f.client.get(f.url + "/readiness") as r:
        return dict(await r.json())


def _check(records: list[dict[str, Any]], db: str, tmp_path: Path) -> None:
    assert records and all(r["status"] == "completed" and r["delivered_tokens"] == TOKENS for r in records), [
        r for r in records if r["status"] != "completed"][:3]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["ledger", "verify", "--ledger", db, "--records", str(path)]) == 0
    with open_ledger(db, create=False) as led:
        rows = led.rows()
        work = led.work()
    assert len(rows) == len(records) and all(r.attempts == 1 for r in rows)
    assert len(work) == 2 * len(records)  # one prefill and one decode item each: nothing doubled


async def _outage_scenario(f: Any, outage: Any, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Load before, during and after `outage()` (run in a thread); returns the states /readiness showed."""
    stop = asyncio.Event()
    clients = [asyncio.create_task(_load(f, stop, records, f"c{c}")) for c in range(CLIENTS)]
    await f.wait_for(lambda: len(records) >= 40, 20)
    seen: list[dict[str, Any]] = []
    down = asyncio.create_task(asyncio.to_thread(outage))
    while not down.done():
        seen.append((await _readiness(f)).get("ledger", {}))
        await asyncio.sleep(0.1)
    await down
    n = len(records)
    await f.wait_for(lambda: len(records) >= n + 40, 30)
    stop.set()
    await asyncio.gather(*clients)
    for _ in range(200):  # the spool drains within a few replay intervals
        st = f.gw.ledger.state()
        if not st["degraded"] and st["spool_records"] == 0:
            break
        await asyncio.sleep(0.1)
    m = await f.metrics()
    assert m["fleetwise_gateway_ledger_degraded"] == 0 and m["fleetwise_gateway_ledger_spool_records"] == 0
    assert m["fleetwise_gateway_ledger_spooled_total"] > 0
    assert m["fleetwise_gateway_ledger_replayed_total"] == m["fleetwise_gateway_ledger_spooled_total"]
    assert m["fleetwise_gateway_ledger_lost_records_total"] == 0
    print(f"requests {len(records)}, spooled {m['fleetwise_gateway_ledger_spooled_total']:.0f}, "
          f"slowest {max(r['seconds'] for r in records):.2f} s")
    return seen


@pytest.mark.slow
def test_postgres_restart_under_load_loses_and_doubles_nothing(postgres_server, pg_database, tmp_path) -> None:
    records: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with running_fleet(2, ledger=pg_database, responder_kw={"token_delay_s": 0.002},
                                 ledger_outage={"spool_path": str(tmp_path / "spool"), "retry_s": 0.2}) as f:
            seen = await _outage_scenario(f, lambda: postgres_server.restart(1.3), records)
            assert any(s.get("state") == "degraded" for s in seen)
            assert (await _readiness(f))["ledger"]["state"] == "ok"
    run(scenario, OUTAGE_TIMEOUT_S)
    _check(records, pg_database, tmp_path)


@pytest.mark.slow
def test_sqlite_write_lock_held_15_s_delays_no_stream_and_loses_nothing(tmp_path) -> None:
    db = str(tmp_path / "ledger.db")
    records: list[dict[str, Any]] = []
    held = threading.Event()

    def lock_15_s() -> None:
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")  # another process's write transaction, held 15 s
        held.set()
        threading.Event().wait(15.0)
        conn.execute("ROLLBACK")
        conn.close()

    async def scenario() -> None:
        async with running_fleet(2, ledger=db, responder_kw={"token_delay_s": 0.002},
                                 ledger_outage={"retry_s": 0.5, "commit_wait_s": 0.5}) as f:
            seen = await _outage_scenario(f, lock_15_s, records)
            assert any(s.get("state") == "degraded" for s in seen)
    run(scenario, OUTAGE_TIMEOUT_S)
    _check(records, db, tmp_path)
    # No stream waited for the lock beyond the commit bound (0.5 s) plus generous scheduling slack.
    assert max(r["seconds"] for r in records) < 5.0
