"""Choosing a ledger backend from a URL: one registry of URL schemes, read by `open_ledger`.

The backends (`sqlite.py`, `postgres.py`) import the store; the store imports neither, so the
package has no import circle. A new backend is a module with a `Ledger` subclass and one entry in
`BACKENDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fleetwise.errors import SpecError
from fleetwise.ledger.postgres import PostgresLedger
from fleetwise.ledger.sqlite import SqliteLedger, check_holds_ledger
from fleetwise.ledger.store import Ledger
from fleetwise.spec.failure_domains import FailureDomainSpec

__all__ = ["BACKENDS", "open_ledger"]


def _postgres(url: str, decisions: FailureDomainSpec | None, create: bool) -> Ledger:
    return PostgresLedger(url, decisions)


def _sqlite(url: str, decisions: FailureDomainSpec | None, create: bool) -> Ledger:
    path = url.removeprefix("sqlite:///")
    if not create and not Path(path).is_file():
        raise SpecError(f"ledger {path!r} not found; pass the --ledger a gateway wrote to")
    if not create:
        check_holds_ledger(path)
    return SqliteLedger(path, decisions)


BACKENDS: dict[str, Callable[[str, FailureDomainSpec | None, bool], Ledger]] = {
    "postgresql": _postgres,
    "postgres": _postgres,
    "sqlite": _sqlite,
}
"""URL scheme -> opener; a URL without a scheme is a SQLite file path."""


def open_ledger(url: str, decisions: FailureDomainSpec | None = None, create: bool = True) -> Ledger:
    """A ledger from `url`: `postgresql://...` (shared server) or a SQLite file path / `sqlite:///path`;
    `create=False` refuses a SQLite file that does not exist yet (readers)."""
    scheme = url.split("://", 1)[0] if "://" in url else "sqlite"
    opener = BACKENDS.get(scheme)
    if opener is None or (scheme == "sqlite" and "://" in url and not url.startswith("sqlite:///")):
        raise SpecError(f"ledger URL scheme {scheme!r} is not supported; use a file path, sqlite:///PATH "
                        "or postgresql://USER@HOST:PORT/DB")
    return opener(url, decisions, create)
