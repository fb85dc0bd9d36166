"""The ledger store: usage written once per (tenant, idempotency key), work recorded, read back.

One SQL schema, two backends (`sqlite.py`: an embedded file in WAL mode, the default;
`postgres.py`: a shared server for several gateway processes); `fleetwise.ledger.backends`
chooses one from a URL. A backend drops a connection that failed and opens a new one at the next
transaction, so a database restart costs the writes made while it was down (the gateway spools
those, `fleetwise.ledger.writer`), never the connection for good.

Write rule (`Ledger.record`, one transaction): the usage row of `(tenant, key)` is inserted; if
a row exists and is `completed`, the new attempt is a duplicate (a client retry of a request
already served) and bills nothing; otherwise (the earlier attempt failed or was cancelled) the
new attempt replaces it, so a key is billed once, for its last attempt that ended. Every
attempt's work items are appended to `work`, billed or not. Each record is applied at most once
(`ledger_applied` holds its identity, `record_id`), so replaying a spool that was partly
written already, or a batch whose commit succeeded but whose answer was lost, doubles nothing. A crash before the commit leaves no
trace of the attempt; after it, the row is durable (SQLite `synchronous=FULL`, PostgreSQL's
default commit).
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Literal

from fleetwise.errors import SpecError
from fleetwise.ledger.summary import summarize
from fleetwise.ledger.usage import LedgerRow, Usage, billed
from fleetwise.spec.failure_domains import FailureDomainSpec

SCHEMA_VERSION = "1"

USAGE_COLUMNS = (
    "tenant", "idempotency_key", "request_id", "model", "prefill_pool", "decode_pool", "status", "reason",
    "prompt_tokens", "cached_tokens", "delivered_tokens",
    "billed_prompt_tokens", "billed_cached_tokens", "billed_generated_tokens",
    "computed_tokens", "gpu_s", "recovery_gpu_s", "attempts", "started_at", "ended_at",
)
_INT, _REAL, _TEXT = "BIGINT NOT NULL", "DOUBLE PRECISION NOT NULL", "TEXT NOT NULL"
_USAGE_TYPES = {c: _TEXT for c in USAGE_COLUMNS[:8]} | {c: _INT for c in USAGE_COLUMNS[8:15]} | {
    "gpu_s": _REAL, "recovery_gpu_s": _REAL, "attempts": _INT, "started_at": _REAL, "ended_at": _REAL}
WORK_COLUMNS = ("tenant", "idempotency_key", "request_id", "kind", "reason", "pool", "replica",
                "tokens_computed", "gpu_s", "at")
_WORK_TYPES = {c: _TEXT for c in WORK_COLUMNS[:7]} | {"tokens_computed": _INT, "gpu_s": _REAL, "at": _REAL}

Outcome = Literal["billed", "replaced", "duplicate", "already_recorded"]
"""`billed`: first record of its key; `replaced`: replaced an earlier failed/cancelled attempt;
`duplicate`: the key was already completed, nothing more billed; `already_recorded`: this very
record was applied before (a replay), nothing changed."""


def record_id(usage: Usage) -> str:
    """The identity of one usage record (one attempt of one request): what makes a replay a no-op."""
    return f"{usage.tenant}\x1f{usage.idempotency_key}\x1f{usage.request_id}\x1f{usage.started_at!r}"


class Ledger(ABC):
    """A usage ledger; thread-safe (one connection behind a lock)."""

    placeholder = "?"
    id_column = "id INTEGER PRIMARY KEY"

    def __init__(self, decisions: FailureDomainSpec | None = None) -> None:
        self.decisions = decisions or FailureDomainSpec()
        self._lock = threading.Lock()

    # ---- backend hooks --------------------------------------------------------------------------
    @abstractmethod
    def _connection(self) -> Any:
        """The open connection, opening a new one when the last one failed."""

    @abstractmethod
    def _begin(self, cur: Any) -> None: ...

    def _failed(self, err: BaseException) -> None:
        """A transaction raised `err`: drop the connection if it is no longer usable (default: keep it)."""
        return None

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            with contextlib.suppress(Exception):
                self._connection().close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- schema ---------------------------------------------------------------------------------
    def _sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def _create_schema(self) -> None:
        usage_cols = ", ".join(f"{c} {t}" for c, t in _USAGE_TYPES.items())
        work_cols = ", ".join(f"{c} {t}" for c, t in _WORK_TYPES.items())
        statements = [
            "CREATE TABLE IF NOT EXISTS ledger_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS ledger_applied (record_id TEXT PRIMARY KEY)",
            f"CREATE TABLE IF NOT EXISTS usage ({usage_cols}, PRIMARY KEY (tenant, idempotency_key))",
            f"CREATE TABLE IF NOT EXISTS work ({self.id_column}, {work_cols})",
            "CREATE INDEX IF NOT EXISTS usage_ended ON usage (ended_at)",
            "CREATE INDEX IF NOT EXISTS work_key ON work (tenant, idempotency_key)",
        ]
        with self._tx() as cur:
            for s in statements:
                cur.execute(s)
            cur.execute(self._sql("SELECT value FROM ledger_meta WHERE name = ?"), ("schema",))
            row = cur.fetchone()
            if row is None:
                cur.execute(self._sql("INSERT INTO ledger_meta (name, value) VALUES (?, ?)"), ("schema", SCHEMA_VERSION))
            elif row[0] != SCHEMA_VERSION:
                raise SpecError(f"ledger schema version {row[0]!r} is not {SCHEMA_VERSION!r}; "
                                "point --ledger at a new database or migrate this one")

    def _tx(self) -> _Transaction:
        return _Transaction(self)

    # ---- writes ---------------------------------------------------------------------------------
    def record(self, usage: Usage) -> Outcome:
        """Write `usage` (once per tenant and key; see the module docstring) and its work; durable on return."""
        return self.record_many([usage])[0]

    def record_many(self, usages: Sequence[Usage]) -> list[Outcome]:
        """Write several records in one transaction (one commit for all; durable on return), in order."""
        with self._tx() as cur:
            return [self._apply(cur, u) for u in usages]

    def _apply(self, cur: Any, usage: Usage) -> Outcome:
        cur.execute(self._sql("INSERT INTO ledger_applied (record_id) VALUES (?) ON CONFLICT (record_id) DO NOTHING"),
                    (record_id(usage),))
        if cur.rowcount != 1:
            return "already_recorded"
        b = billed(usage, self.decisions)
        values = (usage.tenant, usage.idempotency_key, usage.request_id, usage.model, usage.prefill_pool,
                  usage.decode_pool, usage.status, usage.reason, usage.prompt_tokens, usage.cached_tokens,
                  usage.delivered_tokens, b.prompt_tokens, b.cached_tokens, b.generated_tokens,
                  usage.computed_tokens, usage.gpu_s, usage.recovery_gpu_s, 1, usage.started_at, usage.ended_at)
        cols = ", ".join(USAGE_COLUMNS)
        marks = ", ".join("?" for _ in USAGE_COLUMNS)
        update = ", ".join(f"{c} = ?" for c in USAGE_COLUMNS[2:] if c != "attempts")
        key = (usage.tenant, usage.idempotency_key)
        # Three statements, each atomic on its own, so concurrent writers of one key (several
        # gateway processes on PostgreSQL) agree: the first insert wins, a completed row stays.
        cur.execute(self._sql(f"INSERT INTO usage ({cols}) VALUES ({marks}) "
                              "ON CONFLICT (tenant, idempotency_key) DO NOTHING"), values)
        outcome: Outcome = "billed"
        if cur.rowcount != 1:
            cur.execute(self._sql(f"UPDATE usage SET {update}, attempts = attempts + 1 "
                                  "WHERE tenant = ? AND idempotency_key = ? AND status <> 'completed'"),
                        (*values[2:17], *values[18:], *key))
            outcome = "replaced"
            if cur.rowcount != 1:
                outcome = "duplicate"
                cur.execute(self._sql("UPDATE usage SET attempts = attempts + 1 "
                                      "WHERE tenant = ? AND idempotency_key = ?"), key)
        if usage.work:
            wcols = ", ".join(WORK_COLUMNS)
            wmarks = ", ".join("?" for _ in WORK_COLUMNS)
            cur.executemany(self._sql(f"INSERT INTO work ({wcols}) VALUES ({wmarks})"), [
                (usage.tenant, usage.idempotency_key, usage.request_id, w.kind, w.reason, w.pool, w.replica,
                 w.tokens_computed, w.gpu_s, usage.ended_at) for w in usage.work])
        return outcome

    # ---- reads ----------------------------------------------------------------------------------
    def rows(self, tenant: str | None = None, since: float | None = None) -> list[LedgerRow]:
        """Usage rows (optionally one tenant's, ended at or after `since`), oldest first."""
        where, args = _filters(tenant, since, "ended_at")
        with self._tx() as cur:
            cur.execute(self._sql(f"SELECT {', '.join(USAGE_COLUMNS)} FROM usage{where} "
                                  "ORDER BY ended_at, tenant, idempotency_key"), args)
            return [LedgerRow(*r) for r in cur.fetchall()]

    def get(self, tenant: str, key: str) -> LedgerRow | None:
        """The usage row of `(tenant, key)`, or None."""
        with self._tx() as cur:
            cur.execute(self._sql(f"SELECT {', '.join(USAGE_COLUMNS)} FROM usage "
                                  "WHERE tenant = ? AND idempotency_key = ?"), (tenant, key))
            r = cur.fetchone()
        return LedgerRow(*r) if r else None

    def work(self, tenant: str | None = None, since: float | None = None) -> list[tuple[Any, ...]]:
        """Work rows `(tenant, key, request_id, kind, reason, pool, replica, tokens, gpu_s, at)`, in write order."""
        where, args = _filters(tenant, since, "at")
        with self._tx() as cur:
            cur.execute(self._sql(f"SELECT {', '.join(WORK_COLUMNS)} FROM work{where} ORDER BY id"), args)
            return [tuple(r) for r in cur.fetchall()]

    def summary(self, tenant: str | None = None, since: float | None = None) -> dict[str, Any]:
        """Billed usage per tenant and per pool, with the work done (see docs/failure-domains.md)."""
        return summarize(self.rows(tenant, since), self.work(tenant, since))


def _filters(tenant: str | None, since: float | None, time_col: str) -> tuple[str, tuple[Any, ...]]:
    conds: list[str] = []
    args: list[Any] = []
    if tenant is not None:
        conds.append("tenant = ?")
        args.append(tenant)
    if since is not None:
        conds.append(f"{time_col} >= ?")
        args.append(since)
    return (" WHERE " + " AND ".join(conds) if conds else ""), tuple(args)


class _Transaction:
    """`with ledger._tx() as cur:` one transaction under the ledger's lock; rollback on error."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def __enter__(self) -> Any:
        self.ledger._lock.acquire()
        try:
            self.conn = self.ledger._connection()
            self.cur = self.conn.cursor()
            self.ledger._begin(self.cur)
        except BaseException as err:
            self.ledger._failed(err)
            self.ledger._lock.release()
            raise
        return self.cur

    def __exit__(self, exc_type: object, exc: BaseException | None, *rest: object) -> None:
        try:
            if exc is None:
                self.conn.commit()
            else:
                self.ledger._failed(exc)
                with contextlib.suppress(Exception):  # a dead connection cannot roll back; the server did
                    self.conn.rollback()
        except BaseException as err:  # the commit failed: the connection may be gone
            self.ledger._failed(err)
            raise
        finally:
            with contextlib.suppress(Exception):
                self.cur.close()
            self.ledger._lock.release()
