"""The spool and the background writer alone: records applied once however often replayed, a
damaged last line skipped, one spool file per process, a failing ledger spooled and replayed in
order, a stuck write bounded by `commit_wait_s`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from fleetwise.ledger import Usage, WorkItem, open_ledger
from fleetwise.ledger.meter import Meter
from fleetwise.ledger.spool import Spool
from fleetwise.ledger.store import Ledger, Outcome
from fleetwise.ledger.usage import TOKEN_COUNT_LIMIT
from fleetwise.ledger.writer import LedgerWriter

MB = 1 << 20


def usage(key: str, rid: str, status: str = "completed", delivered: int = 5) -> Usage:
    work = (WorkItem("prefill", "first", "p", "p0", 10, 0.0), WorkItem("decode", "first", "d", "d0", delivered, 0.0))
    return Usage(key, rid, "acme", "m", "p", "d", status, "", 10, 0, delivered, 1.0, 2.0, work)  # type: ignore[arg-type]


def test_a_record_applied_twice_is_recorded_once(ledger_url) -> None:
    with open_ledger(ledger_url) as led:
        assert led.record_many([usage("k", "r1", "failed"), usage("k", "r2")]) == ["billed", "replaced"]
        assert led.record_many([usage("k", "r1", "failed"), usage("k", "r2")]) == ["already_recorded"] * 2
        assert [(r.request_id, r.attempts) for r in led.rows()] == [("r2", 2)] and len(led.work()) == 4


def test_spool_survives_reopen_skips_a_cut_line_and_is_one_file_per_process(tmp_path) -> None:
    path = tmp_path / "s"
    sp = Spool(path, MB)
    sp.append([usage("a", "r1"), usage("b", "r2")])
    other = Spool(path, MB)  # the file is held: a second writer takes the next name
    assert other.path == tmp_path / "s.1" and len(other) == 0
    other.close()
    sp.close()
    with open(path, "ab") as f:
        f.write(b'{"idempotency_key": "c", "requ')  # a crash mid-append: never acknowledged
    again = Spool(path, MB)
    got, end = again.pending()
    assert [u.request_id for u in got] == ["r1", "r2"] and len(again) == 2
    again.append([usage("d", "r3")])
    again.consumed(end, 2)  # r3 came after the replay read: it stays
    assert [u.request_id for u in again.pending()[0]] == ["r3"]
    again.consumed(again.pending()[1], 1)
    assert len(again) == 0 and again.size_bytes == 0 and path.stat().st_size == 0


class FlakyLedger(Ledger):
    """A ledger whose writes fail while `down` is set and block while `stuck` is set."""

    def __init__(self, inner: Ledger) -> None:
        super().__init__()
        self.inner = inner
        self.down = False
        self.stuck = threading.Event()
        self.release = threading.Event()

    def _connection(self) -> object:
        raise NotImplementedError

    def _begin(self, cur: object) -> None:
        raise NotImplementedError

    def record_many(self, usages: Sequence[Usage]) -> list[Outcome]:
        if self.stuck.is_set():
            self.release.wait(10)
        if self.down:
            raise ConnectionError("server closed the connection")
        return self.inner.record_many(usages)

    def close(self) -> None:
        self.inner.close()


def test_writer_spools_while_down_and_replays_in_order_once(tmp_path) -> None:
    inner = open_ledger(str(tmp_path / "l.db"))
    led = FlakyLedger(inner)

    async def scenario() -> None:
        w = LedgerWriter(led, Spool(tmp_path / "spool", MB), commit_wait_s=5.0, retry_s=0.05)
        assert await w.record(usage("k0", "r0")) == "billed"
        led.down = True
        assert await w.record(usage("k1", "r1", "failed")) is None  # spooled
        assert await w.record(usage("k1", "r2")) is None
        assert w.state()["degraded"] and w.state()["spool_records"] == 2
        led.down = False
        for _ in range(200):
            if not w.state()["degraded"]:
                break
            await asyncio.sleep(0.02)
        st = w.state()
        assert (st["degraded"], st["spool_records"], st["spooled"], st["replayed"], st["lost"]) == (False, 0, 2, 2, 0)
        w.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
    with open_ledger(str(tmp_path / "l.db"), create=False) as check:
        rows = {r.idempotency_key: (r.request_id, r.status, r.attempts) for r in check.rows()}
    assert rows == {"k0": ("r0", "completed", 1), "k1": ("r2", "completed", 2)}  # replayed in order


def test_a_stuck_write_is_spooled_after_commit_wait_and_billed_once(tmp_path) -> None:
    led = FlakyLedger(open_ledger(str(tmp_path / "l.db")))

    async def scenario() -> None:
        w = LedgerWriter(led, Spool(tmp_path / "spool", MB), commit_wait_s=0.2, retry_s=0.05)
        led.stuck.set()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await w.record(usage("k", "r")) is None
        assert loop.time() - t0 < 5.0 and w.state()["degraded"]
        led.stuck.clear()
        led.release.set()  # the stuck write now commits too: the replay of its spooled copy is a no-op
        for _ in range(200):
            if not w.state()["degraded"]:
                break
            await asyncio.sleep(0.02)
        assert not w.state()["degraded"]
        w.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
    with open_ledger(str(tmp_path / "l.db"), create=False) as check:
        assert [(r.request_id, r.attempts) for r in check.rows()] == [("r", 1)] and len(check.work()) == 2


def test_verify_reports_records_still_in_the_spool(tmp_path, capsys) -> None:
    from fleetwise.cli.main import main

    db = str(tmp_path / "l.db")
    with open_ledger(db) as led:
        led.record(usage("k0", "r0"))
    (tmp_path / "rec.jsonl").write_text('{"request_id": "r0", "idempotency_key": "k0", "tenant": "acme", '
                                        '"prompt_tokens": 10, "delivered_tokens": 5, "status": "completed"}\n')
    args = ["ledger", "verify", "--ledger", db, "--records", str(tmp_path / "rec.jsonl"), "--spool",
            str(tmp_path / "spool")]
    assert main(args) == 0
    sp = Spool(tmp_path / "spool", MB)
    sp.append([usage("k1", "r1")])
    assert main(args) == 1 and "1 usage record(s) still in the spool" in capsys.readouterr().out
    sp.close()


def test_an_impossible_count_from_a_backend_is_not_taken_and_never_blocks_the_ledger(tmp_path) -> None:
    """A backend's `usage` of 10^30 prompt tokens used to reach the database, which cannot hold it:
    that write failed, the writer turned degraded and every later record waited in the spool behind
    it, never replayed. The meter now keeps its own estimate for a count no request can have."""
    led = open_ledger(str(tmp_path / "l.db"))

    async def scenario() -> None:
        w = LedgerWriter(led, Spool(tmp_path / "spool", MB), commit_wait_s=5.0, retry_s=0.05)
        m = Meter(w, "k1", "r1", "acme", "m", 1.0, 12)
        m.attempt("prefill", "first", None, ("d", "d0"), 12)
        assert m.usage_from(b'data: {"usage": {"prompt_tokens": 1000000000000000000000000000000, '
                            b'"completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": -3}}}')
        assert (m.prompt_tokens, m.delivered_tokens, m.cached_tokens) == (12, 7, 0)
        assert not m.usage_from(b'{"usage": {"completion_tokens": true}}') and m.delivered_tokens == 7
        assert await m.end("completed", "", 2.0) == "billed"
        m3 = Meter(w, "k3", "r3", "acme", "m", 1.0, 12)
        m3.delivered_tokens = 10**30  # a driver's count, clamped to what the ledger holds
        assert await m3.end("failed", "", 2.0) == "billed"
        assert await w.record(usage("k2", "r2")) == "billed"
        assert w.state()["degraded"] is False
        w.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
    with open_ledger(str(tmp_path / "l.db"), create=False) as check:
        rows = {r.idempotency_key: (r.prompt_tokens, r.delivered_tokens) for r in check.rows()}
    assert rows == {"k1": (12, 7), "k2": (10, 5), "k3": (12, TOKEN_COUNT_LIMIT)}


def test_a_disk_that_fills_mid_append_keeps_nothing_of_it_and_spoils_no_later_record(tmp_path, monkeypatch) -> None:
    """A write on a filling disk takes part of the data, the next fails (ENOSPC): the append
    raises and leaves the file as it was, so the record after it, once the disk has room, is read
    back whole (a cut line left behind would have run into it)."""
    import errno
    import os

    from fleetwise.ledger import spool as spool_mod

    path = tmp_path / "s"
    sp = Spool(path, MB)
    sp.append([usage("a", "r1")])
    kept = path.stat().st_size
    real, calls = os.write, []

    def filling(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spool_mod.os, "write", filling)
    try:
        sp.append([usage("b", "r2")])
    except OSError as err:
        assert err.errno == errno.ENOSPC
    else:
        raise AssertionError("the append must fail")
    assert len(calls) == 2 and path.stat().st_size == kept and len(sp) == 1 and sp.size_bytes == kept
    monkeypatch.setattr(spool_mod.os, "write", real)
    sp.append([usage("c", "r3")])
    sp.close()
    assert [u.request_id for u in Spool(path, MB).pending()[0]] == ["r1", "r3"]
