"""`Spool`: usage records kept in a local append-only file while the ledger cannot take them.

One JSON object per line (a `Usage` with its work items); every append is flushed and fsynced
before it returns, so a record the gateway acknowledged survives a crash of the gateway and of
the host. A line cut by a crash mid-append was never acknowledged and is skipped when read. The
file is locked (`flock`) by the one process that writes it: a second process takes the next free
name (`PATH.1`, `PATH.2`, ...), and a restarted process takes its old file back and replays it.
Replayed records are skipped in memory and the file is emptied only once all of it was replayed,
so a record is never rewritten; one replayed twice (after a crash) is a no-op in the ledger,
which applies each record once (`fleetwise.ledger.store.record_id`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fleetwise.errors import SpecError
from fleetwise.ledger.usage import Usage, WorkItem
from fleetwise.spec.output import strict_json_dumps

__all__ = ["MAX_SPOOL_FILES", "Spool", "SpoolFull", "spooled_records", "usage_from_json", "usage_to_json"]

log = logging.getLogger("fleetwise.ledger")

MAX_SPOOL_FILES = 64
"""Processes that can spool beside one another under one configured path (`PATH`, `PATH.1`, ...)."""


class SpoolFull(OSError):
    """The spool reached its size limit; the record was not kept."""


def usage_to_json(u: Usage) -> bytes:
    """One spool line for `u` (without the newline)."""
    d = asdict(u)
    d["work"] = [asdict(w) for w in u.work]
    return strict_json_dumps(d, indent=None, separators=(",", ":")).encode()


def usage_from_json(line: bytes) -> Usage:
    """The `Usage` of one spool line (ValueError/TypeError/KeyError when it is not one)."""
    d: dict[str, Any] = json.loads(line)
    work = tuple(WorkItem(**w) for w in d.pop("work"))
    return Usage(**d, work=work)


def spooled_records(path: str | Path) -> list[Usage]:
    """Records waiting in the spool file at `path` and its siblings (`PATH.1`, ...), read without
    taking them (a missing file holds none). A spool replayed in part may list records the ledger
    has already; replaying them again changes nothing."""
    base = Path(path)
    out: list[Usage] = []
    for i in range(MAX_SPOOL_FILES):
        cand = base if i == 0 else base.with_name(f"{base.name}.{i}")
        if cand.is_file():
            out += _parse(cand.read_bytes(), cand)
    return out


def _parse(data: bytes, path: Path) -> list[Usage]:
    out: list[Usage] = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            out.append(usage_from_json(line))
        except (ValueError, TypeError, KeyError):  # a line cut by a crash mid-append: never acknowledged
            log.warning("ledger spool %s: skipping a damaged line (%d bytes)", path, len(line))
    return out


class Spool:
    """An fsynced append-only file of usage records, owned by this process (thread-safe)."""

    def __init__(self, path: str | Path, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        base = Path(path)
        if not base.parent.is_dir():
            raise SpecError(f"ledger spool {str(base)!r}: directory {str(base.parent)!r} does not exist; "
                            "create it or set ledger_outage.spool_path")
        for i in range(MAX_SPOOL_FILES):
            cand = base if i == 0 else base.with_name(f"{base.name}.{i}")
            fd = os.open(cand, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.path, self._fd = cand, fd
            break
        else:
            raise SpecError(f"ledger spool {str(base)!r}: all {MAX_SPOOL_FILES} spool files are held by other "
                            "processes; set ledger_outage.spool_path to another path")
        self._size = os.fstat(self._fd).st_size
        self._start = 0
        """Bytes at the head already replayed (kept until the whole file is)."""
        self._count = sum(1 for _ in self._lines(self._read(self._size)))

    def __len__(self) -> int:
        """Records waiting in the spool."""
        return self._count

    @property
    def size_bytes(self) -> int:
        """Bytes the spool file holds."""
        return self._size

    def append(self, usages: Sequence[Usage]) -> None:
        """Append records and fsync; SpoolFull (nothing written) when the size limit would be passed,
        OSError (nothing kept) when the disk refuses them."""
        data = b"".join(usage_to_json(u) + b"\n" for u in usages)
        with self._lock:
            if self._size + len(data) > self.max_bytes:
                raise SpoolFull(f"ledger spool {self.path} is full ({self._size} of {self.max_bytes} bytes)")
            try:
                done = 0
                while done < len(data):  # a write on a filling disk may take only part of the data
                    done += os.write(self._fd, data[done:])
                os.fsync(self._fd)
            except OSError:
                # Nothing of it kept: a cut line would run into the next append and spoil that record.
                os.ftruncate(self._fd, self._size)
                raise
            self._size += len(data)
            self._count += len(usages)

    def pending(self) -> tuple[list[Usage], int]:
        """The records waiting, oldest first, and the byte offset they end at (for `consumed`)."""
        with self._lock:
            end = self._size
            data = self._read(end)[self._start:]
        return self._lines(data), end

    def consumed(self, end: int, count: int) -> None:
        """The records up to byte `end` (`count` of them) are in the ledger: skip them; when nothing
        was appended after them, empty the file (fsynced)."""
        with self._lock:
            self._count = max(0, self._count - count)
            if end >= self._size:
                os.ftruncate(self._fd, 0)
                os.fsync(self._fd)
                self._size = self._start = self._count = 0
            else:
                self._start = max(self._start, end)

    def close(self) -> None:
        """Release the file (its records stay for the next process that takes it)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _read(self, end: int) -> bytes:
        return os.pread(self._fd, end, 0) if end else b""

    def _lines(self, data: bytes) -> list[Usage]:
        return _parse(data, self.path)
