"""Report kinds by document schema: each kind's module registers its builder once (`report_kind`).

A result is recognised by its `schema` field (`fleetwise-sim-summary/1`, `fleetwise-scenarios/1`,
`fleetwise-plan/1`); adding a kind is a new module with one decorated builder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetwise.report.page import Page, Progress
from fleetwise.spec.registry import register_into

Builder = Callable[[Path | None, dict[str, Any], Progress | None], Page]
"""(where the document was read from, or None; the document; told the share drawn) -> page."""
KINDS: dict[str, Builder] = {}


def report_kind(schema_prefix: str) -> Callable[[Builder], Builder]:
    """Register `fn(path, document, progress) -> Page` for documents whose schema starts with `schema_prefix`."""
    return register_into(KINDS, schema_prefix, "report kind")
