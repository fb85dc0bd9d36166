"""Metering: one usage record per request, written once when it ends, in a crash-safe ledger.

Owns the usage record and the billing rule (`usage`), idempotency keys (`keys`), the stores
(`store`: SQLite in WAL mode by default, PostgreSQL for a ledger shared by several gateway
processes), reading usage back (`summary`) and checking a ledger against a run (`verify`).
Does not decide when a request ends or what it delivered: the gateway does, and calls
`Ledger.record` once per attempt. The decisions it applies are `fleetwise.spec.failure_domains`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from fleetwise.ledger.keys import IdempotencyKeyError, check_key, generate_key, idempotency_key
from fleetwise.ledger.usage import Billed, LedgerRow, Status, Usage, WorkItem, billed
from fleetwise.ledger.verify import RunRecord, VerifyReport, load_run_records, verify

if TYPE_CHECKING:
    from fleetwise.ledger.backends import open_ledger
    from fleetwise.ledger.store import Ledger, Outcome

_STORES = {"open_ledger": "backends", "Ledger": "store", "Outcome": "store"}
"""The stores (SQLite, PostgreSQL), loaded on first use: the simulator bills through `usage`
and must not load them with it."""


def __getattr__(name: str) -> Any:
    home = _STORES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"fleetwise.ledger.{home}"), name)


__all__ = [
    "Billed",
    "IdempotencyKeyError",
    "Ledger",
    "LedgerRow",
    "Outcome",
    "RunRecord",
    "Status",
    "Usage",
    "VerifyReport",
    "WorkItem",
    "billed",
    "check_key",
    "generate_key",
    "idempotency_key",
    "load_run_records",
    "open_ledger",
    "verify",
]
