"""`fleetwise ledger summary|verify`: read usage back from a ledger, check it against a run.

    fleetwise ledger summary --ledger URL [--tenant T] [--since TIME] [--json]
    fleetwise ledger verify --ledger URL --records FILE [--json]
URL: a SQLite file path (or sqlite:///PATH) or postgresql://...; default $FLEETWISE_LEDGER.
Owns argument handling and printing; the ledger is `fleetwise.ledger`. `verify` exits 1 when
the ledger and the records disagree.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import re
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetwise.cli.common import add_json_flag, emit_json, input_file
from fleetwise.errors import SpecError, quote
from fleetwise.ledger import load_run_records, open_ledger, verify
from fleetwise.ledger.spool import spooled_records
from fleetwise.spec.inputs import check_file

LEDGER_ENV = "FLEETWISE_LEDGER"
"""Environment variable naming the ledger when --ledger is not given."""
_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("ledger", help="read usage back from a metering ledger; verify it against a run",
                              description="Usage ledger written by the gateway: one record per idempotency key.")
    subs = p.add_subparsers(dest="ledger_command", metavar="ACTION", required=True)
    s = subs.add_parser("summary", help="billed usage per tenant and per pool, with the work done")
    _ledger_arg(s)
    s.add_argument("--tenant", metavar="T", help="only this tenant")
    s.add_argument("--since", metavar="TIME",
                   help="only requests ended at or after TIME: ISO 8601 (UTC when no zone), UNIX seconds, "
                        "or an age such as 15m, 2h, 1d")
    add_json_flag(s)
    s.set_defaults(func=run_summary)
    v = subs.add_parser("verify", help="check the ledger against a run's request records (exit 1 on mismatch)")
    _ledger_arg(v)
    v.add_argument("--records", required=True, metavar="FILE", type=input_file("records file"),
                   help="the run's request records: requests.csv or a request log (.csv or .jsonl)")
    v.add_argument("--spool", metavar="PATH", default=None,
                   help="a gateway's ledger spool: records still waiting there are reported (not yet billed)")
    add_json_flag(v)
    v.set_defaults(func=run_verify)


def _ledger_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ledger", metavar="URL", default=None,
                   help=f"SQLite file (or sqlite:///PATH) or postgresql://... (default ${LEDGER_ENV})")


def _ledger_url(args: argparse.Namespace) -> str:
    url = args.ledger or os.environ.get(LEDGER_ENV)
    if not url:
        raise SpecError(f"no ledger: pass --ledger URL or set {LEDGER_ENV}")
    flag = "--ledger" if args.ledger else LEDGER_ENV
    if "://" not in url or url.startswith("sqlite:///"):  # a SQLite file a reader needs to exist
        try:
            check_file(url.removeprefix("sqlite:///"), "ledger file")
        except SpecError as err:
            raise SpecError(f"{flag}: {err}; pass the ledger a gateway wrote to") from None
    return str(url)


def parse_since(text: str, now_s: float) -> float:
    """UNIX seconds from an ISO 8601 time, UNIX seconds, or an age (`15m`, `2h`, `1d`) before `now_s`."""
    m = _AGO.match(text.strip())
    if m:
        return now_s - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(value):
            return value
        raise SpecError(f"--since={quote(text)}: not a finite time; use ISO 8601, UNIX seconds or an age like 2h")
    try:
        t = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SpecError(f"--since={quote(text)} is not a time; use ISO 8601 (2026-12-01T03:00:00Z), UNIX seconds "
                        "or an age such as 15m, 2h, 1d") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp()


def run_summary(args: argparse.Namespace) -> int:
    since = parse_since(args.since, dt.datetime.now(dt.UTC).timestamp()) if args.since else None
    with open_ledger(_ledger_url(args), create=False) as led:
        doc = led.summary(args.tenant, since)
    if args.json:
        emit_json(doc)
        return 0
    con = Console()
    cols = ("requests", "completed", "cancelled", "failed", "duplicate_attempts", "billed_prompt_tokens",
            "billed_cached_tokens", "billed_generated_tokens", "delivered_tokens", "computed_tokens", "gpu_s",
            "recovery_gpu_s")
    t = Table(title="usage per tenant")
    t.add_column("tenant")
    for c in cols:
        t.add_column(c.replace("_tokens", "").replace("_", " "), justify="right")
    for name, d in [*doc["tenants"].items(), ("(total)", doc["total"])]:
        t.add_row(name, *(_fmt(d[c]) for c in cols))
    con.print(t)
    pcols = ("billed_prompt_tokens", "billed_cached_tokens", "billed_generated_tokens", "computed_tokens",
             "gpu_s", "recovery_gpu_s")
    pt = Table(title="usage per pool")
    pt.add_column("pool")
    for c in pcols:
        pt.add_column(c.replace("_tokens", "").replace("_", " "), justify="right")
    for name, d in doc["pools"].items():
        pt.add_row(name, *(_fmt(d[c]) for c in pcols))
    con.print(pt)
    return 0


def run_verify(args: argparse.Namespace) -> int:
    records = load_run_records(args.records)
    with open_ledger(_ledger_url(args), create=False) as led:
        rep = verify(led.rows(), records)
    if args.spool:
        waiting = spooled_records(args.spool)
        if waiting:
            rep.problems.append({"tenant": "*", "idempotency_key": "*", "problem": (
                f"{len(waiting)} usage record(s) still in the spool {args.spool} (the ledger was unreachable); "
                "they are replayed when the gateway reaches the ledger again")})
    if args.json:
        emit_json(rep.to_dict())
    else:
        con = Console()
        verdict = "[green]ok[/green]" if rep.ok else f"[red]{len(rep.problems)} problem(s)[/red]"
        con.print(f"{rep.records} records, {rep.keys} keys ({rep.completed_keys} completed), "
                  f"{rep.rows} ledger rows: {verdict}")
        for p in rep.problems:
            con.print(f"  {p['tenant']}/{p['idempotency_key']}: {p['problem']}", markup=False, highlight=False)
    return 0 if rep.ok else 1


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)
