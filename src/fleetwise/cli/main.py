"""Entry point of the `fleetwise` console script.

Every subcommand module exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. User errors (`FleetwiseError`, a spec's validation error, a bad flag) become
one line on stderr and exit code 2, never a traceback. Anything else is a fault of fleetwise: one
line naming it and exit code 70 (`FLEETWISE_DEBUG=1` re-raises it with the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from pydantic import ValidationError

from fleetwise import __version__
from fleetwise.errors import FleetwiseError, quote
from fleetwise.spec.base import describe_validation_error

EXIT_USER_ERROR = 2
"""Exit code of a mistake in a spec, a name, a file or a flag (as argparse uses)."""
MAX_USAGE_ERROR_CHARS = 200
"""Longest argparse message kept (it would quote an 8 MB argument whole)."""
MAX_ERROR_LINE_CHARS = 299
"""Longest error line printed: one terminal line's worth, the field and fix come first."""
EXIT_INTERNAL_ERROR = 70
"""Exit code of a fault in fleetwise itself (BSD sysexits EX_SOFTWARE)."""

BLAS_THREADS = {"OPENBLAS_NUM_THREADS": "1"}
"""Thread pools of the BLAS numpy loads, unless the environment sets them: one thread. OpenBLAS
starts one spinning thread per core when numpy is imported (about 0.06 CPU s per process on
the 2-core machine of docs/simulator.md, "Whole process against Vidur"), and fleetwise's arrays
(percentiles, fits of a few parameters) are too small to gain from more; planner workers inherit it."""

# Modules under fleetwise.cli that provide subcommands, in help order.
SUBCOMMAND_MODULES = ("plan_cmd", "simulate_cmd", "scenarios_cmd", "report_cmd", "fit_cmd", "catalog_cmd", "perf_cmd",
                      "ledger_cmd", "gateway_cmd", "emulate_cmd", "deploy_cmd", "up_cmd", "doc_cmd")


class OneLineParser(argparse.ArgumentParser):
    """argparse with its usage errors as one line (`fleetwise simulate: error: ...`), exit code 2."""

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # argparse drops a lone `--` given as an option's value (`--gpu=--`) and passes [] on
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected a value, got '--'")
        return super()._get_values(action, arg_strings)

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())
        if len(message) > MAX_USAGE_ERROR_CHARS:  # argparse quotes the whole value and every choice
            message = message[: MAX_USAGE_ERROR_CHARS - 3] + "..."
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def one_line(message: str) -> str:
    """`message` on one line of at most MAX_ERROR_LINE_CHARS (a very long file path can push it over)."""
    text = " ".join(message.split())
    return text if len(text) <= MAX_ERROR_LINE_CHARS else text[: MAX_ERROR_LINE_CHARS - 3] + "..."


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every command, or only `command`'s where its module is
    `<command>_cmd` and registers it (a run of one command then imports that module alone, not
    the gateway, emulator, scenario and report stacks of the others); else every command."""
    parser = OneLineParser(
        prog="fleetwise",
        description="Plan, verify and run parallel and PD-disaggregated LLM inference fleets.",
    )
    parser.add_argument("--version", action="version", version=f"fleetwise {__version__}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    own = f"{(command or '').replace('-', '_')}_cmd"
    if own in SUBCOMMAND_MODULES:
        _register(subs, own)
        if command in subs.choices:
            return parser
        return build_parser()  # the command lives in another module: register them all
    for mod_name in SUBCOMMAND_MODULES:
        _register(subs, mod_name)
    return parser


def _register(subs: Any, mod_name: str) -> None:
    try:
        mod = importlib.import_module(f"fleetwise.cli.{mod_name}")
    except ModuleNotFoundError as err:
        if err.name == f"fleetwise.cli.{mod_name}":
            return
        raise
    mod.register(subs)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `fleetwise` command line on `argv` (default: sys.argv[1:]); returns the exit code (0, 1, 2 or 70)."""
    for name, value in BLAS_THREADS.items():
        os.environ.setdefault(name, value)
    args_in = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(args_in[0] if args_in else None)
    try:
        args = parser.parse_args(args_in)
    except SystemExit as done:  # --help, --version, or a usage error already printed
        return done.code if isinstance(done.code, int) else EXIT_USER_ERROR
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except FleetwiseError as err:
        print(one_line(f"fleetwise {args.command}: error: {err}"), file=sys.stderr)
        return EXIT_USER_ERROR
    except ValidationError as err:
        print(one_line(f"fleetwise {args.command}: error: {describe_validation_error(err, 'arguments')}"),
              file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if os.environ.get("FLEETWISE_DEBUG"):
            raise
        print(f"fleetwise {args.command}: internal error: {type(err).__name__}: {quote(str(err), 160)} "
              "(a fault in fleetwise, not in your input; rerun with FLEETWISE_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
