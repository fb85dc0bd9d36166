"""`LedgerWriter`: usage records written by one background thread, in batches, and spooled
locally while the ledger cannot take them.

A driver submits each record and waits, at most `commit_wait_s`, until it is durable somewhere:
committed in the ledger (all records waiting are committed in one transaction, so one commit
serves many requests) or fsynced in the spool (`fleetwise.ledger.spool`). Whatever happens to
the database, a submit never raises and never waits longer than that bound (plus one spool
fsync): metering never cuts a stream.

States: `ok` (records go to the ledger) and `degraded` (a write failed: records go to the spool,
and every `retry_s` the spool is replayed into the ledger, oldest first, one batch per
transaction; when it is empty, `ok` again). A record whose write is still stuck after
`commit_wait_s` (a database lock held, a server that stopped answering) is spooled by the waiter
and the writer turns `degraded`; the ledger applies each record once, so one that lands both
ways is billed once. A spool full or unwritable loses the record (counted as `lost`, logged).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fleetwise.ledger.spool import Spool
from fleetwise.ledger.store import Ledger, Outcome
from fleetwise.ledger.usage import Usage

__all__ = ["LedgerWriter", "WriterStats"]

log = logging.getLogger("fleetwise.ledger")

BATCH_MAX = 256
"""Most records one transaction writes."""

READERS = 2
"""Threads reading the ledger (idempotency checks), apart from the event loop's default pool."""

_STOP = object()


@dataclass
class WriterStats:
    """Counters of a writer since it started (read by the gateway's /metrics and /readiness)."""

    written: int = 0
    """Records committed straight to the ledger."""
    spooled: int = 0
    """Records appended to the spool."""
    replayed: int = 0
    """Spooled records committed to the ledger later."""
    write_errors: int = 0
    """Ledger transactions that failed."""
    lost: int = 0
    """Records neither committed nor spooled (the spool was full or unwritable)."""
    batches: int = 0
    """Transactions committed."""
    spool_failing: bool = False
    """The last spool append failed (records are being lost)."""


