"""L6: reports people look at, built from the documents the lower layers write.

Owns the self-contained HTML report of a simulation run, a scenario run or a plan (figures as
SVG inside the page, plus PNG/SVG files beside it), the Chrome/Perfetto trace export of a
simulation (`perfetto`), and the live fleet page a gateway serves (`dashboard`). It reads
results (summary.json + requests.csv, scenarios.json, the plan JSON) and never changes them.

Entry points: `write_report(result, out_html)`, `report_page(result)`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetwise.errors import SpecError, quote

if TYPE_CHECKING:
    from fleetwise.report.page import Page, Progress

RESULT_FILES = ("summary.json", "scenarios.json")
"""What a result directory holds: a simulation run or a scenario run."""


def _result_file(path: Path) -> Path:
    if path.is_dir():
        for name in RESULT_FILES:
            if (path / name).is_file():
                return path / name
        raise SpecError(f"{path}: no {' or '.join(RESULT_FILES)} in this directory; give a simulation or "
                        "scenarios --out directory, or a plan JSON (`fleetwise plan --json FILE`)")
    if not path.is_file():
        raise SpecError(f"{path}: no such file or directory; give a result directory or JSON file")
    return path


def report_page(result: str | Path, progress: Progress | None = None) -> Page:
    """The report page of a result: a run directory, summary.json, scenarios.json or a plan JSON
    (`progress`: told the share of its figures drawn, 0..1)."""
    path = _result_file(Path(result))
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SpecError(f"{path}: not JSON ({err}); give a result written by fleetwise") from None
    try:
        return document_page(doc, path, progress)
    except (KeyError, IndexError, TypeError) as err:  # a file edited or cut short: not the shape its writer gives
        raise SpecError(f"{path}: not a whole result as fleetwise writes it ({type(err).__name__}: "
                        f"{quote(str(err), 60)}); give the file the command wrote, or run the command again") from None


def document_page(doc: Any, path: Path | None = None, progress: Progress | None = None) -> Page:
    """The report page of a result document already in memory (`path`: where it was read from)."""
    from fleetwise.report import plan_report, scenario_report, sim_report  # noqa: F401  (register kinds)
    from fleetwise.report.registry import KINDS

    schema = doc.get("schema", "") if isinstance(doc, dict) else ""
    for prefix, build in KINDS.items():
        if isinstance(schema, str) and schema.startswith(prefix):
            return build(path, doc, progress)
    raise SpecError(f"{path or 'document'}: schema={schema!r} is not a fleetwise result; known: "
                    f"{', '.join(k + '*' for k in KINDS)}")


def write_report(result: str | Path, out_html: str | Path, progress: Progress | None = None) -> Path:
    """Write the HTML report of `result` to `out_html` (figures as PNG/SVG beside it); returns the path."""
    return report_page(result, progress).write(out_html)
