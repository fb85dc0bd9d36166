"""The shared ledger: a PostgreSQL database several gateway processes write to.

Uses psycopg 3 (the PostgreSQL project's maintained Python driver; the `postgres` extra
installs it). Concurrent writers of one key are ordered by the primary key: the first insert
wins and a completed row is never replaced (see `fleetwise.ledger.store`).
"""

from __future__ import annotations

from typing import Any

from fleetwise.errors import SpecError
from fleetwise.ledger.store import Ledger
from fleetwise.spec.failure_domains import FailureDomainSpec

CONNECT_TIMEOUT_S = 10
"""Seconds to wait for the server before giving up with a clear error."""


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
        try:
            self._conn = psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise SpecError(f"ledger URL {_redact(url)!r}: cannot connect ({first}); check host, port, "
                            "user and database") from None
        self._create_schema()

    def _connection(self) -> Any:
        return self._conn

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
