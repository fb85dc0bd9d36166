"""Entry point of the `fleetwise` console script.

Every subcommand module exposes `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. User errors (`FleetwiseError`) become one line on stderr and exit code 2,
never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from fleetwise import __version__
from fleetwise.errors import FleetwiseError

# Modules under fleetwise.cli that provide subcommands, in help order.
SUBCOMMAND_MODULES = ("plan_cmd", "simulate_cmd", "scenarios_cmd", "fit_cmd", "catalog_cmd", "perf_cmd", "ledger_cmd",
                      "gateway_cmd", "emulate_cmd")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetwise",
        description="Plan, verify and run parallel and PD-disaggregated LLM inference fleets.",
    )
    parser.add_argument("--version", action="version", version=f"fleetwise {__version__}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod_name in SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(f"fleetwise.cli.{mod_name}")
        except ModuleNotFoundError as err:
            if err.name == f"fleetwise.cli.{mod_name}":
                continue
            raise
        mod.register(subs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except FleetwiseError as err:
        print(f"fleetwise {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
