"""`fleetwise cli-doc [-o docs/cli.md] [--check]` (hidden): the table of every command's flags, from the parsers.

Owns the command line's vocabulary: `SHARED_FLAGS`, the one meaning of each flag name that more
than one command takes (tests/cli/test_cli_doc.py checks every shared name is declared here and
takes the same kind of value everywhere), and docs/cli.md, generated from the parsers themselves
with `render()` (the same test fails when the file is stale). Renamed flags keep their old
spelling as hidden aliases (`common.rename_flag`); the document lists them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fleetwise.cli.common import RenamedFlag

DOC_PATH = Path("docs/cli.md")
"""Where the generated flag table lives in the repository."""

SHARED_FLAGS: dict[str, str] = {
    "--faults": "a fault scenario file (one vocabulary: `simulate` runs it, `up` and `emulate --plan` replay it live)",
    "--gpu": "an accelerator: a catalog name (`fleetwise catalog gpus`) or an AcceleratorSpec file",
    "--gpu-memory-utilization": "fraction of each GPU's memory the engine may use (0-1]",
    "--host": "the address a server listens on",
    "--json": "print the machine-readable JSON document on stdout instead of the tables or report",
    "--kv-dtype": "storage format of the KV cache (bf16, fp8)",
    "--ledger": "the usage ledger: a SQLite file (or sqlite:///PATH) or a postgresql:// URL",
    "--log-level": "the server's log level",
    "--max-num-batched-tokens": "the engine's token budget per step",
    "--model": "a model: a catalog name (`fleetwise catalog models`), a HF config.json or repo id, or a ModelSpec file",
    "--open": "open the written HTML report in the default browser",
    "--out": "the directory the command writes its results into",
    "--output": "the file the command writes (-o)",
    "--over-context": "what a request longer than the model's context does: reject the run, truncate it, or skip it",
    "--plan": "a fleet document: a plan YAML, `fleetwise plan --fleet-out`, or a whole `plan --json` file",
    "--policy": "a routing policy preset (`fleetwise.spec.routing.PRESETS`)",
    "--port": "the TCP port a server listens on",
    "--profile": "a calibrated perf profile JSON (`fleetwise calibrate`)",
    "--quiet": "no progress display",
    "--report": "also write the HTML report of the result to this .html file",
    "--served-model-name": "the model name clients send in requests (vLLM's flag of that name)",
    "--seed": "seed of the command's random streams (same seed, same output)",
    "--time-scale": "modelled (engine) seconds per wall second of emulated replicas: 10 runs ten times faster",
    "--tp": "tensor-parallel degree of one replica",
    "--trace": "a workload trace file replayed as the traffic (Azure CSV, Mooncake JSONL, BurstGPT CSV, ...)",
    "--trace-columns": "the trace file's own column (CSV) or field (JSONL) names",
    "--weight-dtype": "storage format of the model weights (bf16, fp8, int4)",
    "--workers": "number of worker processes the command spreads its work over (plan: simulations; gateway: servers on one port)",
}
"""Meaning of each flag name used by more than one command: one name, one meaning, one kind of value."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("cli-doc", description="Write docs/cli.md, the flag table of every command, "
                                                     "from the parsers (hidden: a maintainer's tool).")
    p.add_argument("-o", "--output", default=str(DOC_PATH), metavar="FILE.md", help=f"where (default {DOC_PATH})")
    p.add_argument("--check", action="store_true", help="exit 1 if the file differs from what would be written")
    p.set_defaults(func=run)


def commands(parser: argparse.ArgumentParser | None = None) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(`fleetwise plan`, parser) of every listed command and sub-command, in help order."""
    from fleetwise.cli.main import build_parser

    root = parser or build_parser()
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {a.dest for a in action._choices_actions}
            for name, sub in action.choices.items():
                if name in listed:
                    yield from _walk(f"{root.prog} {name}", sub)


def _walk(prog: str, parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prog, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _walk(f"{prog} {name}", sub)


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """A parser's listed options (no -h, no renamed spellings)."""
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS
            and not isinstance(a, argparse._HelpAction | RenamedFlag)]


def renamed(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """(old spelling, new spelling) of each renamed flag a parser still accepts."""
    return [(o, a.target.option_strings[-1]) for a in parser._actions if isinstance(a, RenamedFlag)
            for o in a.option_strings]


def takes_value(a: argparse.Action) -> bool:
    """Whether the flag needs a value (`--json` with an optional value counts as a switch)."""
    return not (a.nargs == 0 or (a.nargs == "?" and a.const is not None))


def _cell(text: str) -> str:
    return " ".join(str(text).replace("%%", "%").replace("|", "\\|").split())


def _value(a: argparse.Action) -> str:
    if not takes_value(a):
        return ""
    if a.choices is not None:
        return "{" + ",".join(str(c) for c in a.choices) + "}"
    return str(a.metavar or a.dest.upper())


def render() -> str:
    """docs/cli.md: the shared vocabulary, the renamed flags and every command's flags."""
    cmds = list(commands())
    users: dict[str, list[str]] = {}
    for prog, parser in cmds:
        for a in options(parser):
            for o in a.option_strings:
                if o.startswith("--"):
                    users.setdefault(o, []).append(prog.removeprefix("fleetwise "))
    out = ["# Command-line flags", "",
           "Generated from the parsers by `fleetwise cli-doc` (`fleetwise.cli.doc_cmd`); "
           "`tests/cli/test_cli_doc.py` fails when this file is stale or when a flag name means two things.", "",
           "## Shared flags: one name, one meaning", "",
           "| flag | meaning | commands |", "|---|---|---|"]
    out += [f"| `{f}` | {_cell(SHARED_FLAGS[f])} | {', '.join(sorted(set(users[f])))} |"
            for f in sorted(SHARED_FLAGS) if f in users]
    out += ["", "## Renamed flags", "",
            "The old spelling still works: it prints one line naming the new one.", "",
            "| command | old | new |", "|---|---|---|"]
    out += [f"| {prog} | `{old}` | `{new}` |" for prog, parser in cmds for old, new in renamed(parser)]
    for prog, parser in cmds:
        out += ["", f"## {prog}", "", _cell(parser.description or ""), "", "| flag | value | help |", "|---|---|---|"]
        for a in parser._actions:
            if not a.option_strings and not isinstance(a, argparse._SubParsersAction) and a.help != argparse.SUPPRESS:
                out.append(f"| `{a.dest}` (positional) | {_value(a) if a.choices else a.metavar or a.dest} | "
                           f"{_cell(a.help or '')} |")
        for a in options(parser):
            out.append(f"| `{', '.join(a.option_strings)}` | {_cell(_value(a))} | {_cell(a.help or '')} |")
    return "\n".join(out) + "\n"


def run(args: argparse.Namespace) -> int:
    text = render()
    path = Path(args.output)
    if args.check:
        current = path.read_text(encoding="utf-8") if path.is_file() else ""
        if current != text:
            print(f"{path} is stale; regenerate it with `fleetwise cli-doc -o {path}`", file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0
