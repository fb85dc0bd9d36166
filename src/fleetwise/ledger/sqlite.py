"""The embedded ledger: one SQLite file in WAL mode (stdlib `sqlite3`), the default.

WAL lets readers (`fleetwise ledger summary`) run while a gateway writes, and several processes
on one host share the file (writers take turns, waiting up to `BUSY_TIMEOUT_S`).
`synchronous=FULL` makes every committed usage row durable across a process kill and a power
loss (NORMAL survives a process kill only); see https://www.sqlite.org/wal.html.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

from fleetwise.errors import SpecError
from fleetwise.ledger.store import Ledger
from fleetwise.spec.failure_domains import FailureDomainSpec

BUSY_TIMEOUT_S = 10.0
"""How long a writer waits for another process's write transaction before failing."""


def check_holds_ledger(path: str | Path) -> None:
    """A reader's check that the SQLite file at `path` holds a ledger (its `ledger_meta` table),
    read without writing to it: a wrong path (an empty file, another program's database) is
    refused, not given a ledger's schema. A file SQLite cannot open read-only is left to
    `SqliteLedger`, which names what is wrong with it."""
    try:
        with contextlib.closing(sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)) as conn:
            found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ledger_meta'").fetchone()
    except sqlite3.DatabaseError:
        return
    if found is None:
        raise SpecError(f"ledger path {str(path)!r} holds no fleetwise ledger (an empty file or another "
                        "database); pass the ledger a gateway wrote to")


class SqliteLedger(Ledger):
    """A ledger in the SQLite file at `path` (created with its schema when missing)."""

    def __init__(self, path: str | Path, decisions: FailureDomainSpec | None = None) -> None:
        super().__init__(decisions)
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise SpecError(f"ledger path {str(self.path)!r}: directory {str(self.path.parent)!r} does not exist; "
                            "create it or choose another path")
        try:
            # Autocommit mode: transactions are opened explicitly (BEGIN IMMEDIATE takes the write
            # lock up front, so two writers never deadlock upgrading a read lock).
            self._conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                         check_same_thread=False)
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            self._conn.execute("PRAGMA synchronous=FULL")
        except sqlite3.DatabaseError as err:
            raise SpecError(f"ledger path {str(self.path)!r} is not a usable SQLite database ({err}); "
                            "choose another path") from None
        if str(mode).lower() != "wal":
            raise SpecError(f"ledger path {str(self.path)!r}: SQLite refused WAL mode (got {mode!r}); "
                            "use a local file system")
        self._create_schema()

    def _connection(self) -> Any:
        return self._conn

    def _begin(self, cur: Any) -> None:
        cur.execute("BEGIN IMMEDIATE")
