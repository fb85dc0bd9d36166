"""Errors a user can cause, each carrying a message that names the field, the value and the fix.

This module sits below every layer (stdlib only) so specs, perf, engine and sim can all raise
the same family. The CLI turns any `FleetwiseError` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FleetwiseError(Exception):
    """Base class: something the user asked for cannot be done as written."""


class SpecError(FleetwiseError):
    """A spec, config file or command-line value is invalid."""


class UnknownNameError(SpecError):
    """A catalog lookup failed; the message lists the closest known names."""

    def __init__(self, kind: str, name: str, known: Iterable[str]) -> None:
        known = sorted(known)
        close = difflib.get_close_matches(name.lower(), known, n=4, cutoff=0.3)
        hint = f"closest known: {', '.join(close)}" if close else f"known: {', '.join(known)}"
        super().__init__(f"unknown {kind} {name!r}; {hint} (see `fleetwise catalog {kind}s`)")
        self.kind, self.name, self.closest = kind, name, close


class InfeasibleError(FleetwiseError):
    """The request is well formed but physically impossible (does not fit, SLO below minimum)."""
