"""Helpers shared by subcommands: the --model/--gpu/--json arguments, flag checks, JSON output, console.

Owns argument spelling and output conventions so every subcommand reads the same way; does not
own any subcommand's logic. Flags are checked before any work: numeric flags by `int_flag` /
`float_flag` (finite, within bounds, as argparse types, so a bad value is one usage line), flags
that a spec also declares by that very spec (`spec_from_flags`, errors name the flag), and output
paths by `fleetwise.spec.inputs.check_writable_*`.
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from rich.console import Console

from fleetwise.errors import SpecError, quote
from fleetwise.spec.catalog import resolve_gpu, resolve_model
from fleetwise.spec.context import OVER_CONTEXT_POLICIES
from fleetwise.spec.hardware import AcceleratorSpec
from fleetwise.spec.inputs import check_file, out_of_bounds
from fleetwise.spec.model import ModelSpec
from fleetwise.spec.output import strict_json_dumps

T = TypeVar("T", bound=BaseModel)
N = TypeVar("N", int, float)

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
"""Server log levels (`--log-level` of gateway and emulate: Python logging's and uvicorn's names)."""
SEED_MAX = 2**63 - 1
"""Largest seed: numpy's SeedSequence takes non-negative integers; 63 bits keep it a C long."""


def int_flag(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """argparse type: a whole number within [minimum, maximum] (`--requests 0` is an error, not 'all')."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip().replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {quote(text)}") from None
        return _within(value, text, minimum, maximum, ",", " (see docs/errors.md)")

    parse.__name__ = "whole number"
    return parse


def _within(value: N, text: str, minimum: float | None, maximum: float | None, fmt: str,
            max_note: str = "") -> N:
    """`value` (parsed from `text`) if it lies in [minimum, maximum], else the argparse error saying which bound."""
    why = out_of_bounds(value, minimum, maximum, fmt, max_note)
    if why:
        raise argparse.ArgumentTypeError(f"{why}, got {quote(text)}")
    return value


def float_flag(minimum: float | None = None, maximum: float | None = None,
               positive: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number within [minimum, maximum] (> 0 when `positive`); never nan or inf."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {quote(text)}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {quote(text)}")
        if positive and value <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {quote(text)}")
        return _within(value, text, minimum, maximum, "g")

    parse.__name__ = "number"
    return parse


def input_file(what: str = "file") -> Callable[[str], str]:
    """argparse type: the path of an existing readable file (a typo is a usage line naming the flag,
    before any work); the file's content is read and checked later by `fleetwise.spec.inputs`."""

    def parse(text: str) -> str:
        try:
            check_file(text, what)
        except SpecError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text

    parse.__name__ = what
    return parse


def input_dir(text: str) -> str:
    """argparse type: the path of an existing directory."""
    p = Path(text)
    try:
        ok = p.is_dir()
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{quote(text, 200)}: not a directory; check the path")
    return text


def _bind_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on host:port now (None: it could), from a throw-away socket
    bound as servers bind (SO_REUSEADDR: a port another socket listens on is refused)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(addr)
            if port:
                probe.listen(1)
    except (OSError, UnicodeError, ValueError) as err:
        return str(getattr(err, "strerror", None) or err)
    return None


def check_listen_address(host: str, where: str = "--host") -> None:
    """SpecError naming `where` unless a server can bind `host` (an address of this machine or a
    name resolving to one); checked with a throw-away socket on an ephemeral port, before the
    server builds anything or binds its own port."""
    reason = _bind_problem(host, 0)
    if reason is not None:
        raise SpecError(f"{where}={quote(host)}: cannot listen on this address ({quote(reason, 80)}); "
                        "give an address of this machine, e.g. 127.0.0.1 or 0.0.0.0")


def check_port_free(host: str, port: int, what: str) -> None:
    """SpecError naming `what` when host:port is taken now (another server listens there)."""
    reason = _bind_problem(host, port)
    if reason is not None:
        raise SpecError(f"{what}: cannot listen on {host}:{port} ({quote(reason, 80)}); another server holds it: "
                        "stop it or pick a free --port")


class RenamedFlag(argparse.Action):
    """A flag's old spelling, kept working: hidden from --help, it prints one line naming the new
    spelling and then acts as the new flag's action (`rename_flag`)."""

    def __init__(self, option_strings: list[str], dest: str, target: argparse.Action, **kw: Any) -> None:
        super().__init__(option_strings, dest, **kw)
        self.target = target

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        new = self.target.option_strings[-1]
        print(f"{parser.prog}: {option_string} is deprecated, use {new} (same meaning)", file=sys.stderr)
        self.target(parser, namespace, values, new)


def rename_flag(parser: Any, old: str, new_action: argparse.Action) -> None:
    """Keep `old` working as a deprecated spelling of the flag `new_action` adds (scripts keep running)."""
    parser.add_argument(old, action=RenamedFlag, target=new_action, dest=new_action.dest, nargs=new_action.nargs,
                        const=new_action.const, type=new_action.type, choices=new_action.choices,
                        metavar=new_action.metavar, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def add_seed_arg(parser: argparse.ArgumentParser, help: str = "seed (default 0)") -> None:
    parser.add_argument("--seed", type=int_flag(0, SEED_MAX), default=0, metavar="S", help=help)


def spec_from_flags(model: type[T], flags: Mapping[str, tuple[str, Any]], **fixed: Any) -> T:
    """Validate flag values with the spec a file would use: `flags` maps field -> (flag, value);
    unset (None) values are left to the spec's defaults. A bad value is a SpecError naming the flag."""
    data = {f: v for f, (_, v) in flags.items() if v is not None} | fixed
    try:
        return model.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        field = str(e["loc"][0]) if e["loc"] else ""
        flag = flags[field][0] if field in flags else (field or model.__name__)
        msg = e["msg"].removeprefix("Value error, ")
        got = "" if e["type"] == "missing" or not e["loc"] else f"={quote(e.get('input'))}"
        raise SpecError(f"{flag}{got}: {msg}") from None


def add_model_arg(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "--model", required=required, metavar="M",
        help="catalog model name (see `fleetwise catalog models`), a HF config.json, a HF repo id in the local HF "
             "cache, or a ModelSpec YAML/JSON",
    )


def add_gpu_arg(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "--gpu", required=required, metavar="G",
        help="catalog accelerator name (see `fleetwise catalog gpus`) or an AcceleratorSpec YAML/JSON",
    )


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    return resolve_model(args.model)


def gpu_from_args(args: argparse.Namespace) -> AcceleratorSpec:
    return resolve_gpu(args.gpu)


def emit_json(obj: Any) -> None:
    """Print `obj` as indented strict JSON on stdout (non-finite floats become null)."""
    sys.stdout.write(strict_json_dumps(obj) + "\n")


PIPE_WIDTH = 10_000
"""Console width when stdout is not a terminal: wider than any row we print, so a pipe or a file
gets every table row whole instead of rich's 80-column default cutting cells ("h200-s…")."""


def console(markup: bool = False) -> Console:
    """A rich console on stdout: the terminal's width on a terminal, rows never cut when piped;
    brackets in our text are markup only when `markup`."""
    width = None if sys.stdout.isatty() else PIPE_WIDTH
    return Console(file=sys.stdout, markup=markup, highlight=False, soft_wrap=True, width=width)


def fmt_bytes(x: float) -> str:
    """Decimal GB (as datasheets write them)."""
    return f"{x / 1e9:,.1f} GB"


def fmt_count(x: float) -> str:
    """Parameter counts: 70.6B, 1.03T."""
    return f"{x / 1e12:.2f}T" if x >= 1e12 else f"{x / 1e9:.1f}B"


def add_over_context_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--over-context", choices=OVER_CONTEXT_POLICIES, default="reject",
                        help="a request whose prompt + output exceeds the model's context, or with an empty prompt "
                             "or output: reject the run (default, like vLLM's 400), truncate it to fit, or skip it; "
                             "the summary counts truncated and skipped requests")