class LedgerWriter:
    """One background thread writing usage records to `ledger`, spooling to `spool` while it cannot."""

    def __init__(self, ledger: Ledger, spool: Spool, *, commit_wait_s: float, retry_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger, self.spool = ledger, spool
        self.commit_wait_s, self.retry_s = commit_wait_s, retry_s
        self.stats = WriterStats()
        self.degraded = len(spool) > 0
        """True while records go to the spool (a write failed, or a spool from an earlier run waits)."""
        self.since_s: float | None = clock() if self.degraded else None
        self._clock = clock
        self._next_try = 0.0
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._spool_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleetwise-ledger-spool")
        """Waiters spool here, never on the event loop's default pool (a stuck database must not starve it)."""
        self._read_pool = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="fleetwise-ledger-read")
        self._thread = threading.Thread(target=self._run, name="fleetwise-ledger-writer", daemon=True)
        self._thread.start()

    # ---- the driver's side -----------------------------------------------------------------------

    async def record(self, usage: Usage) -> Outcome | None:
        """Make `usage` durable (ledger or spool) and return the ledger's outcome (None when spooled
        or lost); waits at most `commit_wait_s` for the ledger, never raises."""
        fut: concurrent.futures.Future[Outcome | None] = concurrent.futures.Future()
        self._queue.put((usage, fut))
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), self.commit_wait_s)
        except TimeoutError:
            await asyncio.get_running_loop().run_in_executor(self._spool_pool, self._spool, [usage])
            self._turn_degraded("a ledger write took longer than commit_wait_s")
            return None

    async def completed(self, tenant: str, key: str) -> bool | None:
        """Whether the ledger holds `(tenant, key)` completed; None when it cannot say (degraded,
        or no answer within `commit_wait_s`: its reader threads wait for a stuck database)."""
        if self.degraded:
            return None
        fut = asyncio.get_running_loop().run_in_executor(self._read_pool, self.ledger.get, tenant, key)
        try:
            row = await asyncio.wait_for(asyncio.shield(fut), self.commit_wait_s)
        except Exception:  # a database that does not answer in time cannot say
            return None
        return row is not None and row.status == "completed"

    def state(self) -> dict[str, Any]:
        """`degraded`, records waiting in the spool and the counters (JSON-ready)."""
        return {"degraded": self.degraded, "spool_records": len(self.spool), "spool_bytes": self.spool.size_bytes,
                "spool_path": str(self.spool.path), **self.stats.__dict__}

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued, try one last replay, stop the thread, close the ledger and the spool."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        self._spool_pool.shutdown(wait=True)
        self._read_pool.shutdown(wait=False, cancel_futures=True)
        self.ledger.close()
        self.spool.close()

    # ---- the writer thread -------------------------------------------------------------------------

    def _run(self) -> None:
        stop = False
        while not stop:
            try:
                first = self._queue.get(timeout=self.retry_s)
            except queue.Empty:
                first = None
            batch: list[tuple[Usage, concurrent.futures.Future[Outcome | None]]] = []
            for item in self._drain(first):
                if item is _STOP:
                    stop = True
                else:
                    batch.append(item)
            if batch:  # when degraded, spooled before the replay, so they never wait for it
                self._write(batch)
            if not self.degraded and len(self.spool):  # a waiter spooled a record itself
                self._turn_degraded("records waiting in the spool")
            if self.degraded and (stop or self._clock() >= self._next_try):
                self._replay()

    def _drain(self, first: Any) -> list[Any]:
        items = [] if first is None else [first]
        while len(items) < BATCH_MAX:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _write(self, batch: list[tuple[Usage, concurrent.futures.Future[Outcome | None]]]) -> None:
        usages = [u for u, _ in batch]
        outcomes: list[Outcome | None] = [None] * len(batch)
        if not self.degraded:
            try:
                outcomes = list(self.ledger.record_many(usages))
                self.stats.written += len(usages)
                self.stats.batches += 1
            except Exception as err:  # any failure: the records must not be lost
                self.stats.write_errors += 1
                self._turn_degraded(f"{type(err).__name__}: {str(err).strip()[:200]}")
        if self.degraded and outcomes[0] is None:
            self._spool(usages)
        for (_, fut), out in zip(batch, outcomes, strict=True):
            if not fut.done():
                fut.set_result(out)

    def _spool(self, usages: list[Usage]) -> None:
        try:
            self.spool.append(usages)
            self.stats.spooled += len(usages)
            self.stats.spool_failing = False
        except OSError as err:
            self.stats.lost += len(usages)
            self.stats.spool_failing = True
            log.error("ledger: %d usage record(s) lost, the spool cannot take them: %s", len(usages), err)

    def _turn_degraded(self, why: str) -> None:
        if not self.degraded:
            log.warning("ledger degraded, spooling usage records to %s: %s", self.spool.path, why)
            self.degraded, self.since_s = True, self._clock()
        self._next_try = self._clock() + self.retry_s

    def _replay(self) -> None:
        """Write the spool to the ledger, oldest first; `ok` again once it is empty."""
        pending, end = self.spool.pending()
        try:
            for i in range(0, len(pending), BATCH_MAX):
                self.ledger.record_many(pending[i:i + BATCH_MAX])
                self.stats.batches += 1
        except Exception as err:
            self.stats.write_errors += 1
            self._next_try = self._clock() + self.retry_s
            log.info("ledger still unavailable (%s: %s); %d record(s) spooled", type(err).__name__,
                     str(err).strip()[:200], len(self.spool))
            return
        self.spool.consumed(end, len(pending))
        self.stats.replayed += len(pending)
        if len(self.spool) == 0:
            log.warning("ledger back after %.1f s; %d spooled record(s) replayed", self._clock() - (self.since_s or 0.0),
                        self.stats.replayed)
            self.degraded, self.since_s = False, None
