"""Metering: one usage record per request, written once when it ends, in a crash-safe ledger.

Owns the usage record and the billing rule (`usage`), idempotency keys (`keys`), the stores
(`store`: SQLite in WAL mode by default, PostgreSQL for a ledger shared by several gateway
processes), reading usage back (`summary`) and checking a ledger against a run (`verify`).
Does not decide when a request ends or what it delivered: the gateway does, and calls
`Ledger.record` once per attempt. The decisions it applies are `fleetwise.spec.failure_domains`.
"""

from fleetwise.ledger.backends import open_ledger
from fleetwise.ledger.keys import IdempotencyKeyError, check_key, generate_key, idempotency_key
from fleetwise.ledger.store import Ledger, Outcome
from fleetwise.ledger.usage import Billed, LedgerRow, Status, Usage, WorkItem, billed
from fleetwise.ledger.verify import RunRecord, VerifyReport, load_run_records, verify

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
