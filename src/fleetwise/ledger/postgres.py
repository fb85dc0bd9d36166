"""The shared ledger: a PostgreSQL database several gateway processes write to.

Uses psycopg 3 (the PostgreSQL project's maintained Python driver; the `postgres` extra
installs it). A connection that failed (server restarted, network cut) is closed and a new one is
opened at the next transaction; the writes made meanwhile fail fast and the gateway spools them. Concurrent writers of one key are ordered by the primary key: the first insert
wins and a completed row is never replaced (see `fleetwise.ledger.store`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from fleetwise.errors import SpecError
from fleetwise.ledger.store import Ledger
from fleetwise.spec.failure_domains import FailureDomainSpec

CONNECT_TIMEOUT_S = 10
"""Seconds to wait for the server before giving up with a clear error."""
KEEPALIVE_IDLE_S = 5
"""TCP keepalive idle and probe interval (libpq `keepalives_idle`), so a silently cut link is
noticed in about 20 s rather than the kernel's two hours."""


class PostgresLedger(Ledger):
    """A ledger in the PostgreSQL database at `url` (tables created when missing)."""

    placeholder = "%s"
    id_column = "id BIGSERIAL PRIMARY KEY"

    def __init__(self, url: str, decisions: FailureDomainSpec | None = None) -> None:
        super().__init__(decisions)
        try:
            import psycopg
        except ImportError:
            raise SpecError("a postgresql:// ledger needs psycopg; install it with "
                            "pip install 'fleetwise[postgres]'") from None
        self.url = url
        self._psycopg = psycopg
        self._conn: Any = None
        try:
            self._create_schema()
        except psycopg.Error as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise SpecError(f"ledger URL {_redact(url)!r}: cannot connect ({first}); check host, port, "
                            "user and database") from None

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = self._psycopg.connect(self.url, connect_timeout=CONNECT_TIMEOUT_S,
                                               keepalives=1, keepalives_idle=KEEPALIVE_IDLE_S,
                                               keepalives_interval=KEEPALIVE_IDLE_S, keepalives_count=3)
        return self._conn

    def close(self) -> None:
        """Close the connection if one is open (idempotent; never connects)."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()

    def _failed(self, err: BaseException) -> None:
        """Drop the connection when the server is gone (`OperationalError`) or psycopg marks it broken."""
        conn = self._conn
        if conn is not None and (conn.broken or isinstance(err, self._psycopg.OperationalError)):
            self._conn = None
            with contextlib.suppress(Exception):
                conn.close()

    def _begin(self, cur: Any) -> None:
        """psycopg opens a transaction at the first statement; nothing to do."""


def _redact(url: str) -> str:
    """`url` without its password (error messages must not leak it)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url
