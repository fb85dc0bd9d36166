"""Progress display for long commands: a rich bar with time left on stderr, only for a person.

Quiet when stderr is not a terminal (pipes, CI, captured test output) or with `--quiet`, so
output that is read by programs never carries progress text.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Update = Callable[[float], None]


def add_quiet_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress display (it is also off when "
                                                             "stderr is not a terminal)")


def wanted(quiet: bool) -> bool:
    """Whether to show progress: not asked to be quiet and stderr is a terminal."""
    return not quiet and sys.stderr.isatty()


@contextmanager
def progress(label: str, total: float | None, quiet: bool) -> Iterator[Update]:
    """Yield `update(done)`: a bar with the estimated time left (`total` known), or a spinner with
    the elapsed time (`total` None); a no-op when progress is not wanted."""
    if not wanted(quiet):
        yield lambda done: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        SpinnerColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(file=sys.stderr)
    if total is None:
        columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    else:
        columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),  # type: ignore[assignment]
                   TextColumn("time left"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.update(task, completed=done)
