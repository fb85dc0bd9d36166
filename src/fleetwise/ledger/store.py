"""The ledger store: usage written once per (tenant, idempotency key), work recorded, read back.

One SQL schema, two backends (`sqlite.py`: an embedded file in WAL mode, the default;
`postgres.py`: a shared server for several gateway processes). `open_ledger(url)` picks one.

Write rule (`Ledger.record`, one transaction): the usage row of `(tenant, key)` is inserted; if
a row exists and is `completed`, the new attempt is a duplicate (a client retry of a request
already served) and bills nothing; otherwise (the earlier attempt failed or was cancelled) the
new attempt replaces it, so a key is billed once, for its last attempt that ended. Every
attempt's work items are appended to `work`, billed or not. A crash before the commit leaves no
trace of the attempt; after it, the row is durable (SQLite `synchronous=FULL`, PostgreSQL's
default commit).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fleetwise.errors import SpecError
from fleetwise.ledger.usage import Usage, billed
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

Outcome = Literal["billed", "replaced", "duplicate"]
"""`billed`: first record of its key; `replaced`: replaced an earlier failed/cancelled attempt;
`duplicate`: the key was already completed, nothing more billed."""


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One usage row as stored (billed counts fixed when it was written)."""

    tenant: str
    idempotency_key: str
    request_id: str
    model: str
    prefill_pool: str
    decode_pool: str
    status: str
    reason: str
    prompt_tokens: int
    cached_tokens: int
    delivered_tokens: int
    billed_prompt_tokens: int
    billed_cached_tokens: int
    billed_generated_tokens: int
    computed_tokens: int
    gpu_s: float
    recovery_gpu_s: float
    attempts: int
    started_at: float
    ended_at: float


class Ledger(ABC):
    """A usage ledger; thread-safe (one connection behind a lock)."""

    placeholder = "?"
    id_column = "id INTEGER PRIMARY KEY"

    def __init__(self, decisions: FailureDomainSpec | None = None) -> None:
        self.decisions = decisions or FailureDomainSpec()
        self._lock = threading.Lock()

    # ---- backend hooks --------------------------------------------------------------------------
    @abstractmethod
    def _connection(self) -> Any: ...

    @abstractmethod
    def _begin(self, cur: Any) -> None: ...

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
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
        b = billed(usage, self.decisions)
        values = (usage.tenant, usage.idempotency_key, usage.request_id, usage.model, usage.prefill_pool,
                  usage.decode_pool, usage.status, usage.reason, usage.prompt_tokens, usage.cached_tokens,
                  usage.delivered_tokens, b.prompt_tokens, b.cached_tokens, b.generated_tokens,
                  usage.computed_tokens, usage.gpu_s, usage.recovery_gpu_s, 1, usage.started_at, usage.ended_at)
        cols = ", ".join(USAGE_COLUMNS)
        marks = ", ".join("?" for _ in USAGE_COLUMNS)
        update = ", ".join(f"{c} = ?" for c in USAGE_COLUMNS[2:] if c != "attempts")
        key = (usage.tenant, usage.idempotency_key)
        with self._tx() as cur:
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
        from fleetwise.ledger.summary import summarize

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
            conn = self.ledger._connection()
            self.cur = conn.cursor()
            self.ledger._begin(self.cur)
        except BaseException:
            self.ledger._lock.release()
            raise
        return self.cur

    def __exit__(self, exc_type: object, *rest: object) -> None:
        conn = self.ledger._connection()
        try:
            if exc_type is None:
                conn.commit()
            else:
                conn.rollback()
        finally:
            self.cur.close()
            self.ledger._lock.release()


def open_ledger(url: str, decisions: FailureDomainSpec | None = None, create: bool = True) -> Ledger:
    """A ledger from `url`: `postgresql://...` (shared server) or a SQLite file path / `sqlite:///path`;
    `create=False` refuses a SQLite file that does not exist yet (readers)."""
    if url.startswith(("postgresql://", "postgres://")):
        from fleetwise.ledger.postgres import PostgresLedger

        return PostgresLedger(url, decisions)
    if "://" in url and not url.startswith("sqlite:///"):
        scheme = url.split("://", 1)[0]
        raise SpecError(f"ledger URL scheme {scheme!r} is not supported; use a file path, sqlite:///PATH "
                        "or postgresql://USER@HOST:PORT/DB")
    from fleetwise.ledger.sqlite import SqliteLedger

    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url
    if not create and not Path(path).is_file():
        raise SpecError(f"ledger {path!r} not found; pass the --ledger a gateway wrote to")
    return SqliteLedger(path, decisions)

