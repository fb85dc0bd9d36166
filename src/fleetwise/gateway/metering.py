"""The gateway's side of metering: opening the ledger with its spool and background writer, and
what the ledger's state means for /readiness and /metrics.

The ledger itself, the spool and the writer are `fleetwise.ledger`; this module only chooses the
spool's path and reads the writer's state for the gateway's surfaces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetwise.gateway.config import GatewayConfig
from fleetwise.ledger import open_ledger
from fleetwise.ledger.spool import Spool
from fleetwise.ledger.writer import LedgerWriter

__all__ = ["DEFAULT_SHARED_SPOOL", "ledger_ready", "open_writer", "spool_path"]

DEFAULT_SHARED_SPOOL = "fleetwise-ledger.spool"
"""Spool file (in the working directory) of a gateway whose ledger is a PostgreSQL server."""


def spool_path(cfg: GatewayConfig) -> Path:
    """Where usage records are spooled while the ledger is unreachable (see `LedgerOutageSpec`)."""
    if cfg.ledger_outage.spool_path:
        return Path(cfg.ledger_outage.spool_path)
    url = str(cfg.ledger)
    if "://" in url and not url.startswith("sqlite:///"):
        return Path(DEFAULT_SHARED_SPOOL)
    return Path(url.removeprefix("sqlite:///") + ".spool")


def open_writer(cfg: GatewayConfig) -> LedgerWriter | None:
    """The gateway's ledger writer (None without a ledger); the spool of an earlier run is replayed first."""
    if not cfg.ledger:
        return None
    ledger = open_ledger(cfg.ledger, cfg.failure_domains)
    o = cfg.ledger_outage
    return LedgerWriter(ledger, Spool(spool_path(cfg), o.max_spool_bytes), commit_wait_s=o.commit_wait_s,
                        retry_s=o.retry_s)


def ledger_ready(writer: LedgerWriter | None, cfg: GatewayConfig) -> tuple[bool, dict[str, Any] | None]:
    """(ready as far as metering goes, the /readiness `ledger` entry): not ready while records are
    lost, or while spooling when `unready_when_degraded`."""
    if writer is None:
        return True, None
    st = writer.state()
    state = "failing" if st["spool_failing"] else "degraded" if st["degraded"] else "ok"
    ready = state == "ok" or (state == "degraded" and not cfg.ledger_outage.unready_when_degraded)
    return ready, {"state": state, "spool_records": st["spool_records"], "lost_records": st["lost"]}
