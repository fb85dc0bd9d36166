"""`fleetwise report RESULT [-o report.html] [--open]`, and the `--report FILE.html` flag that
`plan`, `simulate` and `scenarios` share.

Owns argument handling and where the file goes; the page is `fleetwise.report.write_report`.
RESULT is a `simulate --out` or `scenarios --out` directory, a summary.json or scenarios.json,
or a plan JSON (`plan --json FILE`). Default output: `RESULT/report.html` for a directory,
`<stem>.html` beside a file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fleetwise.cli import progress
from fleetwise.cli.common import rename_flag
from fleetwise.errors import SpecError
from fleetwise.spec.output import check_writable_file


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report", help="write a self-contained HTML report (with figures) of a simulation, scenario run or plan",
        description="One HTML file that opens offline (figures embedded), with each figure also written as PNG "
                    "and SVG in <name>_figures/ beside it.",
    )
    p.add_argument("result", help="a simulate/scenarios --out directory, summary.json, scenarios.json or plan JSON")
    out = p.add_argument("-o", "--output", default=None, metavar="FILE.html",
                         help="output file (default: RESULT/report.html, or <stem>.html beside a JSON file)")
    rename_flag(p, "--out", out)  # --out is a command's output directory everywhere else
    add_open_flag(p)
    progress.add_quiet_flag(p)
    p.set_defaults(func=run)


def add_report_flag(parser: argparse.ArgumentParser) -> None:
    """`--report FILE.html` and `--open` on a command that writes a result."""
    parser.add_argument("--report", default=None, metavar="FILE.html",
                        help="also write the HTML report of this result (figures beside it as PNG/SVG)")
    add_open_flag(parser)


def add_open_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--open", action="store_true", help="open the report in the default web browser")


def check_report_path(path: str | None) -> None:
    """Fail before a long run, not after it: the report must be an .html file in a writable place."""
    if path is None:
        return
    if Path(path).suffix.lower() not in (".html", ".htm"):
        raise SpecError(f"--report={path}: the report is an HTML file; name it like {Path(path).stem}.html")
    if Path(path).is_dir():
        raise SpecError(f"--report={path} is a directory; give a file name such as {Path(path) / 'report.html'}")
    check_writable_file(path, "--report", make_folders=True)  # its folder is made if missing


def write_document(doc: dict[str, Any], out: str | Path, open_it: bool, quiet: bool = False) -> Path:
    """Write the report of a result document held in memory (a plan, a scenario run)."""
    from fleetwise.report import document_page

    with progress.progress("drawing the report", 1.0, quiet) as update:
        path = document_page(doc, progress=update if progress.wanted(quiet) else None).write(out)
    return _done(path, open_it)


def default_out(result: Path) -> Path:
    return result / "report.html" if result.is_dir() else result.with_suffix(".html")


def write(result: Path, out: str | Path, open_it: bool, quiet: bool = False) -> Path:
    """Write the report of `result` to `out`, say where (stderr), and open it when asked."""
    from fleetwise.report import write_report

    with progress.progress("drawing the report", 1.0, quiet) as update:
        path = write_report(result, out, update if progress.wanted(quiet) else None)
    return _done(path, open_it)


def _done(path: Path, open_it: bool) -> Path:
    print(f"report: {path} (figures in {path.stem}_figures/)", file=sys.stderr)
    if open_it:
        import webbrowser

        webbrowser.open(path.resolve().as_uri())
    return path


def run(args: argparse.Namespace) -> int:
    result = Path(args.result)
    out = Path(args.output) if args.output else default_out(result)
    check_report_path(str(out))
    write(result, out, args.open, args.quiet)
    return 0
