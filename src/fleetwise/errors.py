"""Errors a user can cause, each carrying a message that names the field, the value and the fix.

This module sits below every layer (stdlib only) so specs, perf, engine and sim can all raise
the same family. The CLI turns any `FleetwiseError` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

QUOTE_CHARS = 60
"""Longest quote of a user's value in a message (the rest is elided), so a message stays one short line."""

CATALOG_KINDS = ("model", "gpu")
"""Kinds `fleetwise catalog` lists; other kinds' messages list the known names instead."""


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """`repr(value)` cut to `limit` characters; containers summarised by type and size first."""
    if isinstance(value, dict | list | tuple | set | frozenset):
        items = list(value)[:3]
        inner = ", ".join(quote(v, 20) for v in items) + (", ..." if len(value) > 3 else "")
        text = f"{type(value).__name__} of {len(value)} [{inner}]" if value else repr(value)
    elif isinstance(value, str | bytes | bytearray):
        text = repr(value[: limit * 2])
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: max(limit - 3, 1)] + "..."


class FleetwiseError(Exception):
    """Base class: something the user asked for cannot be done as written."""


class SpecError(FleetwiseError):
    """A spec, config file or command-line value is invalid."""


class UnknownNameError(SpecError):
    """A catalog lookup failed; the message lists the closest known names."""

    def __init__(self, kind: str, name: str, known: Iterable[str]) -> None:
        known = sorted(known)
        close = difflib.get_close_matches(name[:200].lower(), known, n=4, cutoff=0.3)
        hint = f"closest known: {', '.join(close)}" if close else f"known: {', '.join(known)}"
        see = f" (see `fleetwise catalog {kind}s`)" if kind in CATALOG_KINDS else ""
        super().__init__(f"unknown {kind} {quote(name)}; {hint}{see}")
        self.kind, self.name, self.closest = kind, name, close


class InfeasibleError(FleetwiseError):
    """The request is well formed but physically impossible (does not fit, SLO below minimum)."""
