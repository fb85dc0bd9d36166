"""The trace formats registry: each format is one small module here that registers its reader.

A new format: a module in this package with a function `read(p: Path) -> TraceTable` decorated
`@trace_format("name", columns=(...), json=False)`; it is found and imported when this package
loads (no list to edit). `columns` are the CSV columns (or JSON fields) the format needs: header
auto-detection picks the first registered format, in module-name order, whose columns the file's
header has. Readers parse through `fleetwise.workload.parse` so errors name file, line and column.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleetwise.errors import SpecError, quote
from fleetwise.registry import Registry
from fleetwise.workload.parse import TraceTable

Reader = Callable[[Path], TraceTable]

COLUMNS_HINT = ("map your own columns with --trace-columns arrival=COL,prompt=COL,output=COL (in a workload or "
                "planning file: the trace arrival's columns: {arrival: COL, prompt: COL, output: COL})")
"""How a file in no registered format can still be read (`fleetwise.workload.columns`)."""


@dataclass(frozen=True)
class TraceFormat:
    """A registered trace format: its name, the columns (JSON fields) it needs, and its reader."""

    name: str
    columns: tuple[str, ...]
    json: bool
    """True for JSON-lines files (detected from a first line starting with `{`)."""
    read: Reader


TRACE_FORMATS: Registry[str, TraceFormat] = Registry("trace format")
"""Format name -> its registration, in registration (module-name) order."""


def trace_format(name: str, columns: tuple[str, ...], *, json: bool = False) -> Callable[[Reader], Reader]:
    """Register the decorated reader as trace format `name` needing `columns`."""
    return TRACE_FORMATS.register(name, lambda read: TraceFormat(name, tuple(columns), json, read))


def supported() -> str:
    """Every registered format with the columns it needs, for error messages."""
    return "; ".join(f"{f.name} ({', '.join(f.columns)})" for f in TRACE_FORMATS.values())


def get_format(name: str, field: str = "format") -> TraceFormat:
    """The registered format `name`; SpecError naming `field`, the registered names and `--trace-columns`."""
    f = TRACE_FORMATS.get(name)
    if f is None:
        raise SpecError(f"{field} {quote(name, 40)} is not a trace format; supported: {supported()}; or {COLUMNS_HINT}")
    return f


for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
